"""Mixed precision on this machine: training throughput and the loss/accuracy reached by each compute dtype of
`trainer.precision`, on the reference CNN (`mnist_cnn`) and the MNIST data shipped in data/mnist.

    python benchmarks/precision_benchmark.py                 # 2 rounds of float32, bfloat16, float16: one epoch each
    python benchmarks/precision_benchmark.py --steps 100     # throughput only, on the first 100 batches

Each run is a fresh process (the same model, seed, data order and Adam as the sample); the policies are interleaved
round by round so that load changes on a shared machine hit them alike. Reported: images/s of the epoch after its
first call (compilation excluded), its ratio to float32 in the same round, the epoch's training loss and the
validation loss and accuracy.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
POLICIES = ("float32", "bfloat16", "float16")


def one_run(compute: str, steps: int) -> dict:
    from training import startup
    from training.assembly import assemble
    from training.config.validation import load_config
    from training.metrics import metric_results
    from training.trainer import Trainer

    overrides = [
        "model.name=mnist_cnn",
        "model.args={}",
        f'trainer.precision={{"compute": "{compute}"}}',
        'trainer.monitor="off"',
    ]
    config = load_config(REPO / "config.json", overrides)
    run = assemble(config)
    loaders = run.load_data()
    if steps:
        loaders["train"].limit = steps
        run.use_data({"train": loaders["train"]})  # the schedule over the steps measured
    train = loaders["train"]
    trainer = Trainer(run, Path(tempfile.mkdtemp()))
    trainer.begin(startup.from_seed(trainer))
    trainer.log_compile()
    trainer.first_call_logged = True
    import jax

    # the first call runs outside the clock: the epoch is timed from its second call on
    k = trainer.steps_per_call.k
    call = trainer.compiled.train_call(k)
    stacks = train.stacks(1, k, trainer.placement.put_stack)
    totals = trainer.compiled.empty_stats()
    real, stack = next(stacks)
    trainer.train_state, totals, _ = call(trainer.train_state, totals, stack)
    jax.block_until_ready(trainer.train_state)
    examples, start = 0, time.perf_counter()
    for real, stack in stacks:
        trainer.train_state, totals, _ = call(trainer.train_state, totals, stack)
        examples += real * train.batch_size
    train_results = metric_results(trainer.run.metrics, totals)  # waits for the last step
    seconds = time.perf_counter() - start
    valid = trainer.evaluate(loaders["validation"], 1)
    return {
        "compute": compute,
        "images_per_s": examples / seconds,
        "train_loss": train_results["loss"],
        "val_loss": valid["loss"],
        "val_accuracy": valid["accuracy"],
        "steps": len(train),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=0, help="batches per epoch (0: the whole training split)")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(one_run(args.child, args.steps)))
        return 0
    from benchmarks.machine import describe, load_average

    print(f"cpu: {describe()}")
    results: dict[str, list[dict]] = {p: [] for p in args.policies.split(",")}
    for round_ in range(args.rounds):
        for policy in results:
            out = subprocess.run(
                [sys.executable, __file__, "--child", policy, "--steps", str(args.steps)],
                capture_output=True,
                text=True,
                cwd=REPO,
                env={**os.environ, "JAX_PLATFORMS": "cpu"},
            )
            if out.returncode:
                print(out.stderr[-2000:])
                return 1
            row = json.loads(out.stdout.strip().splitlines()[-1])
            results[policy].append(row)
            print(
                f"round {round_ + 1} {policy:9s} {row['images_per_s']:8.0f} images/s  train loss "
                f"{row['train_loss']:.4f}  val loss {row['val_loss']:.4f}  val accuracy {row['val_accuracy']:.4f}"
                f"  (load average {load_average()})",
                flush=True,
            )
    base = statistics.median(r["images_per_s"] for r in results["float32"]) if "float32" in results else None
    print("\n| compute | images/s (median) | vs float32 | train loss | val loss | val accuracy |")
    print("|---|---|---|---|---|---|")
    for policy, rows in results.items():
        rate = statistics.median(r["images_per_s"] for r in rows)
        ratio = f"{rate / base:.2f}x" if base else "-"
        print(
            f"| {policy} | {rate:,.0f} | {ratio} | {rows[-1]['train_loss']:.4f} | {rows[-1]['val_loss']:.4f} | "
            f"{rows[-1]['val_accuracy']:.4f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
