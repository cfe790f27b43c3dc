"""The training state on the devices, and the compiled steps that advance it.

A state is a dict ``{"params", "state", "opt_state", "step", "rng"}`` (plus ``loss_scale`` for float16 and
``callbacks`` for callbacks that update inside the step). It lives on the config's mesh over the devices of every
process (``training/devices/mesh.py``: a data x fsdp grid): batches are split over every device; parameters and
optimizer state are replicated, or split over "fsdp" when it is above 1, so the same code runs on one CPU, several
accelerators or several machines. Every shape and dtype of a batch comes from the training loader's ``spec``.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from training.config.settings import Settings
from training.devices import memory, mesh, peaks, platform
from training.devices.packing import Packing
from training.precision import policy_of
from training.run import checkpoint
from training.step import empty_stats, make_eval_step, make_train_call

log = logging.getLogger("train")

# trainer.steps_per_call: "auto" times the first calls at one step per call (the first AUTO_WARMUP_CALLS not counted)
# and picks the fewest steps per call that keep the loop's host work per call within AUTO_HOST_SHARE of the call's
# device time. Stacks are prefetched whole, so their size is capped; AUTO_MAX_STEPS bounds how late a step's
# loss is checked and a stop is honoured.
AUTO_WARMUP_CALLS, AUTO_MEASURED_CALLS = 2, 4
AUTO_HOST_SHARE = 0.05
AUTO_MAX_STEPS = 32
AUTO_STACK_BYTES = 64 * 2**20
# XLA:CPU pays a fixed cost at every execution that no host-side timing sees (it allocates and faults in the call's
# temporaries afresh, in its own threads, on the cores the step runs on): one step per call reached 0.83 of the fused
# bound for mnist_cnn (48 against 40 ms a step), 8-16 steps per call 0.98-1.01 (benchmarks/README.md). "auto" counts
# it as host work on the CPU backend; an accelerator's dispatch is what the timing measures.
AUTO_CPU_CALL_S = 0.008


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


def in_background(fn: Callable, *args) -> Future:
    """`fn(*args)` on a thread of its own, which ends with it (XLA compiles and counts outside the GIL)."""
    worker = ThreadPoolExecutor(1)
    future = worker.submit(fn, *args)
    worker.shutdown(wait=False)
    return future


def unpacked(chunk: Callable, packing: Packing, ts: dict, totals: dict, packed):
    """``chunk`` of the stack that `packing` packed into `packed` (``CompiledSteps.place_stacks``)."""
    return chunk(ts, totals, packing.unpack(packed, lead=2))


class CompiledSteps:
    def __init__(self, run, settings: Settings, execution: str = "aot"):
        """``run``: the assembled run with its data loaded. ``execution``: "aot", compiled ahead of time for the
        loader's shapes; "jit", compiled at the first call (what jax_debug_nans needs to re-run a step op by op);
        "eager", under jax.disable_jit, op by op (--no-jit)."""
        self.run, self.settings, self.execution = run, settings, execution
        self.optimizer, self.lr_fn = run.optimizer()  # built with the data (``Run.optimizer``), not again here
        train_loader, valid_loader = run.loaders["train"], run.loaders.get("validation")
        self.mesh = mesh.make_mesh(run.config.get("mesh"))
        self.replicated = NamedSharding(self.mesh, P())
        if train_loader.batch_size % self.mesh.size:  # evaluation pads its batches instead (``evaluate``)
            n, size = self.mesh.size, train_loader.batch_size
            where = f" ({jax.process_count()} processes)" if jax.process_count() > 1 else ""
            nearest = " or ".join(str(b) for b in (size // n * n, size // n * n + n) if b)
            raise ValueError(
                f"data_loader.train.args.batch_size {size} must be a multiple of the {n} devices in use{where}: "
                f"{nearest}"
            )
        self.share_batches(train_loader, valid_loader)
        self.batch_spec = train_loader.spec
        self.in_step = [c for c in run.callbacks if c.update is not None]  # keep a state in the training state
        self.evaluated = next((c for c in run.callbacks if c.evaluated), None)
        self.accumulate = settings.accumulate_steps
        self.steps_per_epoch = -(-len(train_loader) // self.accumulate)
        self.policy = policy_of(settings.precision)
        # "auto": one step per call until the first calls are timed (``calls``), then the measured choice
        self.measuring = settings.steps_per_call == "auto" and execution == "aot"
        self.steps_per_call = 1 if settings.steps_per_call == "auto" else settings.steps_per_call
        self.timings, self.switching = [], None  # (host s, device s) of the timed calls; the chosen K's compilation
        self.chosen = None
        self.stats_template = None
        self.shardings = {}  # of stacks and batches, by structure (``shardings_of``)
        self.processes = jax.process_count()
        self.packed_sharding = NamedSharding(self.mesh, P(None, mesh.BATCH_AXES))  # (K, B, bytes): split as B
        self.train_call = None
        self.place_stacks(host_arrays=self.processes == 1 and self.mesh.devices.flat[0].platform == "cpu")
        self.compiling = None  # the training step's compilation under way (a Future)
        self.compiled_chunk, self.compile_seconds, self.flops_per_example = None, 0.0, None
        self.compiled_eval, self.eval_batch_size = None, None
        fsdp = self.mesh.shape["fsdp"] > 1
        self.sharding = mesh.state_shardings(self.template(), self.mesh) if fsdp else self.replicated
        self.jit_train_chunk()
        self.eval_step = jax.jit(
            make_eval_step(run.model, run.loss_fn, run.metrics, run.augment, self.policy),
            donate_argnums=(2,),
            out_shardings=self.replicated,
        )

    def place_stacks(self, host_arrays: bool) -> None:
        """How stacks reach the devices. `host_arrays` (XLA:CPU, one process): as the host's arrays, which the
        compiled call transfers itself in one go (``jax.device_put`` costs more per array than a small step).
        Otherwise (accelerators, several processes) packed into one array each (``training/devices/packing.py``),
        placed in one transfer and unpacked by the compiled call; leaf by leaf where a loader's leaves cannot be
        packed (64-bit numbers). A change rebuilds the training call."""
        self.host_arrays = host_arrays
        packable = not host_arrays and Packing.supports(self.batch_spec)
        self.packing = Packing(self.batch_spec, {"active": jnp.float32}) if packable else None
        if self.train_call is not None:
            self.jit_train_chunk()
            self.compiling = None  # a compilation under way is for the other stacks: compile() starts anew

    def stack_spec(self, k: int):
        """The abstract stack of `k` loader batches as the training call takes it (the shardings included)."""
        if self.packing is not None:
            rows = jax.tree.leaves(self.batch_spec)[0].shape[0]
            return jax.ShapeDtypeStruct((k, rows, self.packing.row_bytes), jnp.uint8, sharding=self.packed_sharding)
        stack = jax.tree.map(lambda a: jax.ShapeDtypeStruct((k, *a.shape), a.dtype), self.batch_spec)
        stack["active"] = jax.ShapeDtypeStruct((k,), jnp.float32)
        return mesh.with_shardings(stack, self.stack_sharding(stack))

    def jit_train_chunk(self, schedule_length: dict | None = None) -> None:
        """The training call; ``schedule_length``: a checkpoint's, which its resumed run's schedules keep counting."""
        if schedule_length is not None:
            self.run.epochs, self.run.steps_per_epoch = schedule_length["epochs"], schedule_length["steps_per_epoch"]
        self.optimizer, self.lr_fn = self.run.optimizer()  # the one learning rate: the step's and the logged
        self.chunk_fn = self.chunk_with(self.optimizer, self.lr_fn)
        self.train_call = jax.jit(
            self.chunk_fn, donate_argnums=(0, 1), out_shardings=(self.sharding, self.replicated, self.replicated)
        )

    # ---------------------------------------------------------------------------------------- making a state
    @property
    def input_spec(self):
        return self.batch_spec["input"]

    @property
    def model_input_spec(self):
        """The input as the model sees it: after the deterministic part of the augmentation (e.g. uint8 images
        converted and normalised)."""
        augment = self.run.augment
        if augment is None:
            return self.input_spec
        return jax.eval_shape(lambda b: augment(b, None, train=False, outputs=None), self.batch_spec)["input"]

    def fresh(self, seed) -> dict:
        """The training state a run starts from: init and dropout keys both derive from `seed`."""
        init_key, rng = jax.random.split(jax.random.PRNGKey(seed))
        params, state = self.run.model.init(init_key, self.model_input_spec)
        fresh = {
            "params": params,
            "state": state,
            "opt_state": self.optimizer.init(params),
            "step": jnp.zeros((), jnp.int32),
            "rng": rng,
        }
        if self.policy.scaled:
            fresh["loss_scale"] = self.policy.init_scale()
        if self.in_step:
            fresh["callbacks"] = {c.name: c.init(params) for c in self.in_step}
        return fresh

    def template(self) -> dict:
        """The state's abstract value (shapes and dtypes, nothing computed)."""
        return jax.eval_shape(lambda: self.fresh(0))

    def init(self) -> dict:
        """A fresh state from the config's seed, built by one jitted call (no eager per-layer work)."""
        seed = self.settings.seed
        traced = jax.jit(self.fresh, out_shardings=self.sharding).trace(seed)
        self.start_compile(traced.out_info)  # the training step compiles on another thread meanwhile
        return traced.lower().compile(platform.xla_options("init", jax.default_backend()) or None)(seed)

    def restore(self, path: Path) -> tuple[dict, dict, dict | None]:
        """A checkpoint's state on the mesh, its header, and the statistics of the epoch under way when it was saved
        mid-epoch (else None)."""

        def template(header: dict) -> dict:
            state = self.template()
            if header.get("position"):
                state["epoch_totals"] = self.empty_stats(state)
            return state

        tree, header = checkpoint.restore(path, template)
        self.jit_train_chunk(header.get("schedule_length"))  # before the step compiles
        totals = tree.pop("epoch_totals", None)
        shardings = mesh.state_shardings(tree, self.mesh)
        self.start_compile(mesh.with_shardings(tree, shardings))
        ts = mesh.to_mesh(tree, shardings)  # every process read the file; each keeps its shards
        return ts, header, totals

    def load_weights(self, ts: dict, path: Path, exclude: Sequence[str] = ()) -> dict:
        """Fine-tuning: params and model state from another checkpoint into `ts`. Key paths under an ``exclude``
        prefix (e.g. ``params.head``, a new classifier) keep their fresh values."""
        template = {"params": ts["params"], "state": ts["state"]}
        tree, _ = checkpoint.restore(path, template, only=("params", "state"), exclude=exclude)
        return {**ts, **mesh.to_mesh(tree, mesh.state_shardings(tree, self.mesh))}

    def check_memory(self) -> None:
        """Refuses, before anything is allocated, a run whose state and one call's stacked batches alone exceed the
        memory of the devices (a ValueError naming the numbers): it would otherwise stall or be killed mid-compile."""
        template = self.template()
        shardings = self.sharding if isinstance(self.sharding, dict) else dict.fromkeys(template, self.sharding)
        batches = self.steps_per_call * self.accumulate  # one call's stack, split over every device
        local = [d for d in self.mesh.devices.flat if d.process_index == jax.process_index()]
        stack_bytes = -(-batches * memory.nbytes(self.batch_spec) // self.mesh.size)
        memory.check_fits(template, shardings, f"{batches} stacked batch(es)", stack_bytes, local)

    def eval_params(self, ts: dict):
        """The parameters evaluation uses: a callback's (e.g. an average of the parameters), else the trained."""
        if self.evaluated is None:
            return ts["params"]
        return ts["callbacks"][self.evaluated.name]["params"]

    # ------------------------------------------------------------------------------------------ placing data
    def share_batches(self, *loaders) -> None:
        """Each process reads only its rows of every batch (process by process, as the mesh orders devices)."""
        for loader in loaders:
            if loader is not None:
                loader.share = (jax.process_index(), jax.process_count())

    def stack_sharding(self, stack: dict) -> dict:
        """Stacks of K batches: split along the batch axis (the second) over every device of the mesh; ``active``
        (K,) is replicated."""
        return self.shardings_of("stack", stack, lambda a: P(None, mesh.BATCH_AXES) if a.ndim > 1 else P())

    def batch_sharding(self, batch: dict) -> dict:
        return self.shardings_of("batch", batch, lambda a: P(mesh.BATCH_AXES))

    def shardings_of(self, kind: str, tree: dict, spec: Callable) -> dict:
        """The shardings of a tree of arrays, made once per structure and rank (every stack and batch of a loader has
        the same), not again for every stack the prefetch thread places."""
        key = (kind, jax.tree.structure(tree), tuple(a.ndim for a in jax.tree.leaves(tree)))
        if key not in self.shardings:
            self.shardings[key] = jax.tree.map(lambda a: NamedSharding(self.mesh, spec(a)), tree)
        return self.shardings[key]

    def put_stack(self, stack: dict) -> dict:
        """This process's rows of a stack (its loader's share) placed as one global stack (``place_stacks``)."""
        if self.host_arrays:
            return stack
        if self.packing is not None:
            return mesh.put_local(self.packing.pack(stack, lead=2), self.packed_sharding)
        return mesh.put_local(stack, self.stack_sharding(stack))

    def put_batch(self, batch: dict) -> dict:
        return batch if self.host_arrays else mesh.put_local(batch, self.batch_sharding(batch))

    def empty_stats(self, state=None):
        """Zeroed epoch statistics on the device; ``state``: a training state or its abstract value (the first
        call only: the model is traced once, not every epoch)."""
        if self.stats_template is None:
            state = self.template() if state is None else state
            run = self.run
            self.stats_template = jax.device_get(
                empty_stats(
                    run.model, run.loss_fn, run.metrics, state["params"], state["state"], self.batch_spec, run.augment
                )
            )
        return jax.device_put(self.stats_template, self.replicated)

    # ------------------------------------------------------------------------------------------------ steps
    def chunk_with(self, optimizer, lr_fn: Callable | None = None) -> Callable:
        """The K-step training call with `optimizer` (the config's, or the lr_finder's range) and its `lr_fn`."""
        run = self.run
        parts = (run.model, run.loss_fn, optimizer, run.metrics, run.augment, self.accumulate, self.policy)
        chunk = make_train_call(*parts, self.in_step, lr_fn)
        return chunk if self.packing is None else functools.partial(unpacked, chunk, self.packing)

    def start_compile(self, state_spec) -> None:
        """Starts compiling the training step from the state's abstract value on a worker thread: XLA compiles
        outside the GIL, so on a multi-core host this overlaps the initialisation. ``compile()`` waits for it."""
        if self.execution != "aot":
            return
        self.compiling = in_background(self.compile_train_step, state_spec)

    def compile_train_step(self, state_spec, steps_per_call: int | None = None):
        k = (steps_per_call or self.steps_per_call) * self.accumulate  # loader batches per call
        start = time.perf_counter()
        traced = self.train_call.trace(state_spec, self.empty_stats(state_spec), self.stack_spec(k))
        # MFU's FLOP count (seconds for a large model), made while XLA compiles; once, for the first compilation
        counting = in_background(peaks.step_flops, traced) if steps_per_call is None else None
        compiled = traced.lower().compile(platform.xla_options("train", jax.default_backend()) or None)
        return compiled, time.perf_counter() - start, counting

    def compile(self, ts: dict) -> None:
        """Compiles the training step ahead of time for the loader's fixed batch shape (the evaluation step is
        compiled at the first evaluation, off the path to the first training step).

        The loop calls these compiled executables, so a batch of another shape is an error, never a silent
        recompilation; the compile time and XLA's FLOP estimate are logged.
        """
        log.info(f"platform defaults: {platform.describe(jax.default_backend())}")
        if self.execution != "aot":  # the jitted function itself: compiled at its first call, or run op by op
            self.compiled_chunk = self.train_call if self.execution == "eager" else self.nan_located_chunk()
            log.info(f"training step: {'jitted at the first call' if self.execution == 'jit' else 'op by op'}")
            return
        if self.compiling is None:
            self.start_compile(ts)
        self.compiled_chunk, self.compile_seconds, counting = self.compiling.result()
        self.compiling = None
        flops = counting.result()  # the scan over a call's steps (and over accumulated batches) counts once
        self.flops_per_example = None if flops is None else flops / self.run.loaders["train"].batch_size
        flops = f", ~{self.flops_per_example / 1e6:.1f} MFLOP per training example" if self.flops_per_example else ""
        auto = (
            f' while "auto" times the first {AUTO_WARMUP_CALLS + AUTO_MEASURED_CALLS} calls' if self.measuring else ""
        )
        log.info(
            f"compiled the training step ({self.steps_per_call} step(s) per call{auto}) in "
            f"{self.compile_seconds:.1f}s{flops}"
        )

    # ------------------------------------------------------------------------------ steps per call, measured
    def calls(self, loader, epoch: int, start: int = 0):
        """The epoch's stacks from loader batch `start` on (``DataLoader.chunks``), for the loop to run with
        ``compiled_chunk``. While "auto" is measuring, the calls are of one step and timed; once the chosen K has
        compiled (on a worker thread while training goes on), the stacks continue at K from where they were: K steps
        per call give the numbers of one step per call, so where the switch falls changes nothing."""
        position = start
        while True:
            stacks = loader.stacks(epoch, self.steps_per_call * self.accumulate, self.put_stack, position)
            try:
                for real, stack in stacks:
                    timed = self.measuring and self.timed_call()
                    yield real, stack
                    position += real
                    if timed:
                        self.time_call(*timed)
                    if self.switching is not None and self.switching.done():
                        break
                else:
                    if self.switching is not None:  # decided in this epoch: the next one starts at K
                        self.switch()
                    return
            finally:
                stacks.close()
            self.switch()

    def timed_call(self) -> tuple:
        """Wraps the next call so that it is timed: its dispatch, then its wait for the results (``time_call``)."""
        chunk, clock = self.compiled_chunk, {"cpu": time.thread_time()}

        def timed(ts, totals, stack):
            self.compiled_chunk = chunk
            cpu, start = time.thread_time(), time.perf_counter()
            out = chunk(ts, totals, stack)
            dispatched = time.thread_time()
            jax.block_until_ready(out[2])  # the logs: the call's last results
            clock["device"] = time.perf_counter() - start - (dispatched - cpu)
            clock["waited"] = time.thread_time() - dispatched
            clock["state"] = out[0]  # its shapes and shardings: what the chosen K compiles for
            return out

        self.compiled_chunk = timed
        return (clock,)

    def time_call(self, clock: dict) -> None:
        """Records one timed call: the loop's host work (this thread's CPU time from handing out the stack to asking
        for the next, the wait for the results excepted: the dispatch, the logs, the callbacks) and the call's
        device time (dispatch to results, less the dispatch's own CPU time); decides once enough are timed."""
        if "device" not in clock:  # the loop did not make the call (it stopped)
            return
        self.timings.append((time.thread_time() - clock["cpu"] - clock["waited"], clock["device"]))
        if len(self.timings) < AUTO_WARMUP_CALLS + AUTO_MEASURED_CALLS:
            return
        self.measuring = False
        measured = self.timings[AUTO_WARMUP_CALLS:]
        host = sorted(h for h, _ in measured)[len(measured) // 2]  # CPU time: another process's load barely moves it
        device = min(d for _, d in measured)  # a wall time: only ever lengthened by the host being busy elsewhere
        batch_bytes = self.accumulate * memory.nbytes(self.batch_spec)
        call = AUTO_CPU_CALL_S if jax.default_backend() == "cpu" else 0.0
        k, why = auto_steps_per_call(self.steps_per_epoch, batch_bytes, host, device / self.steps_per_call, call)
        # every process runs the same calls: the largest choice, agreed at the same call (one small collective, once)
        (agreed,) = mesh.max_over_processes(k)
        why += f"; {agreed} agreed by the {jax.process_count()} processes" if agreed != k else ""
        log.info(f"steps per call (auto): {agreed}; {why}")
        if agreed != self.steps_per_call:
            self.chosen = agreed
            spec = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), clock["state"])
            self.switching = in_background(self.compile_train_step, spec, agreed)
            if jax.process_count() > 1:  # a compilation ends at different times on each: all switch now, together
                self.switching.result()

    def switch(self) -> None:
        """The chosen steps per call from the next call on (waits for its compilation)."""
        self.compiled_chunk, seconds, _ = self.switching.result()
        self.switching, self.steps_per_call = None, self.chosen
        log.info(f"compiled the training step ({self.steps_per_call} step(s) per call) in {seconds:.1f}s")

    def nan_located_chunk(self) -> Callable:
        """--detect-nans: the jitted call without donation; when jax_debug_nans finds a NaN in its outputs, the call
        runs again op by op from the same inputs (jax_debug_nans alone stops at the whole `scan`), so the error
        names the first operation that made one, with its line."""
        jitted = jax.jit(self.chunk_fn)

        def chunk(ts, totals, stack):
            try:
                return jitted(ts, totals, stack)
            except FloatingPointError:
                with jax.disable_jit():
                    return self.chunk_fn(ts, totals, stack)

        return chunk

    def compile_eval(self, ts: dict, loader) -> None:
        self.eval_batch_size = loader.batch_size
        self.eval_rows = rows = -(-loader.batch_size // self.mesh.size) * self.mesh.size  # divides over the devices
        if self.execution != "aot":
            self.compiled_eval = self.eval_step
            return
        spec = jax.tree.map(lambda a: jax.ShapeDtypeStruct((rows, *a.shape[1:]), a.dtype), loader.spec)
        batch_spec = mesh.with_shardings(spec, self.batch_sharding(spec))
        options = platform.xla_options("eval", jax.default_backend()) or None
        lowered = self.eval_step.lower(ts["params"], ts["state"], self.empty_stats(), batch_spec)
        self.compiled_eval = lowered.compile(options)

    def evaluate(self, ts: dict, loader, epoch: int = 0) -> dict:
        """Summed statistics of `loader`'s batches (its order of `epoch`) under the evaluated parameters."""
        if self.eval_batch_size != loader.batch_size:
            self.compile_eval(ts, loader)
        totals = self.empty_stats()
        params, state = self.eval_params(ts), ts["state"]
        # prefetched as training's stacks are; this process's share of each batch, padded
        for batch in loader.placed(epoch, self.put_batch, self.eval_rows // jax.process_count()):
            totals = self.compiled_eval(params, state, totals, batch)
        return totals
