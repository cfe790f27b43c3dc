"""The image-folder data set: decoding every mode and format the way predict.py does, stable seeded splits, the
disk cache (built once, memory-mapped, invalidated by a changed file, atomic), corrupt files and empty class folders,
config errors through train.py, and a tiny end-to-end run."""

from __future__ import annotations

import importlib.util
import json
import logging
import os

import numpy as np
import pytest
from PIL import Image

from data_loader.data_loaders import image_folder
from data_loader.sources import image_folder as image_folder_module
from data_loader.sources.image_folder import ImageFolderDataset, split_rows
from tests.end_to_end.test_data_faults import train_error
from tests.end_to_end.test_train import ROOT, run, train_py_in_one_process


def rgb(seed: int, height: int, width: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def write_folder(root, per_class=(4, 5, 3), size=(6, 7)):
    """root/c<k>/<i>.png: RGB PNGs of one size, returned as {path: pixels} so tests can compare exactly."""
    pixels = {}
    for k, count in enumerate(per_class):
        (root / f"c{k}").mkdir(parents=True, exist_ok=True)
        for i in range(count):
            array = rgb(100 * k + i, *size)
            path = root / f"c{k}" / f"{i:02d}.png"
            Image.fromarray(array).save(path)
            pixels[path] = array
    return pixels


def load_predict_module():
    spec = importlib.util.spec_from_file_location("predict_for_tests", ROOT / "inference" / "predict.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rows_of(data: ImageFolderDataset) -> dict:
    batch = data.get_batch(np.arange(len(data)))
    return {path: (image, label) for path, image, label in zip(data.files, batch["input"], batch["target"])}


def test_pixels_labels_classes_and_batch_format(tmp_path):
    pixels = write_folder(tmp_path / "data")
    data = ImageFolderDataset(tmp_path / "data", cache_dir=tmp_path / "cache")
    assert data.classes == ["c0", "c1", "c2"] and len(data) == 12
    batch = data.get_batch(np.arange(len(data)))
    assert batch["input"].dtype == np.uint8 and batch["input"].shape == (12, 6, 7, 3)
    assert batch["target"].dtype == np.int32
    for path, (image, label) in rows_of(data).items():
        np.testing.assert_array_equal(image, pixels[path])  # no resize: the exact pixels written
        assert data.classes[label] == path.parent.name
    assert data.preprocessing == {
        "classes": ["c0", "c1", "c2"],
        "input_size": [6, 7],
        "channels": 3,
        "layout": "NHWC",
        "resize": "bilinear",
        "color": "RGB",
        "pixel_scale": 1.0,
    }
    scaled = ImageFolderDataset(tmp_path / "data", cache_dir=tmp_path / "cache", dtype="float32")
    x = scaled.get_batch(np.arange(3))["input"]
    assert x.dtype == np.float32
    np.testing.assert_allclose(x, batch["input"][:3] / 255.0, rtol=1e-6)
    assert scaled.preprocessing["pixel_scale"] == 1.0 / 255.0
    # the given class order is the id order; folders not named are left out
    chosen = ImageFolderDataset(tmp_path / "data", classes=["c2", "c0"], cache_dir=tmp_path / "cache")
    assert chosen.classes == ["c2", "c0"] and len(chosen) == 7
    assert all(chosen.classes[label] == path.parent.name for path, (_, label) in rows_of(chosen).items())


def test_modes_formats_and_sizes_match_predict_py(tmp_path):
    """L, RGB, RGBA, P and LA images in PNG, JPEG, BMP and WebP of assorted sizes, resized: every cached image is
    what inference/predict.py makes of the same file (so a deployed model sees what training saw)."""
    root = tmp_path / "data"
    (root / "a").mkdir(parents=True)
    (root / "b").mkdir()
    base = rgb(0, 23, 31)
    images = {
        "a/gray.png": Image.fromarray(base[..., 0], "L"),
        "a/rgba.png": Image.fromarray(np.dstack([base, base[..., :1]]), "RGBA"),
        "a/palette.png": Image.fromarray(base).convert("P", palette=Image.ADAPTIVE, colors=16),
        "a/la.png": Image.fromarray(np.dstack([base[..., 1], base[..., 2]]), "LA"),
        "b/small.bmp": Image.fromarray(rgb(1, 5, 4)),
        "b/photo.JPG": Image.fromarray(rgb(2, 40, 17)),
        "b/web.webp": Image.fromarray(rgb(3, 12, 12)),
        "b/exact.png": Image.fromarray(rgb(4, 16, 16)),
    }
    for name, image in images.items():
        image.save(root / name)
    (root / "b" / "notes.txt").write_text("not an image: ignored")
    predict = load_predict_module()
    for channels in (1, 3):
        data = ImageFolderDataset(root, size=[16, 16], channels=channels, cache_dir=tmp_path / "cache")
        assert len(data) == len(images)
        for path, (image, _) in rows_of(data).items():
            assert image.shape == (16, 16, channels)
            expected = predict.load_image(path, (16, 16, channels), {"pixel_scale": 1.0})
            np.testing.assert_array_equal(image, expected.astype(np.uint8), err_msg=str(path))
    data = ImageFolderDataset(root, size=16, cache_dir=tmp_path / "cache")
    got = rows_of(data)
    np.testing.assert_array_equal(got[root / "b" / "exact.png"][0], np.asarray(images["b/exact.png"]))
    # RGBA drops alpha; a gray image repeats its value in R, G and B
    np.testing.assert_array_equal(got[root / "a" / "gray.png"][0][..., 0], got[root / "a" / "gray.png"][0][..., 2])
    # without a size the first file's size (in sorted order) is the size
    assert ImageFolderDataset(root, cache_dir=tmp_path / "cache").size == (23, 31)


def test_split_is_a_stable_stratified_partition(tmp_path):
    root = tmp_path / "data"
    write_folder(root, per_class=(20, 10, 30), size=(2, 2))
    files = sorted(p for p in root.rglob("*.png"))
    labels = np.asarray([int(p.parent.name[1:]) for p in files])
    train = split_rows(root, files, labels, "train", 0.2, 0)
    validation = split_rows(root, files, labels, "validation", 0.2, 0)
    assert np.array_equal(np.sort(np.concatenate([train, validation])), np.arange(60))
    assert [int((labels[validation] == k).sum()) for k in range(3)] == [4, 2, 6]  # per class
    assert not np.array_equal(validation, split_rows(root, files, labels, "validation", 0.2, 1))
    # a file added to class 0 moves at most one file of that class, none of the others
    Image.fromarray(rgb(9, 2, 2)).save(root / "c0" / "new.png")
    files2 = sorted(p for p in root.rglob("*.png"))
    labels2 = np.asarray([int(p.parent.name[1:]) for p in files2])
    before = {files[i] for i in validation}
    after = {files2[i] for i in split_rows(root, files2, labels2, "validation", 0.2, 0)}
    assert len(before - after) <= 1 and len(after - before) <= 1
    loaders = [
        image_folder(str(root), split=s, validation_fraction=0.2, cache_dir=str(tmp_path / "c"), batch_size=8)
        for s in ("train", "validation")
    ]
    assert {len(loader.dataset) for loader in loaders} == {49, 12}
    assert not set(loaders[0].dataset.files) & set(loaders[1].dataset.files)
    # a test split: the next files of each class's ranking, so the validation split stays the same
    parts = {s: split_rows(root, files, labels, s, 0.2, 0, test_fraction=0.1) for s in ("train", "validation", "test")}
    assert np.array_equal(parts["validation"], validation)
    assert np.array_equal(np.sort(np.concatenate(list(parts.values()))), np.arange(60))
    assert [int((labels[parts["test"]] == k).sum()) for k in range(3)] == [2, 1, 3]


def test_cache_is_built_once_memory_mapped_and_invalidated_by_a_change(tmp_path, monkeypatch, caplog):
    root = tmp_path / "data"
    pixels = write_folder(root)
    cache = tmp_path / "cache"
    first = ImageFolderDataset(root, cache_dir=cache)
    assert isinstance(first.images, np.memmap) and not first.images.flags.writeable
    assert sorted(p.suffix for p in cache.iterdir()) == [".json", ".npy"]  # no temporary files left

    decoded = []
    real_decode = image_folder_module.decode
    monkeypatch.setattr(image_folder_module, "decode", lambda *a: decoded.append(a[0]) or real_decode(*a))
    again = ImageFolderDataset(root, cache_dir=cache)
    assert decoded == []  # read from the cache
    np.testing.assert_array_equal(np.asarray(again.images), np.asarray(first.images))
    assert type(again.get_batch(np.arange(3))["input"]) is np.ndarray  # a batch is a copy, not a view of the file

    # rewriting one file (new pixels) rebuilds the cache; only that file is decoded again
    changed = root / "c1" / "02.png"
    new_pixels = 255 - pixels[changed]
    Image.fromarray(new_pixels).save(changed)
    os.utime(changed, ns=(1, 1))  # a different time stamp whatever the file system's resolution
    with caplog.at_level(logging.INFO, logger="data_loader.sources.image_folder"):
        rebuilt = ImageFolderDataset(root, cache_dir=cache)
    assert decoded == [str(changed)]
    assert "11 reused from a previous cache" in caplog.text
    np.testing.assert_array_equal(rows_of(rebuilt)[changed][0], new_pixels)
    assert len(list(cache.glob("*.npy"))) == 1  # the stale cache is gone
    # a removed file and other settings (size, channels) are other caches too
    (root / "c0" / "00.png").unlink()
    assert len(ImageFolderDataset(root, cache_dir=cache)) == 11
    assert ImageFolderDataset(root, cache_dir=cache, channels=1).images.shape == (11, 6, 7, 1)
    # a damaged cache file is rebuilt, never trusted
    for npy in cache.glob("*.npy"):
        npy.write_bytes(b"garbage")
    decoded.clear()
    assert len(ImageFolderDataset(root, cache_dir=cache)) == 11 and len(decoded) == 11


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, "[]"], ids=["deep", "a list"])
def test_cache_metadata_past_the_json_bounds_or_not_an_object_is_rebuilt(tmp_path, text):
    """Before, metadata nested 100,000 deep was a RecursionError traceback, read as the cache or as a stale one."""
    root, cache = tmp_path / "data", tmp_path / "cache"
    write_folder(root)
    ImageFolderDataset(root, cache_dir=cache)
    [meta] = cache.glob("*.json")
    meta.write_text(text)
    assert len(ImageFolderDataset(root, cache_dir=cache)) == 12  # read as this folder's cache: rebuilt
    [meta] = cache.glob("*.json")
    meta.write_text(text)
    (root / "c0" / "00.png").unlink()  # another cache: the damaged one is read as a stale one, to reuse rows
    assert len(ImageFolderDataset(root, cache_dir=cache)) == 11


