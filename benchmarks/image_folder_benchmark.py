"""Training from a folder of image files against training from memory: Fashion-MNIST written out as PNG files in
class folders, then

  1. the first epoch's decode: the folder decoded into the image cache, in this process and in worker processes;
  2. loading alone: images/s of host batches from the in-memory `fashion_mnist` loader, the `image_folder` loader
     (its memory-mapped cache; uint8 and float32 inputs) and a Grain pipeline over the same cache;
  3. training: images/s of `mnist_cnn` epochs (after a warm-up epoch) fed by each of those loaders with float32
     inputs, and by the folder's uint8 batches normalised on the device (the `normalize` augmentation, inside the
     jitted step); variants interleaved round by round so load changes on a shared machine hit them alike.

    python benchmarks/image_folder_benchmark.py                    # all 70,000 images (60,000 train + 10,000 test)
    python benchmarks/image_folder_benchmark.py --subset 2000      # the first 2,000 of each split: a quick run
    python benchmarks/image_folder_benchmark.py --steps 0          # whole training epochs (default: 150 batches)

The IDX files are read from ../shared/data/fashion_mnist (else data/fashion_mnist); the PNG folder goes to
/tmp/fashion_mnist_png (--out), written once and reused while its file count matches.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks.machine import cpu_model, describe, load_average  # noqa: E402

SHARED = REPO.parent / "shared" / "data" / "fashion_mnist"
BATCH = 128


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--subset", type=int, default=0, help="images per split (0: all, 60,000 + 10,000)")
    parser.add_argument("--out", default="/tmp/fashion_mnist_png", help="where the PNG folder is written")
    parser.add_argument("--steps", type=int, default=150, help="batches per timed training epoch (0: all)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workers", default="0,2", help="worker process counts to time the first decode with")
    parser.add_argument("--json", help="also write the results here")
    return parser.parse_args(argv)


# --------------------------------------------------------------------------------------------------- the folder
def write_pngs(idx_dir: Path, out: Path, subset: int) -> dict[str, int]:
    """out/{train,test}/<class>/<index>.png from the IDX files; reused when its count file matches."""
    from PIL import Image

    from data_loader.sources.idx import read_idx
    from data_loader.sources.mnist import SOURCES

    marker = out / "count.json"
    wanted = {"subset": subset}
    if marker.is_file() and json.loads(marker.read_text()).get("subset") == subset:
        return json.loads(marker.read_text())["files"]
    shutil.rmtree(out, ignore_errors=True)
    classes = [name.replace("/", "-") for name in SOURCES["fashion_mnist"]["classes"]]
    files = {}
    for split, prefix in (("train", "train"), ("test", "t10k")):
        images = read_idx(idx_dir / f"{prefix}-images-idx3-ubyte.gz")
        labels = read_idx(idx_dir / f"{prefix}-labels-idx1-ubyte.gz")
        if subset:
            images, labels = images[:subset], labels[:subset]
        for name in classes:
            (out / split / name).mkdir(parents=True, exist_ok=True)
        for i, (image, label) in enumerate(zip(images, labels)):
            Image.fromarray(image, "L").save(out / split / classes[label] / f"{i:05d}.png")
        files[split] = len(images)
    marker.write_text(json.dumps({**wanted, "files": files}))
    return files


def decode_seconds(root: Path, workers: int) -> float:
    """Seconds to build the image cache of `root` from nothing (a fresh cache folder)."""
    from data_loader.sources.image_folder import ImageFolderDataset

    cache = Path(tempfile.mkdtemp(prefix="image-cache-"))
    try:
        start = time.perf_counter()
        ImageFolderDataset(root, size=[28, 28], channels=1, cache_dir=cache, workers=workers)
        return time.perf_counter() - start
    finally:
        shutil.rmtree(cache, ignore_errors=True)


# --------------------------------------------------------------------------------------------------------- loaders
def grain_loader(loader, threads: int):
    """A DataLoader whose batches a Grain pipeline makes over the same dataset: per-record reads (``__getitem__``),
    Grain's shuffle keyed by (seed, epoch), its batching and `threads` reader threads."""
    import grain

    from data_loader.loader import DataLoader

    data = loader.dataset

    class Records:
        def __len__(self):
            return len(data)

        def __getitem__(self, i):
            batch = data.get_batch(np.asarray([i]))
            return {"input": batch["input"][0], "target": batch["target"][0]}

    class GrainLoader(DataLoader):
        def batches(self, epoch: int = 0, start: int = 0, **_):
            seed = int(np.random.SeedSequence([self.seed, epoch]).generate_state(1)[0])
            pipeline = grain.MapDataset.source(Records()).shuffle(seed=seed).batch(self.batch_size, drop_remainder=True)
            pipeline = pipeline.slice(slice(start, len(self))).to_iter_dataset(
                grain.ReadOptions(num_threads=threads, prefetch_buffer_size=4 * self.batch_size)
            )
            for batch in pipeline:
                batch["mask"] = np.ones(self.batch_size, np.float32)
                yield batch

    return GrainLoader(data, loader.batch_size, shuffle=True, seed=loader.seed, prefetch=loader.prefetch)


