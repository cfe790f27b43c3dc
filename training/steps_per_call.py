"""How many optimizer steps each compiled call runs (``trainer.steps_per_call``): a number, or "auto".

"auto" runs the first calls at one step, times them (``before_call`` / ``after_call``, which the loop's progress calls
around each call while it measures) and chooses the fewest steps per call that keep the loop's host work per call
within AUTO_HOST_SHARE of the call's device time (``auto_steps_per_call``). Where the host work it saves over the
run's steps left repays its compile (``worth_compiling``), the loop switches to it, on one line, once it has compiled
in the background; else the run stays at one step per call and compiles its step once. K steps per call give the
numbers of one step per call, so where the switch falls changes nothing. The choice is remembered beside the
compilation cache, keyed by the step and the devices, so a later run of the same step starts at it and compiles one
program (which the cache then holds).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from pathlib import Path

import jax

from files.reads import parse_json, read_regular
from files.writes import write_atomic
from training.devices import mesh

log = logging.getLogger("train")

# "auto" times AUTO_MEASURED_CALLS calls after the first AUTO_WARMUP_CALLS. Stacks are prefetched whole, so their size
# is capped; AUTO_MAX_STEPS bounds how late a step's loss is checked and a stop is honoured.
AUTO_WARMUP_CALLS, AUTO_MEASURED_CALLS = 2, 4
AUTO_HOST_SHARE = 0.05
AUTO_MAX_STEPS = 32
AUTO_STACK_BYTES = 64 * 2**20
# XLA:CPU pays a fixed cost at every execution that no host-side timing sees (it allocates and faults in the call's
# temporaries afresh, in its own threads, on the cores the step runs on): one step per call reached 0.83 of the fused
# bound for mnist_cnn (48 against 40 ms a step), 8-16 steps per call 0.98-1.01 (benchmarks/README.md). "auto" counts
# it as host work on the CPU backend; an accelerator's dispatch is what the timing measures.
AUTO_CPU_CALL_S = 0.008
REMEMBERED = "steps_per_call.json"  # in the compilation cache's folder: {key: steps per call}
REMEMBERED_BYTES = 2**20


def auto_steps_per_call(
    steps_per_epoch: int, batch_bytes: int, host_s: float, device_s: float, call_s: float = 0.0
) -> tuple[int, str]:
    """``trainer.steps_per_call: "auto"``: the steps per call for a loop that spends `host_s` of host work per call
    (and the runtime `call_s` more, unseen: ``AUTO_CPU_CALL_S``) and `device_s` of device time per step, and why. The
    fewest steps that bring the host work within
    AUTO_HOST_SHARE of the call's device time, then, within half as many more, the count that pads the epoch's last
    call least (the smallest on ties); at most the epoch, AUTO_MAX_STEPS and a stack of AUTO_STACK_BYTES."""
    runtime = f" (+{1e3 * call_s:.3g} ms the runtime pays per call)" if call_s else ""
    share = f"{1e6 * host_s:.0f} us of host work per call{runtime}, {1e3 * device_s:.3g} ms of device time per step"
    needed = math.ceil((host_s + call_s) / (AUTO_HOST_SHARE * max(device_s, 1e-9)))
    if needed <= 1:
        return 1, f"{share}: one step per call keeps the host within {AUTO_HOST_SHARE:.0%}"
    stack_cap = max(1, AUTO_STACK_BYTES // max(batch_bytes, 1))
    cap = min(stack_cap, AUTO_MAX_STEPS, steps_per_epoch)
    why = f"{share}: {needed} step(s) per call keep the host within {AUTO_HOST_SHARE:.0%}"
    if cap < needed:
        limit = (
            "the epoch's steps"
            if cap == steps_per_epoch
            else f"a {AUTO_STACK_BYTES >> 20} MiB stack"
            if cap == stack_cap
            else f"at most {AUTO_MAX_STEPS}"
        )
        return cap, f"{why}; capped by {limit}"
    k = min(range(needed, min(cap, needed + needed // 2) + 1), key=lambda k: ((-steps_per_epoch) % k, k))
    return k, why + (f" ({k}: the epoch's last call padded least)" if k != needed else "")


def worth_compiling(k: int, steps_left: int, host_s: float, compile_s: float) -> tuple[bool, str]:
    """Whether `k` steps per call repay their compile (about the `compile_s` the calls run now took) within the run's
    `steps_left`: each call of k steps saves the per-call `host_s` of k - 1 calls of one step; and why not."""
    saved = steps_left * host_s * (1 - 1 / k)
    if saved >= compile_s:
        return True, ""
    return False, (
        f"; {k} would save about {saved:.1f}s over the {steps_left} step(s) left, less than compiling it (about "
        f"{compile_s:.1f}s): this run stays at one step per call, the next starts at {k}"
    )


class StepsPerCall:
    def __init__(self, setting: int | str, steps_per_epoch: int, batch_bytes: int, run_steps: int | None = None):
        """``setting``: trainer.steps_per_call; ``batch_bytes``: one step's loader batches (the stack's size per
        step); ``run_steps``: the run's optimizer steps (every epoch's), which a switch must repay. ``k``: the steps
        per call of the calls made now; ``chosen``: the steps per call the loop switches to once that has compiled
        (``k`` until "auto" decides otherwise)."""
        self.auto = setting == "auto"
        self.k = self.chosen = 1 if self.auto else setting
        self.steps_per_epoch, self.batch_bytes = steps_per_epoch, batch_bytes
        self.run_steps = steps_per_epoch if run_steps is None else run_steps
        self.measuring = False  # timing the calls: "auto" with the calls compiled ahead of time, until it decides
        self.timings: list[tuple[float, float]] = []  # (host s, device s) of each timed call
        self.clock: dict = {}
        self.remembered_in: Path | None = None
        self.key: str | None = None
        self.note = f"{self.k} step(s) per call"  # what the log says of where the calls start (``start``)

    # ------------------------------------------------------------------------------------- remembered choices
    def start(self, key: str | None, folder: Path | None, measure: bool = True) -> str:
        """Where "auto" starts: a choice remembered in `folder` for `key` (``key_of``), else one step per call,
        measured unless `measure` is False (a step not compiled ahead of time: one step per call); returns what the
        log says of it."""
        if not self.auto or not measure:
            return self.note
        self.key, known = key, 0
        if key is not None and folder is not None:
            self.remembered_in = folder / REMEMBERED
            known = remembered(self.remembered_in).get(key)
            known = known if type(known) is int and 1 <= known <= min(AUTO_MAX_STEPS, self.steps_per_epoch) else 0
        # several processes (each with its own disk, maybe) all start alike: at the largest choice any of them
        # remembered, else all measure (one small collective, once)
        (known,) = mesh.max_over_processes(known)
        if known:
            self.k = self.chosen = known
            self.note = (
                f'{known} step(s) per call, as "auto" chose for this step on these devices ({self.remembered_in})'
            )
            return self.note
        self.measuring = True
        self.note = f'1 step per call while "auto" times the first {AUTO_WARMUP_CALLS + AUTO_MEASURED_CALLS} calls'
        return self.note

    # ------------------------------------------------------------------------------------------------ timing
    def before_call(self) -> None:
        self.clock["cpu"], self.clock["start"] = time.thread_time(), time.perf_counter()
        self.clock.setdefault("cycle", self.clock["cpu"])

    def after_call(self, call_logs, step: int, compile_s: float) -> None:
        """Records the call just made (the run at `step` after it; its calls compiled in `compile_s`): the loop's host
        work (this thread's CPU time over one call of the loop, the wait for the results excepted: the next stack, the
        dispatch, the logs, the callbacks) and the call's device time (dispatch to results, less the dispatch's own
        CPU time); decides once enough are timed."""
        dispatched = time.thread_time()
        jax.block_until_ready(call_logs)  # the logs: the call's last results
        device = time.perf_counter() - self.clock["start"] - (dispatched - self.clock["cpu"])
        waited = time.thread_time() - dispatched
        now = time.thread_time()
        self.timings.append((now - self.clock["cycle"] - waited, device))
        self.clock["cycle"] = now
        if len(self.timings) >= AUTO_WARMUP_CALLS + AUTO_MEASURED_CALLS:
            self.decide(step, compile_s)

    def decide(self, step: int, compile_s: float) -> None:
        self.measuring = False
        measured = self.timings[AUTO_WARMUP_CALLS:]
        host = sorted(h for h, _ in measured)[len(measured) // 2]  # CPU time: another process's load barely moves it
        device = min(d for _, d in measured)  # a wall time: only ever lengthened by the host being busy elsewhere
        call = AUTO_CPU_CALL_S if jax.default_backend() == "cpu" else 0.0
        k, why = auto_steps_per_call(self.steps_per_epoch, self.batch_bytes, host, device / self.k, call)
        worth, why_not = worth_compiling(k, self.run_steps - step, host + call, compile_s)
        # every process runs the same calls: the largest choice, and a switch where any process finds it repaid,
        # agreed at the same call (one small collective, once)
        agreed, switch = mesh.max_over_processes(k, int(worth or k == 1))
        why += f"; {agreed} agreed by the {jax.process_count()} processes" if agreed != k else ""
        log.info(f"steps per call (auto): {agreed}; {why}{'' if switch else why_not}")
        self.remember(agreed)
        self.chosen = agreed if switch else self.k

    def remember(self, k: int) -> None:
        """Keeps the choice for the next run of the same step on the same devices (process 0; a lost race between
        two runs loses one of their choices, which the next run makes again)."""
        if self.remembered_in is None or self.key is None or not mesh.is_main():
            return
        try:
            choices = remembered(self.remembered_in)
            choices[self.key] = k
            self.remembered_in.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.remembered_in, json.dumps(choices, indent=1).encode())
        except (OSError, ValueError) as error:  # a cache is an optimisation: a folder it cannot write is no error
            log.debug(f"steps per call not remembered in {self.remembered_in}: {error}")


def remembered(path: Path) -> dict:
    """The remembered choices, or none where the file is missing, unreadable, not a regular file or not ours."""
    try:
        choices = parse_json(read_regular(path, REMEMBERED_BYTES, "remembered steps per call"), str(path))
    except (OSError, ValueError):
        return {}
    return choices if isinstance(choices, dict) else {}


def key_of(config: dict, batch_spec) -> str:
    """What a choice is remembered for: what makes the step (the config but its name, seed, other loaders and
    trainer settings that do not change a call: epochs, logging, checkpoints), the training batch's shapes and the
    devices it runs on. A key that misses only costs a choice made again."""
    trainer = config.get("trainer", {})
    step = {key: value for key, value in config.items() if key not in ("name", "seed", "trainer", "data_loader")}
    step["trainer"] = {key: trainer.get(key) for key in ("precision", "accumulate_steps")}
    step["data_loader.train"] = config.get("data_loader", {}).get("train")
    step["batch"] = str(jax.tree.map(lambda a: (a.shape, str(a.dtype)), batch_spec))
    devices = jax.devices()
    step["devices"] = [jax.default_backend(), devices[0].device_kind, len(devices), jax.process_count()]
    return hashlib.sha256(json.dumps(step, sort_keys=True, default=str).encode()).hexdigest()[:32]