def test_default_cache_is_hidden_in_root_and_skipped_by_the_scan(tmp_path):
    root = tmp_path / "data"
    write_folder(root)
    ImageFolderDataset(root)
    assert (root / ".cache").is_dir()
    assert ImageFolderDataset(root).classes == ["c0", "c1", "c2"]


def test_worker_processes_decode_the_same_bytes(tmp_path):
    root = tmp_path / "data"
    write_folder(root, per_class=(300, 300), size=(5, 5))
    one = ImageFolderDataset(root, size=[4, 4], cache_dir=tmp_path / "one", workers=0)
    two = ImageFolderDataset(root, size=[4, 4], cache_dir=tmp_path / "two", workers=2)
    np.testing.assert_array_equal(np.asarray(one.images), np.asarray(two.images))


def test_corrupt_files_fail_by_path_or_are_skipped_and_counted(tmp_path, caplog):
    root = tmp_path / "data"
    write_folder(root)
    (root / "c0" / "zero.png").write_bytes(b"")
    good = (root / "c1" / "00.png").read_bytes()
    (root / "c1" / "cut.png").write_bytes(good[: len(good) // 2])
    (root / "c2" / "text.jpg").write_text("hello")
    with pytest.raises(ValueError) as error:
        ImageFolderDataset(root, cache_dir=tmp_path / "cache")
    message = str(error.value)
    assert message.startswith(f"{root / 'c0' / 'zero.png'}: cannot decode it as an image")
    assert "on_error" in message and "\n" not in message
    with caplog.at_level(logging.WARNING, logger="data_loader.sources.image_folder"):
        data = ImageFolderDataset(root, cache_dir=tmp_path / "cache", on_error="skip")
    assert len(data) == 12 and data.skipped == 3
    assert "skipped 3 unreadable file(s)" in caplog.text and "cut.png" in caplog.text
    assert not any(p.name in ("zero.png", "cut.png", "text.jpg") for p in data.files)
    # the cache remembers the failures: "fail" still names a file, without decoding anything again
    with pytest.raises(ValueError, match="zero.png: cannot decode it as an image .*2 more unreadable files"):
        ImageFolderDataset(root, cache_dir=tmp_path / "cache")


def test_folder_errors(tmp_path):
    root = tmp_path / "data"
    with pytest.raises(FileNotFoundError, match="no such folder"):
        ImageFolderDataset(root)
    root.mkdir()
    with pytest.raises(ValueError, match="no class folders"):
        ImageFolderDataset(root)
    write_folder(root)
    (root / "empty").mkdir()
    (root / "empty" / "readme.txt").write_text("no images here")
    with pytest.raises(ValueError, match=f"{root / 'empty'}: an empty class folder"):
        ImageFolderDataset(root, cache_dir=tmp_path / "cache")
    with pytest.raises(ValueError, match="no folder for class 'c9'; class folders there: c0, c1, c2, empty"):
        ImageFolderDataset(root, classes=["c0", "c9"], cache_dir=tmp_path / "cache")
    with pytest.raises(ValueError, match="the validation split is empty"):
        ImageFolderDataset(
            root, classes=["c0"], split="validation", validation_fraction=0.1, cache_dir=tmp_path / "cache"
        )


@pytest.mark.parametrize(
    "args, message",
    [
        ({"sizes": [8, 8]}, "data_loader.train.args.sizes: unknown argument. Did you mean 'size'?"),
        ({"size": [8, 0]}, "data_loader.train.args.size: expected [height, width]"),
        ({"channels": 4}, "data_loader.train.args.channels: expected 1 (gray) or 3 (RGB), got 4"),
        (
            {"split": "val"},
            "data_loader.train.args.split: expected one of 'all', 'train', 'validation', 'test', got 'val'",
        ),
        ({"on_error": "ignore"}, 'data_loader.train.args.on_error: expected "fail" or "skip"'),
        ({"root": "MISSING"}, "data_loader.train: MISSING: no such folder"),
        ({"dtype": "float16"}, 'data_loader.train.args.dtype: expected "uint8"'),
        ({"root": "CORRUPT"}, "c1/bad.png: cannot decode it as an image"),
    ],
)
def test_config_errors_are_one_line_with_status_2(tmp_path, capsys, monkeypatch, args, message):
    root = tmp_path / "data"
    write_folder(root)
    loader_args = {"root": str(root), "size": [8, 8], **args}
    if args.get("root") == "MISSING":
        loader_args["root"] = str(tmp_path / "MISSING")
        message = message.replace("MISSING", str(tmp_path / "MISSING"))
    elif args.get("root") == "CORRUPT":  # a file that fails to decode: named, and no cache folder left
        loader_args["root"] = str(root)
        (root / "c1" / "bad.png").write_bytes(b"\x89PNG broken")
    config = {
        "name": "folder",
        "seed": 0,
        "model": {"name": "mlp", "args": {"hidden": [8], "num_classes": 3}},
        "loss": {"name": "cross_entropy"},
        "metrics": [{"name": "accuracy"}],
        "optimizer": {"name": "adam", "args": {"lr": 0.01}},
        "data_loader": {"train": {"name": "image_folder", "args": loader_args}},
        "trainer": {"epochs": 1, "save_dir": str(tmp_path / "saved"), "monitor": "off"},
    }
    line = train_error(tmp_path, capsys, monkeypatch, config)
    assert message in line, line
    assert not (tmp_path / "saved").exists() and not (root / ".cache").exists()


@pytest.mark.slow
def test_train_py_from_an_image_folder(tmp_path):
    """One tiny epoch of mnist_cnn from a folder of PNGs (float32 inputs), validation from the same folder; the
    run's preprocessing.json carries the class names and input size."""
    root = tmp_path / "data"
    for k, name in enumerate(["dark", "light"]):
        (root / name).mkdir(parents=True)
        for i in range(24):
            value = 40 + 150 * k + i
            Image.fromarray(np.full((12, 10), value, np.uint8), "L").save(root / name / f"{i}.png")
    loader = {
        "root": str(root),
        "size": [8, 8],
        "channels": 1,
        "dtype": "float32",
        "validation_fraction": 0.25,
        "test_fraction": 0.25,
        "cache_dir": str(tmp_path / "cache"),
        "batch_size": 8,
    }
    config = {
        "name": "folder",
        "seed": 0,
        "model": {"name": "mnist_cnn", "args": {"num_classes": 2, "channels": [4], "hidden": 8}},
        "loss": {"name": "cross_entropy"},
        "metrics": [{"name": "accuracy"}],
        "optimizer": {"name": "adam", "args": {"lr": 0.01}},
        "data_loader": {
            "train": {"name": "image_folder", "args": {**loader, "split": "train", "shuffle": True}},
            "validation": {"name": "image_folder", "args": {**loader, "split": "validation"}},
            "test": {"name": "image_folder", "args": {**loader, "split": "test"}},
        },
        "trainer": {"epochs": 1, "save_dir": str(tmp_path / "saved"), "log_every": 1},
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    result = run("train.py", "-c", tmp_path / "config.json", "--run-id", "r")
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = tmp_path / "saved" / "folder" / "r"
    preprocessing = json.loads((run_dir / "preprocessing.json").read_text())
    assert preprocessing["classes"] == ["dark", "light"] and preprocessing["input_size"] == [8, 8]
    row = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert np.isfinite(row["train/loss"]) and "val/accuracy" in row
    # the config names a cache outside the run folder: given with -c, which vouches for it (docs/runs.md)
    evaluated, tested = train_py_in_one_process(  # test.py twice in one process: a JAX start fewer
        ["--run", run_dir, "-c", run_dir / "config.json", "--split", "validation"],
        ["--run", run_dir, "-c", run_dir / "config.json"],  # the test split: 6 of each class
        script="test",
    )
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert "accuracy" in evaluated.stdout and "light" in evaluated.stdout  # the per-class table names the folders
    assert tested.returncode == 0, tested.stderr[-3000:]
    assert "test split, 12 examples" in tested.stdout
