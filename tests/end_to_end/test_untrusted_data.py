"""Data from elsewhere, checked where it enters: class labels outside the model's classes, integers that would wrap
when narrowed, NaN and infinite inputs (refused unless allowed), 16-bit images; and inputs that must be bounded: a
FIFO or a device where a config or a data file is expected (refused without blocking), a config or a decompressed
member over its limit, an image over the pixel limit, runtime flags out of range."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from data_loader.sources import image_files, image_folder
from data_loader.sources.arrays import ArraysDataset
from data_loader.sources.idx import read_idx
from files import reads
from tests.end_to_end.test_data_faults import train_error

ROOT = Path(__file__).resolve().parents[2]


def arrays_config(tmp_path: Path, validation: bool = False, **extra) -> dict:
    train = {"name": "arrays", "args": {"path": str(tmp_path / "data.npz"), "input": "x", "target": "y"}, **extra}
    loaders = {"train": train}
    if validation:
        loaders["validation"] = {
            "name": "arrays",
            "args": {"path": str(tmp_path / "valid.npz"), "input": "x", "target": "y"},
            **extra,
        }
    return {
        "name": "untrusted",
        "seed": 0,
        "model": {"name": "mlp", "args": {"hidden": [8], "num_classes": 10}},
        "loss": {"name": "cross_entropy"},
        "metrics": [{"name": "accuracy"}],
        "optimizer": {"name": "adam", "args": {"lr": 0.01}},
        "data_loader": loaders,
        "trainer": {"epochs": 1, "save_dir": str(tmp_path / "saved"), "monitor": "off"},
    }


def tiny_arrays(n: int = 300, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((n, 6)).astype(np.float32), "y": rng.integers(0, 10, n).astype(np.int32)}


@pytest.mark.parametrize(
    "label, row, message",
    [
        (-1, 3, "example 3: class label -1 is outside [0, 10)"),  # take_along_axis used to wrap it to class 9
        (10, 290, "example 290: class label 10 is outside [0, 10)"),  # in the last batch, not the first
    ],
)
def test_a_label_outside_the_classes_is_refused_naming_split_and_example(
    tmp_path, capsys, monkeypatch, label, row, message
):
    data = tiny_arrays()
    data["y"][row] = label
    np.savez(tmp_path / "data.npz", **data)
    line = train_error(tmp_path, capsys, monkeypatch, arrays_config(tmp_path))
    assert f"data_loader.train: {message}" in line, line
    assert not (tmp_path / "saved").exists()


def test_an_int64_label_that_would_wrap_when_narrowed_is_refused(tmp_path, capsys, monkeypatch):
    data = tiny_arrays()
    y = data["y"].astype(np.int64)
    y[7] = 2**32 + 3  # int32 would read it as 3: a valid class, silently wrong
    np.savez(tmp_path / "data.npz", x=data["x"], y=y)
    line = train_error(tmp_path, capsys, monkeypatch, arrays_config(tmp_path))
    assert "array 'y', row 7: 4294967299 does not fit int32" in line, line


@pytest.mark.parametrize("split", ["train", "validation"])
def test_nan_inputs_are_refused_by_default_and_trained_on_when_allowed(tmp_path, capsys, monkeypatch, split):
    train, valid = tiny_arrays(), tiny_arrays(40, seed=1)
    (train if split == "train" else valid)["x"][25, 2] = np.nan
    np.savez(tmp_path / "data.npz", **train)
    np.savez(tmp_path / "valid.npz", **valid)
    line = train_error(tmp_path, capsys, monkeypatch, arrays_config(tmp_path, validation=True))
    assert f"data_loader.{split}: example 25: input holds nan" in line, line
    assert "allow_nonfinite" in line

    from training.assembly import assemble
    from training.config.validation import validate

    allowed = validate(arrays_config(tmp_path, validation=True, allow_nonfinite=True))
    loaders = assemble(allowed).load_data()  # the data reaches the loop as it is
    assert np.isnan(loaders[split].dataset.get_batch(np.array([25]))["input"]).any()


def test_allow_nonfinite_must_be_a_boolean(tmp_path, capsys, monkeypatch):
    np.savez(tmp_path / "data.npz", **tiny_arrays())
    line = train_error(tmp_path, capsys, monkeypatch, arrays_config(tmp_path, allow_nonfinite="yes"))
    assert "data_loader.train.allow_nonfinite: expected true" in line, line


# --------------------------------------------------------------------------------------------------- 16-bit images
def write_16_bit_png(path: Path, value: int) -> None:
    from PIL import Image

    Image.fromarray(np.full((4, 4), value, np.uint16)).save(path)  # mode I;16


def test_a_16_bit_png_is_read_with_its_full_range_in_training_and_in_predict(tmp_path):
    from inference.predict import load_image

    for value in (0, 32768, 65535):
        path = tmp_path / f"{value}.png"
        write_16_bit_png(path, value)
        expected = round(value * 255 / 65535)
        # was 255 for every value above 255: Pillow's conversion to "L" clips
        assert (image_folder.decode(path, (4, 4), 1) == expected).all(), value
        assert (image_folder.decode(path, (4, 4), 3) == expected).all(), value
        assert np.allclose(load_image(path, (4, 4, 1), {}), expected), value


# ------------------------------------------------------------------------------------------------- bounded inputs
def run_script(*args, timeout: float = 60) -> subprocess.CompletedProcess:
    """A tool in a child process; a hang fails the test (TimeoutExpired) instead of blocking the suite."""
    return subprocess.run(
        [sys.executable, *map(str, args)], cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )


def one_line(result: subprocess.CompletedProcess) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def test_a_fifo_or_a_device_as_the_config_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    assert "a FIFO (named pipe), not a regular file" in one_line(run_script("train.py", "-c", fifo))
    assert "/dev/zero: a character device, not a regular file" in one_line(run_script("train.py", "-c", "/dev/zero"))


def test_a_config_over_the_size_limit_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "config.json"
    with open(path, "wb") as f:  # sparse: 20 MB of nothing on disk
        f.truncate(20 << 20)
    assert "20 MB, more than the 16 MB a config file may have" in one_line(run_script("train.py", "-c", path))
    path.write_text("[" + "{}," * (6 << 20) + "{}]")  # 18 MB of empty objects: memory, not a setting
    assert "more than the 16 MB a config file may have" in one_line(run_script("train.py", "-c", path))


READ_DATA_FILES = r"""
import os, sys
sys.path.insert(0, os.getcwd())
from data_loader.sources.arrays import ArraysDataset
from data_loader.sources.idx import read_idx
from files import reads
from data_loader.sources.tabular import CsvDataset
from data_loader.sources.text import CharDataset
for read in (lambda: read_idx(sys.argv[1]), lambda: ArraysDataset(sys.argv[2], "x", "y"),
             lambda: ArraysDataset(sys.argv[3], "x", "y"), lambda: CsvDataset(sys.argv[4], "y"),
             lambda: CharDataset(sys.argv[5])):
    try:
        read()
    except ValueError as error:
        print(error)
