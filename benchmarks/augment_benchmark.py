"""The augmentation's share of the training step on the CIFAR-10 sample's shapes (benchmarks/README.md).

    python benchmarks/augment_benchmark.py [--steps 60] [--rounds 3] [--batch 128] [--depth 20]

Times the template's jitted K-step training call (`training.step.make_train_call`, K = 10, batches already on the
device) for the sample's ResNet on uint8 (B, 32, 32, 3) batches, with the sample's list (random_crop 4, flip_horizontal,
normalize) against normalize alone (the conversion every uint8 run needs), interleaved round by round; and the
list on its own, jitted, per batch. Prints the medians and the augmentation's share of the step.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.machine import cpu_model  # noqa: E402
from model.model import cifar_resnet  # noqa: E402
from training.config.validation import build_augment  # noqa: E402
from training.losses import cross_entropy  # noqa: E402
from training.metrics import accuracy  # noqa: E402
from training.optimizers import add_decayed_weights, chain, sgd  # noqa: E402
from training.step import empty_stats, make_train_call  # noqa: E402

NORMALIZE = {"name": "normalize", "args": {"mean": [0.4914, 0.4822, 0.4465], "std": [0.2470, 0.2435, 0.2616]}}
LISTS = {
    "crop + flip + normalize": [
        {"name": "random_crop", "args": {"padding": 4}},
        {"name": "flip_horizontal"},
        NORMALIZE,
    ],
    "normalize only": [NORMALIZE],
}
K = 10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60, help="timed steps per variant and round (multiple of 10)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--depth", type=int, default=20)
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    stack = {
        "input": rng.integers(0, 256, (K, args.batch, 32, 32, 3)).astype(np.uint8),
        "target": rng.integers(0, 10, (K, args.batch)).astype(np.int32),
        "mask": np.ones((K, args.batch), np.float32),
        "active": np.ones((K,), np.float32),
    }
    stack = jax.device_put(stack)
    batch_spec = {k: jax.ShapeDtypeStruct(v.shape[1:], v.dtype) for k, v in stack.items() if k != "active"}
    model, metrics = cifar_resnet(depth=args.depth), [accuracy()]
    optimizer = chain(add_decayed_weights(5e-4), sgd(0.1, momentum=0.9, nesterov=True))

    calls, states = {}, {}
    for name, ops in LISTS.items():
        augment = build_augment({"data_loader": {"train": {"augment": ops}}})
        spec = augment.spec(batch_spec)["input"]
        params, state = jax.jit(lambda: model.init(jax.random.PRNGKey(0), spec))()
        ts = {
            "params": params,
            "state": state,
            "opt_state": optimizer.init(params),
            "step": jnp.zeros((), jnp.int32),
            "rng": jax.random.PRNGKey(1),
        }
        totals = empty_stats(model, cross_entropy, metrics, params, state, batch_spec, augment)
        chunk = jax.jit(make_train_call(model, cross_entropy, optimizer, metrics, augment))
        started = time.perf_counter()
        jax.block_until_ready(chunk(ts, totals, stack))
        print(f"{name}: compiled and ran one call in {time.perf_counter() - started:.1f}s")
        calls[name], states[name] = chunk, (ts, totals)
        if name.startswith("crop"):
            outputs = jax.ShapeDtypeStruct((args.batch, 10), jnp.float32)
            alone = jax.jit(lambda b, k, augment=augment: augment(b, k, train=True, outputs=outputs))
            one = {k: v[0] for k, v in stack.items() if k != "active"}
            jax.block_until_ready(alone(one, jax.random.PRNGKey(0)))
            times = []
            for i in range(50):
                started = time.perf_counter()
                jax.block_until_ready(alone(one, jax.random.PRNGKey(i)))
                times.append(time.perf_counter() - started)
            alone_ms = 1000 * statistics.median(times)

    per_step = {name: [] for name in LISTS}
    for round_ in range(args.rounds):
        for name, chunk in calls.items():
            ts, totals = states[name]
            started = time.perf_counter()
            for _ in range(max(1, args.steps // K)):
                ts, totals, logs = chunk(ts, totals, stack)
            jax.block_until_ready(ts)
            per_step[name].append((time.perf_counter() - started) / (max(1, args.steps // K) * K))
            states[name] = (ts, totals)
        print(f"round {round_ + 1}: " + ", ".join(f"{n} {1000 * v[-1]:.1f} ms/step" for n, v in per_step.items()))

    with_list, without = (statistics.median(per_step[n]) for n in LISTS)
    print(
        f"\n{cpu_model()}, {os.cpu_count()} cores, jax {jax.__version__}, ResNet-{args.depth}, batch {args.batch}, "
        f"K = {K}, {args.steps} steps x {args.rounds} rounds, medians; load average {os.getloadavg()[0]:.1f}"
    )
    print("| list | ms per step | steps/s |\n| --- | --- | --- |")
    for name in LISTS:
        value = statistics.median(per_step[name])
        print(f"| {name} | {1000 * value:.1f} | {1 / value:.2f} |")
    print(
        f"crop + flip alone, jitted, one batch: {alone_ms:.2f} ms ({100 * alone_ms / 1000 / with_list:.2f}% of a step)"
    )
    share = 100 * (with_list - without) / with_list
    print(f"augmentation's share of the step (difference of the medians): {share:.1f}%")


if __name__ == "__main__":
    main()
