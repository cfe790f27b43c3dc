"""The training loop's own cost: host CPU time and wall time per step of the template's ``Trainer`` against a bare
``jax.jit`` loop of the same update, on a model so small that compute is negligible (an MLP on 8 examples).

    python benchmarks/overhead_benchmark.py                 # 5 interleaved rounds of 2000 steps per variant
    python benchmarks/overhead_benchmark.py --rounds 3 --steps 1000

Variants, each measured in a fresh process (one epoch to warm up, then one timed epoch):
  bare               the reference: the Trainer's own compiled K = 1 step, called in a Python loop over numpy batches
                     (a fancy index of a random order), each placed as the Trainer places its stacks
                     (``Placement.put_stack``); nothing read back until the end. Each K=1 variant's process also
                     runs it, alternating epochs with the Trainer's (``SAME_PROCESS_PAIRS``): "same process" ratios
  K=1 log=1          the Trainer at 1 step per call, a step line (log, trackers, callbacks) every step
  K=1 log=50         ... every 50 steps (the default)
  auto log=1/50      the same at ``trainer.steps_per_call: "auto"``
  each of the four also "+tty": the process's terminal is a pseudo-terminal, so the live progress bar is shown
  loop               the Trainer's loop alone: its compiled call replaced by a function that returns at once (the
                     host work per step outside XLA), with the prefetch thread and with ``prefetch: 0``
  place              placing one stack (1 step of 8 examples) as an accelerator gets it: ``Placement.put_stack``
                     with its host-array shortcut of the CPU off (packed into one array, then one ``jax.device_put``),
                     and leaf by leaf (one ``jax.device_put`` of the stack's arrays), against the floor of one
                     ``jax.device_put`` of a single array of the stack's bytes; CPU time per stack, in the process
                     (its ratios are to that floor, not to ``bare``)

Host CPU time is the process's (``time.process_time``: every thread, the prefetch thread and XLA's included) over
the timed epoch, divided by its steps; wall time likewise. The machine is usually shared, so the report takes the
minimum over rounds of each figure and prints the ratio of each variant to ``bare`` in the same run. The Trainer's
console lines go to the terminal (or a pipe) as in ``train.py``; ``train.log`` to a temporary run folder.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import pty
import select
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

BATCH, FEATURES, CLASSES = 8, 16, 10
SAME_PROCESS_PAIRS = 3  # bare and Trainer epochs alternated in each one-step-per-call variant's process
TRAINER_VARIANTS = [(k, every) for k in (1, "auto") for every in (1, 50)]
VARIANTS = ["bare"] + [f"K={k} log={every}{tty}" for k, every in TRAINER_VARIANTS for tty in ("", "+tty")]
VARIANTS += ["loop", "place"]


def config(steps_per_call, log_every: int, save_dir: str) -> dict:
    from training.config.validation import validate

    return validate(
        {
            "name": "overhead",
            "seed": 0,
            "model": {"name": "mlp", "args": {"num_classes": CLASSES, "hidden": [32]}},
            "loss": {"name": "cross_entropy"},
            "metrics": [{"name": "accuracy"}],
            "optimizer": {
                "name": "adamw",
                "args": {"weight_decay": 0.01},
                "schedule": {
                    "name": "warmup_cosine_decay",
                    "args": {"init_value": 0.0, "peak_value": 1e-3, "warmup_steps": 10, "decay_steps": 10**6},
                },
            },
            "data_loader": {"train": {"name": "mnist"}},
            "trainer": {
                "epochs": 2,
                "steps_per_call": steps_per_call,
                "log_every": log_every,
                "save_dir": save_dir,
                "monitor": "off",
            },
        }
    )


def data(steps: int):
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.standard_normal((steps * BATCH, FEATURES)).astype(np.float32)
    y = rng.integers(0, CLASSES, steps * BATCH).astype(np.int32)
    return x, y


def trainer_for(steps_per_call, log_every: int, steps: int):
    """The Trainer as train.py makes it (console and train.log logging), state initialised, step compiled."""
    from data_loader.loader import ArrayDataset, DataLoader
    from training import startup
    from training.assembly import assemble
    from training.run.cli import setup_logging
    from training.trainer import Trainer

    run_dir = Path(tempfile.mkdtemp())
    x, y = data(steps)
    run = assemble(config(steps_per_call, log_every, str(run_dir)))
    run.use_data({"train": DataLoader(ArrayDataset(input=x, target=y), BATCH, shuffle=True, seed=0)})
    setup_logging(run_dir)
    trainer = Trainer(run, run_dir)
    trainer.begin(startup.from_seed(trainer))
    trainer.log_compile()
    return trainer


def timed(fn) -> dict:
    cpu, wall = time.process_time(), time.perf_counter()
    steps = fn()
    return {"cpu_us": 1e6 * (time.process_time() - cpu) / steps, "wall_us": 1e6 * (time.perf_counter() - wall) / steps}


def run_trainer(steps_per_call, log_every: int, steps: int) -> dict:
    """The Trainer's epochs; at one step per call also the bare loop's, alternating in the same process (the
    process-to-process spread of this machine, up to a fifth of a step, is then no part of the ratio)."""
    import jax

    trainer = trainer_for(steps_per_call, log_every, steps)
    bare = bare_epoch(trainer, steps) if steps_per_call == 1 else None

    def epoch(number):
        def run():
            totals = trainer.train_epoch(number)
            jax.block_until_ready((trainer.train_state, totals))
            return trainer.steps_per_epoch

        return run

    epoch(1)()  # warm-up: the first call, the caches, the prefetch thread's first start
    if bare is None:
        return {**timed(epoch(2)), "steps_per_call": trainer.steps_per_call.k}
    bare(1)()
    pairs = [(timed(bare(2 + 2 * i)), timed(epoch(3 + 2 * i))) for i in range(SAME_PROCESS_PAIRS)]
    best = {key: min(t[key] for _, t in pairs) for key in ("cpu_us", "wall_us")}
    best.update({f"bare_{key}": min(b[key] for b, _ in pairs) for key in ("cpu_us", "wall_us")})
    return {**best, "steps_per_call": 1}


def bare_epoch(trainer, steps: int):
    """The Trainer's compiled update (one step per call) in a plain loop: batches gathered from numpy and placed as
    the Trainer places them; an epoch(number)() runs one epoch and returns its steps."""
    import jax
    import numpy as np

    x, y = data(steps)
    step = trainer.compiled.train_call(trainer.steps_per_call.k)
    one, mask = np.ones(1, np.float32), np.ones((1, BATCH), np.float32)

    def epoch(number):
        def run():
            ts, totals = trainer.train_state, trainer.compiled.empty_stats()
            order = np.random.default_rng([0, number]).permutation(len(x))
            for i in range(steps):
                idx = order[i * BATCH : (i + 1) * BATCH]
                batch = {"input": x[idx][None], "target": y[idx][None], "mask": mask, "active": one}
                ts, totals, logs = step(ts, totals, trainer.placement.put_stack(batch))
            jax.block_until_ready((ts, totals, logs))
            trainer.train_state = ts
            return steps

        return run

    return epoch


def run_bare(steps: int) -> dict:
    epoch = bare_epoch(trainer_for(1, 50, steps), steps)
    epoch(1)()
    return {**timed(epoch(2)), "steps_per_call": 1}


def run_loop(steps: int) -> dict:
    """The Trainer's loop alone (one step per call, ``log_every`` 50): its compiled call replaced by a function that
    returns at once, so what remains is the host work per step outside XLA (making and handing over the batches,
    reading the logs, the bookkeeping), with the prefetch thread and without (``prefetch: 0``)."""
    import jax.numpy as jnp

    from training.step import LOGS

    trainer = trainer_for(1, 50, steps)
    trainer.train_epoch(1)
    logs = jnp.zeros((1, len(LOGS)))
    # the loop asks for its call once per epoch (``Compiled.train_call``)
    trainer.compiled.train_call = lambda k: lambda ts, totals, stack: (ts, totals, logs)

    def epoch(number, prefetch):
        def run():
            trainer.train_loader.prefetch = prefetch
            trainer.train_epoch(number)
            return steps

        return run

    threaded = min((timed(epoch(2 + i, 2)) for i in range(3)), key=lambda r: r["wall_us"])
    inline = min((timed(epoch(5 + i, 0)) for i in range(3)), key=lambda r: r["wall_us"])
    return {**threaded, "inline_cpu_us": inline["cpu_us"], "inline_wall_us": inline["wall_us"], "steps_per_call": 1}


def run_place(steps: int) -> dict:
    """Per stack: ``put_stack`` on the accelerator path, and one device_put of one array of as many bytes."""
    import jax
    import numpy as np

    trainer = trainer_for(1, 50, steps)
    trainer.place_stacks(host_arrays=False)  # the CPU's shortcut off: placed as on an accelerator, packed
    trainer.compiled.train_call(trainer.steps_per_call.k)  # the compilation place_stacks starts, done before timing
    placement = trainer.placement
    _, stack = next(trainer.train_loader.stacks(0, 1))
    sharding = placement.batch_sharding({"bytes": np.zeros((1, 1))})["bytes"]
    nbytes = sum(a.nbytes for a in jax.tree.leaves(stack))
    flat = np.zeros((placement.mesh.size, -(-nbytes // placement.mesh.size)), np.uint8)

    def per_stack(put):
        def run():
            for _ in range(steps):
                placed = put()
            jax.block_until_ready(placed)
            return steps

        run()
        return timed(run)

    floor = per_stack(lambda: jax.device_put(flat, sharding))
    packed = per_stack(lambda: placement.put_stack(stack))
    placement.packing = None  # leaf by leaf, as before stacks were packed
    leaves = per_stack(lambda: placement.put_stack(stack))
    return {**packed, "floor_cpu_us": floor["cpu_us"], "leaves_cpu_us": leaves["cpu_us"], "steps_per_call": 1}


def child(variant: str, steps: int) -> dict:
    if variant == "bare":
        return run_bare(steps)
    if variant == "place":
        return run_place(steps)
    if variant == "loop":
        return run_loop(steps)
    k, every = variant.removesuffix("+tty").split(" ")
    k = k.removeprefix("K=")
    return run_trainer(int(k) if k.isdigit() else k, int(every.removeprefix("log=")), steps)


def child_env() -> dict:
    from training.devices import platform

    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "_TRAIN_PLATFORM_REEXECUTED")}
    env.update(platform.process_defaults(env))
    return env


def measure(variant: str, steps: int) -> dict:
    """One variant in a fresh process; "+tty" ones on a pseudo-terminal (its output read and dropped)."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "result.json"
        command = [sys.executable, __file__, "--child", variant, "--steps", str(steps), "--result", str(out)]
        if variant.endswith("+tty"):
            main_fd, terminal = pty.openpty()
            # 100 columns: tqdm draws nothing on a terminal of none (a new pseudo-terminal's size)
            fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
            process = subprocess.Popen(
                command, cwd=REPO, env=child_env(), stdin=terminal, stdout=terminal, stderr=terminal, close_fds=True
            )
            os.close(terminal)
            tail = b""
            while True:
                ready, _, _ = select.select([main_fd], [], [], 0.5)
                if ready:
                    try:
                        chunk = os.read(main_fd, 65536)
                    except OSError:  # the terminal's other end closed
                        break
                    if not chunk:
                        break
                    tail = (tail + chunk)[-4000:]
                elif process.poll() is not None:
                    break
            os.close(main_fd)
            code, output = process.wait(), tail.decode(errors="replace")
        else:
            done = subprocess.run(command, cwd=REPO, env=child_env(), capture_output=True, text=True)
            code, output = done.returncode, done.stdout[-2000:] + done.stderr[-2000:]
        if code or not out.exists():
            raise RuntimeError(f"{variant} failed:\n{output}")
        return json.loads(out.read_text())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=2000, help="steps per timed epoch")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--out", help="also write the raw results and each variant's minimum here (JSON)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        Path(args.result).write_text(json.dumps(child(args.child, args.steps)))
        return 0
    from benchmarks.machine import describe, load_average

    variants = args.variants.split(",")
    print(f"{describe()}; load average (1/5/15 min) {load_average()}", flush=True)
    results = {v: [] for v in variants}
    for round_ in range(args.rounds):
        for variant in variants:
            results[variant].append(measure(variant, args.steps))
            r = results[variant][-1]
            print(
                f"round {round_ + 1}/{args.rounds}  {variant:16s} {r['cpu_us']:7.1f} us CPU/step  "
                f"{r['wall_us']:7.1f} us wall/step  (load {load_average()})",
                flush=True,
            )
    best = {v: {key: min(r[key] for r in rs) for key in ("cpu_us", "wall_us")} for v, rs in results.items()}
    if args.out:
        from files.writes import write_atomic

        write_atomic(Path(args.out), json.dumps({"results": results, "best": best}, indent=1).encode())
    print(
        f"\n{args.steps} steps of {BATCH} examples per timed epoch; minimum of {args.rounds} interleaved rounds "
        "(same process: the median over the rounds of each process's ratio of its best epochs)\n"
    )
    print(
        f"{'variant':16s} {'K':>4s} {'CPU us/step':>12s} {'wall us/step':>13s} {'CPU / bare':>11s} {'wall / bare':>12s}"
        f" {'same process: CPU / bare':>25s} {'wall / bare':>12s}"
    )
    base = best.get("bare")
    for v in [v for v in variants if v not in ("place", "loop")]:
        k = results[v][0]["steps_per_call"]
        ratios = (
            f"{best[v]['cpu_us'] / base['cpu_us']:11.2f} {best[v]['wall_us'] / base['wall_us']:12.2f}" if base else ""
        )
        same = ""
        if "bare_cpu_us" in results[v][0]:  # the ratio in each process (best epoch to best epoch), their median
            cpu = statistics.median(r["cpu_us"] / r["bare_cpu_us"] for r in results[v])
            wall = statistics.median(r["wall_us"] / r["bare_wall_us"] for r in results[v])
            same = f" {cpu:25.2f} {wall:12.2f}"
        print(f"{v:16s} {k:>4} {best[v]['cpu_us']:12.1f} {best[v]['wall_us']:13.1f} {ratios}{same}")
    if "loop" in results:
        inline = {key: min(r[f"inline_{key}"] for r in results["loop"]) for key in ("cpu_us", "wall_us")}
        print(
            f"\nthe loop alone (its compiled call returning at once): {best['loop']['cpu_us']:.1f} us CPU, "
            f"{best['loop']['wall_us']:.1f} us wall per step with the prefetch thread; {inline['cpu_us']:.1f} us CPU, "
            f"{inline['wall_us']:.1f} us wall making the batches on the loop's thread (prefetch 0)"
        )
    if "place" in results:
        floor = min(r["floor_cpu_us"] for r in results["place"])
        leaves = min(r["leaves_cpu_us"] for r in results["place"])
        print(
            f"\nplacing a stack as on an accelerator: {best['place']['cpu_us']:.1f} us CPU (put_stack, packed), "
            f"{leaves:.1f} us leaf by leaf, {floor:.1f} us for one array of its bytes "
            f"(packed {best['place']['cpu_us'] / floor:.2f}x, leaf by leaf {leaves / floor:.2f}x)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