def make_loaders(args, folder: Path, cache: Path) -> dict:
    from data_loader.data_loaders import fashion_mnist, image_folder

    idx_dir = SHARED if (SHARED / "train-images-idx3-ubyte.gz").is_file() else REPO / "data" / "fashion_mnist"
    memory = fashion_mnist("train", batch_size=BATCH, shuffle=True, data_dir=str(idx_dir), validation_size=0)
    if args.subset:
        memory.dataset.images = memory.dataset.images[: args.subset]
        memory.dataset.labels = memory.dataset.labels[: args.subset]
    common = {"size": [28, 28], "channels": 1, "cache_dir": str(cache), "batch_size": BATCH, "shuffle": True}
    loaders = {
        "memory": memory,
        "folder": image_folder(str(folder / "train"), dtype="float32", **common),
        "folder uint8": image_folder(str(folder / "train"), **common),
    }
    try:
        loaders["grain"] = grain_loader(loaders["folder"], threads=2)
    except ImportError:
        print("grain is not installed (pip install grain): its variant is left out")
    for loader in loaders.values():
        loader.limit = args.steps or None
    return loaders


def loading_rate(loader, epoch: int) -> float:
    start = time.perf_counter()
    count = sum(len(batch["mask"]) for batch in loader.batches(epoch))
    return count / (time.perf_counter() - start)


# -------------------------------------------------------------------------------------------------------- training
def device_normalize():
    """The augmentation list that turns uint8 images into normalised float32 on the device (in the jitted step)."""
    from training.config.validation import build_augment

    return build_augment(
        {"data_loader": {"train": {"augment": [{"name": "normalize", "args": {"mean": 0.2860, "std": 0.3530}}]}}}
    )


def compiled_trainer(loader, augment=None):
    from training import startup
    from training.assembly import assemble
    from training.config.validation import load_config
    from training.trainer import Trainer

    config = load_config(REPO / "config.json", ["model.name=mnist_cnn", "model.args={}", 'trainer.monitor="off"'])
    run = assemble(config)
    run.augment = augment  # the benchmark's own list, not the sample's
    run.use_data({"train": loader})
    trainer = Trainer(run, Path(tempfile.mkdtemp()))
    trainer.begin(startup.from_seed(trainer))
    trainer.log_compile()
    trainer.first_call_logged = True
    return trainer


def training_rate(trainer, epoch: int) -> float:
    from training.metrics import metric_results

    start = time.perf_counter()
    metric_results(trainer.run.metrics, trainer.train_epoch(epoch))  # waits for the last step
    return len(trainer.train_loader) * BATCH / (time.perf_counter() - start)


def main(argv=None) -> int:
    args = parse_args(argv)
    idx_dir = SHARED if (SHARED / "train-images-idx3-ubyte.gz").is_file() else REPO / "data" / "fashion_mnist"
    out = Path(args.out)
    started = time.perf_counter()
    files = write_pngs(idx_dir, out, args.subset)
    print(f"cpu: {describe()}; load average {load_average()}")
    print(
        f"PNG folder: {out} ({files['train']:,} train + {files['test']:,} test files; written or checked in "
        f"{time.perf_counter() - started:.1f} s)"
    )
    results = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "files": files,
        "decode_s": {},
        "loading": {},
        "training": {},
        "training_ratio": {},
    }

    total = files["train"] + files["test"]
    for workers in [int(w) for w in args.workers.split(",") if w != ""]:
        seconds = sum(decode_seconds(out / split, workers) for split in ("train", "test"))
        results["decode_s"][workers] = seconds
        print(
            f"first epoch's decode, {workers} worker processes: {seconds:.1f} s for {total:,} files "
            f"({total / seconds:,.0f} images/s); load average {load_average()}"
        )

    cache = Path(tempfile.mkdtemp(prefix="image-cache-"))
    try:
        loaders = make_loaders(args, out, cache)
        for name, loader in loaders.items():
            loading_rate(loader, 0)  # warm: page cache, first batches
            rates = [loading_rate(loader, r + 1) for r in range(args.rounds)]
            results["loading"][name] = statistics.median(rates)
            print(f"loading only, {name}: {statistics.median(rates):,.0f} images/s")
        trainers = {name: compiled_trainer(loaders[name]) for name in ("memory", "folder", "grain") if name in loaders}
        try:  # the default path: uint8 batches, converted and normalised on the device
            trainers["folder uint8"] = compiled_trainer(loaders["folder uint8"], device_normalize())
        except (ImportError, TypeError) as error:
            print(f"uint8 training variant left out (no device normalisation here: {error})")
        for trainer in trainers.values():
            training_rate(trainer, 0)  # warm-up epoch
        rates = {name: [] for name in trainers}
        names = list(trainers)
        for r in range(args.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:  # each variant first in turn
                rates[name].append(training_rate(trainers[name], r + 1))
            print(
                f"round {r + 1}: "
                + ", ".join(f"{n} {v[-1]:,.0f}" for n, v in rates.items())
                + f" images/s; load average {load_average()}"
            )
        for name, values in rates.items():
            results["training"][name] = statistics.median(values)
            # the ratio of each round's pair: load changes between rounds cancel
            results["training_ratio"][name] = statistics.median(v / m for v, m in zip(values, rates["memory"]))
    finally:
        shutil.rmtree(cache, ignore_errors=True)

    print(f"\n| {cpu_model()}, {os.cpu_count()} cores | images/s | vs memory |\n| --- | --- | --- |")
    for name, value in results["training"].items():
        print(
            f"| training mnist_cnn, {name} | {value:,.0f} | {results['training_ratio'][name]:.2f}x (median of "
            f"the rounds' ratios) |"
        )
    for name, value in results["loading"].items():
        print(f"| loading only, {name} | {value:,.0f} | {value / results['loading']['memory']:.2f}x |")
    for workers, seconds in results["decode_s"].items():
        print(f"| first decode, {workers} workers | {total / seconds:,.0f} ({seconds:.1f} s) | |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    from training.devices import platform

    platform.apply()  # the process defaults train.py runs with (may re-execute this script once)
    sys.exit(main())