"""


def test_a_fifo_as_a_data_file_is_refused_without_blocking(tmp_path):
    """In a child process: a read that blocks fails the test by its timeout instead of hanging the suite."""
    folder = tmp_path / "arrays"
    folder.mkdir()
    np.save(folder / "x.npy", np.zeros((4, 2), np.float32))
    os.mkfifo(folder / "y.npy")
    names = ["train-labels-idx1-ubyte.gz", "data.npz", "rows.csv", "text.txt"]
    for name in names:
        os.mkfifo(tmp_path / name)
    paths = [tmp_path / names[0], folder, *(tmp_path / name for name in names[1:])]
    result = run_script("-c", READ_DATA_FILES, *paths, timeout=30)
    lines = result.stdout.splitlines()
    assert len(lines) == 5 and all("a FIFO (named pipe), not a regular file" in line for line in lines), result
    for line, name in zip(lines, [names[0], "y.npy", *names[1:]]):
        assert f"{name}: a FIFO" in line, line


def test_a_gzip_bomb_is_refused_before_it_inflates(tmp_path, monkeypatch):
    monkeypatch.setattr(reads, "MAX_INFLATED_BYTES", 1 << 20)
    path = tmp_path / "train-images-idx3-ubyte.gz"
    header = bytes([0, 0, 8, 1]) + (64 << 20).to_bytes(4, "big")  # declares 64 MB of uint8
    with gzip.open(path, "wb") as f:
        f.write(header + bytes(64 << 20))
    assert path.stat().st_size < 100_000
    with pytest.raises(ValueError, match="declares 64 MB, more than the 1 MB an IDX file may hold"):
        read_idx(path)
    # a header that lies small: no more than it declares is inflated
    with gzip.open(path, "wb") as f:
        f.write(bytes([0, 0, 8, 1]) + (10).to_bytes(4, "big") + bytes(64 << 20))
    with pytest.raises(ValueError, match="more than 18 bytes, header says 18"):
        read_idx(path)


def test_a_compressed_npz_member_over_the_limit_is_refused_before_it_inflates(tmp_path, monkeypatch):
    monkeypatch.setattr(reads, "MAX_INFLATED_BYTES", 1 << 20)
    np.savez_compressed(tmp_path / "data.npz", x=np.zeros((1 << 18, 2), np.float32), y=np.zeros(1 << 18, np.int32))
    with pytest.raises(ValueError, match="array 'x' declares 2 MB uncompressed, more than the 1 MB"):
        ArraysDataset(tmp_path / "data.npz", "x", "y")


def test_a_png_over_the_pixel_limit_is_one_line_in_training_and_in_predict(tmp_path, monkeypatch):
    from PIL import Image

    from inference import predict

    path = tmp_path / "big.png"
    Image.new("L", (40, 30)).save(path)
    monkeypatch.setattr(image_files, "MAX_PIXELS", 1000)
    monkeypatch.setattr(predict, "MAX_PIXELS", 1000)
    with pytest.raises(
        ValueError, match="big.png: cannot decode it as an image \\(40 x 30 pixels, more than the 1,000"
    ):
        image_folder.decode(path, (4, 4), 1)
    with pytest.raises(ValueError, match="big.png: 40 x 30 pixels, more than the 1,000 an image may have"):
        predict.load_image(path, (4, 4, 1), {})
    # past Pillow's own guard, Image.open raises DecompressionBombError (not an OSError): one line too
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 500)
    with pytest.raises(ValueError, match="big.png: cannot decode it as an image .*decompression bomb"):
        image_folder.decode(path, (4, 4), 1)
    with pytest.raises(ValueError, match="big.png: cannot read it as an image .*decompression bomb"):
        predict.load_image(path, (4, 4, 1), {})


def tiny_onnx_model(folder: Path) -> Path:
    """A real .onnx file: (B, 4, 4, 1) float images flattened to 16 logits, with a preprocessing.json."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Flatten", ["input"], ["logits"], axis=1)],
        "tiny",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["B", 4, 4, 1])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["B", 16])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = folder / "tiny.onnx"
    onnx.save(model, path)
    (folder / "preprocessing.json").write_text(json.dumps({"classes": [str(i) for i in range(16)]}))
    return path


