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
With --forms, the template's options throughout, against the step with one of model/kernels' XLA:CPU forms switched
off at a time (only where the sample uses it):
  autodiff-dense  the dense layers' weight gradients as autodiff forms them (no transposed copy of the input)
With --eval, the evaluation step instead, one call a validation batch: "none" (no YNNPACK fusion, the options before)
against "template" (``platform.xla_options("eval", "cpu")``).
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
# --forms: each ablation replaces a module's attribute while the step is traced (module, attribute, replacement)
ABLATIONS = {"autodiff-dense": ("model.kernels.dense", "transposes_input", lambda x, w: False)}
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
    parser.add_argument("--eval", action="store_true", help="the evaluation step, not the training step")
    parser.add_argument("--forms", action="store_true", help="model/kernels' forms switched off, one at a time")
    return parser.parse_args(argv)


def fused_epoch(path: str, steps: int):
    """(the training call's parts, its arguments) for `steps` batches of the config's training data."""
    import jax
    import numpy as np

    from training.assembly import assemble
    from training.config.validation import load_config
    from training.precision import Policy
    from training.state import fresh
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
    state = jax.jit(lambda seed: fresh(run, optimizer, Policy(), seed))(config["seed"])
    zeros = jax.device_get(empty_stats(model, loss_fn, metrics, state["params"], state["state"], seen, augment))
    return (model, loss_fn, optimizer, metrics, augment), (state, zeros, jax.device_put(epoch))


def eval_variants(path: str, batches: int) -> tuple[dict, list]:
    """(the evaluation step compiled as before and as the template does, its arguments for each batch)."""
    import jax

    from training.assembly import assemble
    from training.config.validation import load_config
    from training.devices import platform
    from training.step import empty_stats, make_eval_step

    run = assemble(load_config(REPO / path, []))
    split = "validation" if "validation" in run.config["data_loader"] else "train"
    found = list(itertools.islice(run.load_data([split])[split].batches(1), batches))
    found = [{k: v for k, v in batch.items() if k != "active"} for batch in found]
    model, loss_fn, metrics, augment = run.model, run.loss_fn, run.metrics, run.augment
    seen = augment.spec(found[0]) if augment else found[0]
    spec = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), seen["input"])
    params, state = model.init(jax.random.PRNGKey(0), spec)
    zeros = empty_stats(model, loss_fn, metrics, params, state, seen, augment)
    lowered = jax.jit(make_eval_step(model, loss_fn, metrics, augment)).lower(params, state, zeros, found[0])
    compiled = {"none": lowered.compile({YNN: ""}), "template": lowered.compile(platform.xla_options("eval", "cpu"))}
    return compiled, [(params, state, zeros, batch) for batch in found]


def timed(compiled: dict, calls: list, rounds: int) -> dict:
    """Each variant's seconds per call, one list a variant, the variants interleaved round by round."""
    import jax

    for fn in compiled.values():
        jax.block_until_ready(fn(*calls[0]))  # warm-up
    times = {name: [] for name in compiled}
    for _ in range(rounds):
        for name, fn in compiled.items():
            start = time.perf_counter()
            jax.block_until_ready([fn(*args) for args in calls])
            times[name].append((time.perf_counter() - start) / len(calls))
    return times


def row(path: str, kind: str, times: dict) -> str:
    base = next(iter(times.values()))
    speed = {name: statistics.median(b / t for b, t in zip(base, ts)) for name, ts in times.items()}
    cells = [kind, f"{statistics.median(base) * 1e6:,.0f}"] + [f"{speed[name]:.3f}" for name in list(times)[1:]]
    return f"| {path} | " + " | ".join(cell for cell in cells if cell) + " |"


def as_template(lowered):
    """(`lowered` compiled with the XLA:CPU options the template gives its kind of step, that kind)."""
    from training.devices import platform

    kind = platform.train_kind(lowered, "cpu")
    return lowered.compile(platform.xla_options(kind, "cpu") or None), kind


def compiled_variants(parts, args) -> tuple[dict, str]:
    import jax

    from training.step import make_train_call

    lowered = jax.jit(make_train_call(*parts)).lower(*args)
    compiled = {name: lowered.compile(options) for name, options in OPTIONS.items()}
    compiled["template"], kind = as_template(lowered)
    return compiled, kind


def form_variants(parts, args) -> dict:
    """The step compiled with the template's options, first with each ablated form, then as the template has it."""
    import importlib

    import jax

    from training.step import make_train_call

    compiled = {}
    for name, (module_name, attribute, replacement) in ABLATIONS.items():
        module = importlib.import_module(module_name)
        kept = getattr(module, attribute)
        setattr(module, attribute, replacement)
        try:  # the forms are chosen when traced: a fresh function each time, so that JAX traces it anew
            lowered = jax.jit(make_train_call(*parts)).lower(*args)
        finally:
            setattr(module, attribute, kept)
        compiled[name] = as_template(lowered)[0]
    compiled["template"] = as_template(jax.jit(make_train_call(*parts)).lower(*args))[0]
    return compiled


def main(argv=None) -> int:
    args = parse_args(argv)
    print(describe())
    if args.eval:
        print("| sample | none, us/batch | template |\n| --- | --- | --- |")
    elif args.forms:
        first, *rest = [*ABLATIONS, "template"]
        names = [f"{first}, us/step", *rest]
        print("| sample | " + " | ".join(names) + " |\n" + "| --- " * (len(names) + 1) + "|")
    else:
        print("| sample | kind | " + " | ".join(["reduce, us/step", *list(OPTIONS)[1:], "template"]) + " |")
        print("| --- " * (len(OPTIONS) + 3) + "|")
    for path in args.configs.split(","):
        if args.eval:
            compiled, calls = eval_variants(path, args.steps)
            print(row(path, "", timed(compiled, calls, args.rounds)), flush=True)
        else:
            parts, call_args = fused_epoch(path, args.steps)
            if args.forms:
                compiled, kind = form_variants(parts, call_args), ""
            else:
                compiled, kind = compiled_variants(parts, call_args)
            times = timed(compiled, [call_args], args.rounds)
            print(row(path, kind, {name: [t / args.steps for t in ts] for name, ts in times.items()}), flush=True)
    print(f"load average after: {load_average()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
