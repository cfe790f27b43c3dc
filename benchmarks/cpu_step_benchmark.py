"""The training step of each sample on XLA:CPU under the compiler options the template could give it, compiled side by
side in one process and timed interleaved (runs on a shared machine drift by more than the differences measured).

    python benchmarks/cpu_step_benchmark.py                          # every sample, 30 steps, 6 rounds
    python benchmarks/cpu_step_benchmark.py --configs configs/shakespeare_char.json --steps 50 --rounds 10

Each sample's steps run as the fused bound does (`lax.scan` over batches already on the device, one call a round).
Variants, as speeds relative to the first:
  reduce     YNNPACK fusions for reductions only (jaxlib 0.10's measured choice, 0.12's before issue 46)
  +512       and 512-bit vectors preferred
  +dots      and YNNPACK's matrix products too
  template   what ``platform.train_kind`` chooses for the step (the kind is printed)
The CPU, its cores and the load average are printed with the results.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks.machine import describe, load_average  # noqa: E402

CONFIGS = [
    "config.json",
    "configs/shakespeare_char.json",
    "configs/tabular_regression.json",
    "configs/churn.json",
    "configs/mnist_multitask.json",
    "configs/mnist_segmentation.json",
]  # configs/cifar10_resnet.json downloads CIFAR-10 first: name it with --configs
YNN = "xla_cpu_experimental_ynn_fusion_type"
OPTIONS = {
    "reduce": {YNN: "LIBRARY_FUSION_TYPE_REDUCE"},
    "+512": {YNN: "LIBRARY_FUSION_TYPE_REDUCE", "xla_cpu_prefer_vector_width": 512},
    "+dots": {YNN: "LIBRARY_FUSION_TYPE_DOT,LIBRARY_FUSION_TYPE_REDUCE", "xla_cpu_prefer_vector_width": 512},
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--steps", type=int, default=30, help="training steps per timed call")
    parser.add_argument("--rounds", type=int, default=6)
    return parser.parse_args(argv)


def fused_epoch(path: str, steps: int):
    """(the training call's parts, its arguments) for `steps` batches of the config's training data."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from training.assembly import assemble
    from training.config.validation import load_config
    from training.step import empty_stats

    config = load_config(REPO / path, [])
    config["trainer"]["monitor"] = "off"
    run = assemble(config)
    loader = run.load_data(["train"])["train"]
    run.use_data({"train": loader})
    batches = list(itertools.islice(loader.batches(1), steps))
    batches = list(itertools.islice(itertools.cycle(batches), steps))  # a small data set repeats its batches
    epoch = jax.tree.map(lambda *leaves: np.stack(leaves), *batches)
    epoch["active"] = np.ones(steps, np.float32)
    model, loss_fn, metrics, (optimizer, _), augment = run.model, run.loss_fn, run.metrics, run.optimizer(), run.augment
    one = jax.tree.map(lambda v: v[0], {k: v for k, v in epoch.items() if k != "active"})
    seen = augment.spec(one) if augment else one  # the batch as the model sees it
    spec = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), seen["input"])

    def init(seed):
        params, state = model.init(jax.random.PRNGKey(seed), spec)
        return {
            "params": params,
            "state": state,
            "opt_state": optimizer.init(params),
            "step": jnp.zeros((), jnp.int32),
            "rng": jax.random.PRNGKey(1),
        }

    state = jax.jit(init)(config["seed"])
    zeros = jax.device_get(empty_stats(model, loss_fn, metrics, state["params"], state["state"], seen, augment))
    return (model, loss_fn, optimizer, metrics, augment), (state, zeros, jax.device_put(epoch))


def compiled_variants(parts, args) -> tuple[dict, str]:
    import jax

    from training.devices import platform
    from training.step import make_train_call

    lowered = jax.jit(make_train_call(*parts)).lower(*args)
    kind = platform.train_kind(lowered, "cpu")
    compiled = {name: lowered.compile(options) for name, options in OPTIONS.items()}
    compiled["template"] = lowered.compile(platform.xla_options(kind, "cpu") or None)
    return compiled, kind


def main(argv=None) -> int:
    import jax

    args = parse_args(argv)
    print(describe())
    print("| sample | kind | " + " | ".join(["reduce, us/step", *list(OPTIONS)[1:], "template"]) + " |")
    print("| --- " * (len(OPTIONS) + 3) + "|")
    for path in args.configs.split(","):
        parts, call_args = fused_epoch(path, args.steps)
        compiled, kind = compiled_variants(parts, call_args)
        for fn in compiled.values():
            jax.block_until_ready(fn(*call_args))  # warm-up
        times = {name: [] for name in compiled}
        for _ in range(args.rounds):
            for name, fn in compiled.items():
                start = time.perf_counter()
                jax.block_until_ready(fn(*call_args))
                times[name].append((time.perf_counter() - start) / args.steps)
        base = times["reduce"]
        speed = {name: statistics.median(b / t for b, t in zip(base, ts)) for name, ts in times.items()}
        cells = [f"{statistics.median(base) * 1e6:,.0f}"] + [f"{speed[name]:.3f}" for name in list(compiled)[1:]]
        print(f"| {path} | {kind} | " + " | ".join(cells) + " |", flush=True)
    print(f"load average after: {load_average()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