def test_predict_refuses_a_fifo_input_and_unbounded_flags_without_blocking(tmp_path):
    model = tiny_onnx_model(tmp_path)
    np.save(tmp_path / "good.npy", np.zeros((2, 4, 4, 1), np.float32))
    assert run_script("inference/predict.py", model, tmp_path / "good.npy").returncode == 0
    for suffix in (".npy", ".npz", ".csv", ".png"):
        os.mkfifo(tmp_path / f"fifo{suffix}")
        line = one_line(run_script("inference/predict.py", model, tmp_path / f"fifo{suffix}"))
        assert f"fifo{suffix}: not a regular file" in line, line
    with open(tmp_path / "huge.npy", "wb") as f:  # sparse: a header, then 8 GB that take no disk
        np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": (1 << 27, 4, 4, 1)})
        f.truncate(8 << 30)
    line = one_line(run_script("inference/predict.py", model, tmp_path / "huge.npy"))
    assert "huge.npy: 8,589,934,592 bytes, more than the 1,073,741,824 an input file may have" in line, line
    for flag, value in (("--threads", 100000), ("--threads", 0), ("--tokens", 10**9), ("--seed", -1)):
        line = one_line(run_script("inference/predict.py", model, tmp_path / "good.npy", flag, value))
        assert f"{flag} {value}: expected" in line, line


