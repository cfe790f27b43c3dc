"""Seconds from the command to the first step, by phase: what a researcher waits on before a run trains.

    python benchmarks/startup_benchmark.py                                  # config.json and the LM sample
    python benchmarks/startup_benchmark.py --configs config.json configs/churn.json
    python benchmarks/startup_benchmark.py --configs --gpt2 1              # GPT-2 small alone, 1 sequence a step

For each config, two fresh processes in turn, each with a fresh HOME, sharing one new compilation cache: the first
run compiles everything (and fills the cache), the second reads it. Each process goes through the phases train.py
goes through, in order, timing each (the training call as "auto" starts it, one step per call):

  imports       JAX and the template's modules
  config        the config read, validated and assembled (every component built)
  data          the loaders built and their first batch read (a cache built where a loader keeps one)
  trainer       the Trainer: mesh, placement, the optimizer, the state's abstract value (the model traced once)
  state         the state initialised on the devices (its own small program compiled, then run)
  trace/lower   the training call traced to a jaxpr, then lowered to StableHLO
  compile       XLA's compilation of it, or its read from the cache (the column says which)
  eval compile  the evaluation step's lowering and compilation (or cache read)
  first call    the first training call run to its results

--gpt2 N adds GPT-2 small as gpu_step_benchmark.py defines it (the LM sample with accelerator_run.py's GPT-2 shapes,
"auto" attention, bfloat16 compute) at N sequences a training step: of the phases, only the first call scales with N.

The sum is the first step's distance from the process's start, less the train.py work not timed here (argument
parsing, the run folder): within a second of what train.py's "first ... step(s) done N s after start" line says.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("imports", "config", "data", "trainer", "state", "trace/lower", "compile", "eval compile", "first call")


def child(config_path: str, overrides: list[str]) -> dict:
    """The phases of one process (run with --child, `overrides` as --set), as {phase: seconds}, and where its
    programs came from."""
    started = time.perf_counter()
    times, origins = {}, {}

    def lap(name: str) -> None:
        nonlocal started
        now = time.perf_counter()
        times[name], started = now - started, now

    import jax

    from training import state as states
    from training.assembly import assemble
    from training.config.validation import load_config
    from training.devices import compilation_cache, platform
    from training.trainer import Trainer

    compilation_cache.use()
    lap("imports")
    run = assemble(load_config(config_path, overrides), Path(config_path).name)
    lap("config")
    run.load_data()
    run.check_data()
    lap("data")
    trainer = Trainer(run, None, count_flops=False)
    lap("trainer")
    # as startup.from_seed initialises it, without starting the training call's compilation beside it
    state, origins["state"] = states.init(
        run, trainer.optimizer, trainer.precision, trainer.settings.seed, trainer.compiled.state_sharding
    )
    state = jax.block_until_ready(state)
    lap("state")
    compiled = trainer.compiled
    spec = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), state)
    stack = trainer.placement.stack_spec(trainer.accumulate)
    lowered = compiled.train.trace(spec, compiled.empty_stats(spec), stack).lower()
    lap("trace/lower")
    options = platform.xla_options(platform.train_kind(lowered, jax.default_backend()), jax.default_backend())
    call, origins["compile"] = compilation_cache.origin(lambda: lowered.compile(options or None))
    lap("compile")
    compiled.compile_eval(state, trainer.valid_loader or trainer.train_loader)
    lap("eval compile")
    stacks = trainer.train_loader.stacks(1, trainer.accumulate, trainer.placement.put_stack, 0)
    _, batch = next(stacks)
    jax.block_until_ready(call(state, compiled.empty_stats(), batch))
    stacks.close()
    lap("first call")
    return {"seconds": times, "origins": origins}


def gpt2(batch: int) -> tuple[str, list[str]]:
    """GPT-2 small's config and overrides, gpu_step_benchmark.py's, at `batch` sequences a training step."""
    from benchmarks.gpu_step_benchmark import gpt2_sets

    return "configs/shakespeare_char.json", [*gpt2_sets(False, "auto"), f"data_loader.train.args.batch_size={batch}"]


def measure(config: str, cache: Path, overrides: list[str] = ()) -> dict:
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "HOME": home, "JAX_COMPILATION_CACHE_DIR": str(cache), "JAX_PLATFORMS": "cpu"}
        done = subprocess.run(
            [sys.executable, __file__, "--child", config, *(a for o in overrides for a in ("--set", o))],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
    if done.returncode != 0:
        raise SystemExit(f"{config}: the measuring process failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="*", default=["config.json", "configs/shakespeare_char.json"])
    parser.add_argument("--gpt2", type=int, metavar="N", help="GPT-2 small too, at N sequences a training step")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--set", action="append", default=[], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.set)))
        return 0
    from benchmarks.machine import cpu_model

    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; load {os.getloadavg()[0]:.1f}")
    runs = {config: (config, []) for config in args.configs}
    if args.gpt2:
        runs[f"GPT-2 small, batch {args.gpt2}x1024"] = gpt2(args.gpt2)
    for name, (config, overrides) in runs.items():
        with tempfile.TemporaryDirectory() as cache:
            first, second = measure(config, Path(cache), overrides), measure(config, Path(cache), overrides)
        print(
            f"\n{name}: seconds per phase, first run (empty cache) / second run (the cache the first filled); "
            f"load {os.getloadavg()[0]:.1f} after them"
        )
        for phase in PHASES:
            a, b = first["seconds"][phase], second["seconds"][phase]
            where = (
                f"  ({first['origins'][phase].strip(' ()')} / {second['origins'][phase].strip(' ()')})"
                if (phase in first["origins"])
                else ""
            )
            print(f"  {phase:<13} {a:7.2f}  {b:7.2f}{where}")
        print(f"  {'total':<13} {sum(first['seconds'].values()):7.2f}  {sum(second['seconds'].values()):7.2f}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