def test_a_config_json_in_a_run_folder_that_is_a_fifo_is_refused(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoint-latest.params").write_bytes(b"not read: the config comes first")
    (run / "metrics.jsonl").write_text("")  # what makes it a run folder (a loose checkpoint's folder is not read)
    os.mkfifo(run / "config.json")
    line = one_line(run_script("train.py", "-r", run / "checkpoint-latest.params"))
    assert "run/config.json: a named pipe stands where a regular file is written" in line, line


STOPPED_DECODING = r"""
import os, signal, sys
sys.path.insert(0, os.getcwd())
from data_loader.sources import image_files
from data_loader.sources import image_folder
when = os.environ["STOP_WHEN"]
real_decode, real_build, decoded = image_folder.decode, image_folder.load_or_build, []
def decode(*args):
    decoded.append(1)
    if when == "decoding" and len(decoded) == 5:
        os.kill(os.getpid(), signal.SIGTERM)
    return real_decode(*args)
def load_or_build(*args):
    result = real_build(*args)
    if when == "built":
        os.kill(os.getpid(), signal.SIGTERM)
    return result
image_folder.decode, image_folder.load_or_build = decode, load_or_build
import train
status = train.main(sys.argv[1:])
print(f"decoded {len(decoded)}")
sys.exit(status)
"""


@pytest.mark.parametrize("when", ["decoding", "built"])
def test_sigterm_while_decoding_images_stops_within_a_chunk_and_says_what_was_kept(tmp_path, when):
    from PIL import Image

    root = tmp_path / "images"
    for label in range(2):
        (root / str(label)).mkdir(parents=True)
        for i in range(300):  # more than one decoding chunk (image_folder.CHUNK)
            Image.new("L", (8, 8), 255 * label).save(root / str(label) / f"{i}.png")
    config = {
        "name": "images",
        "seed": 0,
        "model": {"name": "mlp", "args": {"hidden": [4], "num_classes": 2}},
        "loss": {"name": "cross_entropy"},
        "metrics": [],
        "optimizer": {"name": "adam", "args": {"lr": 0.01}},
        "data_loader": {
            "train": {
                "name": "image_folder",
                "args": {"root": str(root), "channels": 1, "workers": 0, "dtype": "float32"},
            }
        },
        "trainer": {"epochs": 1, "save_dir": str(tmp_path / "saved"), "monitor": "off"},
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    result = subprocess.run(
        [sys.executable, "-c", STOPPED_DECODING, "-c", str(tmp_path / "config.json")],
        cwd=ROOT,
        env={**os.environ, "STOP_WHEN": when, "JAX_PLATFORMS": "cpu"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 143, result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "saved").exists()
    if when == "decoding":  # at the next image, not after all 600; the partial cache removed
        assert int(result.stdout.split()[-1]) <= 6, result.stdout
        assert line == "error: stopped by SIGTERM before training started; nothing was written", line
        assert not (root / ".cache").exists()
    else:
        cache = next((root / ".cache").glob("*.npy"))
        assert line == (
            f"error: stopped by SIGTERM before training started; no run folder was written; kept the image cache "
            f"{cache}"
        ), line


def test_predict_refuses_int64_ids_that_would_wrap_in_the_models_int32(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Cast", ["input"], ["logits"], to=TensorProto.FLOAT)],
        "ids",
        [helper.make_tensor_value_info("input", TensorProto.INT32, ["B", 3])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["B", 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "ids.onnx")
    np.save(tmp_path / "ok.npy", np.array([[0, 1, 2]], np.int64))
    assert run_script("inference/predict.py", tmp_path / "ids.onnx", tmp_path / "ok.npy").returncode == 0
    np.save(tmp_path / "wraps.npy", np.array([[0, 1, 2**32 + 3]], np.int64))
    line = one_line(run_script("inference/predict.py", tmp_path / "ids.onnx", tmp_path / "wraps.npy"))
    assert "input 'input': values 0..4294967299 do not fit the model's int32" in line, line
