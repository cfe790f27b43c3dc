"""Files and flags from elsewhere (a shared run folder or export, a hand-edited preprocessing.json, a damaged model,
odd flag values, a closed pipe, Ctrl-C, a platform that is not there, an ASCII terminal): each is one `error:` line
and exit status 2 (130 for Ctrl-C, 141 quietly for a closed pipe), never a traceback."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import sample
import train
from data_loader.sources import tabular
from inference import convert_tflite, exporter, predict
from tests.end_to_end.test_train import make_config
from tests.inference.test_export_cli import run_dir  # noqa: F401 (a tiny run folder: config.json, model_best.params, data)
from tests.training.test_resume_changes import make_trainer
from training import startup

REPO = Path(__file__).resolve().parents[2]
CLASSES = 3


def one_line(capsys, main, *args) -> str:
    """`main`'s one `error:` line: it returns or exits with status 2 and prints nothing else."""
    try:
        status = main([str(a) for a in args])
    except SystemExit as exit_info:
        status = exit_info.code
    printed = capsys.readouterr()
    lines = printed.err.strip().splitlines()
    assert status == 2 and len(lines) == 1 and lines[0].startswith("error: "), (status, printed.err)
    assert "Traceback" not in printed.err and printed.out == "", printed
    return lines[0]


def tiny_onnx(path: Path) -> Path:
    """A real ONNX model of one MatMul: (batch, 4) float32 -> (batch, CLASSES) logits."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weights = numpy_helper.from_array(np.random.default_rng(0).normal(size=(4, CLASSES)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["input", "w"], ["output"])],
        "tiny",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", CLASSES])],
        [weights],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


@pytest.fixture
def export(tmp_path) -> Path:
    """An export-like folder: tiny.onnx and an input batch x.npy (no preprocessing.json yet)."""
    folder = tmp_path / "export"
    folder.mkdir()
    tiny_onnx(folder / "tiny.onnx")
    np.save(folder / "x.npy", np.random.default_rng(1).normal(size=(5, 4)).astype(np.float32))
    return folder


@pytest.fixture
def run_copy(run_dir, tmp_path) -> Path:  # noqa: F811
    """A copy of the tiny run folder that a test may change."""
    return Path(shutil.copytree(run_dir, tmp_path / "run", symlinks=True))


# ---------------------------------------------------------------------------------------------- preprocessing.json
BAD_PREPROCESSING = {
    "not JSON": ("{'classes': [", "not a readable JSON file"),
    "a list": ("[1, 2]", "expected a JSON object of the data's preprocessing, got list"),
    "vocabulary 5": ('{"vocabulary": 5}', "'vocabulary' is 5, expected a string"),
    "classes 7": ('{"classes": 7}', "'classes' is 7, expected a list of class names"),
}


@pytest.mark.parametrize("case", BAD_PREPROCESSING)
@pytest.mark.parametrize("tool", ["predict", "sample", "export"])
def test_a_bad_preprocessing_json_is_one_line_in_every_reader(tool, case, export, run_copy, tmp_path, capsys):
    """Before: a traceback in each of the three (JSONDecodeError, AttributeError, TypeError further on)."""
    text, message = BAD_PREPROCESSING[case]
    folder = export if tool == "predict" else run_copy
    (folder / "preprocessing.json").write_text(text)
    if tool == "predict":
        line = one_line(capsys, predict.main, folder / "tiny.onnx", folder / "x.npy")
    elif tool == "sample":
        line = one_line(capsys, sample.main, "--run", folder, "--prompt", "a")
    else:
        out = tmp_path / "exports"
        line = one_line(capsys, convert_tflite.main, "--run", folder, "--name", "x", "--output-dir", out)
        assert not out.exists()
    assert str(folder / "preprocessing.json") in line and message in line, line


def test_a_good_preprocessing_json_still_names_the_classes(export, capsys):
    (export / "preprocessing.json").write_text(json.dumps({"classes": ["cat", "dog", "emu"]}))
    assert predict.main([str(export / "tiny.onnx"), str(export / "x.npy"), "--top", "1"]) == 0
    assert sum(line.endswith(")") and ": " in line for line in capsys.readouterr().out.splitlines()) == 5


# ------------------------------------------------------------------------------------------------------ predict.py
@pytest.mark.parametrize(
    "name, content, message",
    [
        ("empty.csv", "", "empty; expected a header of column names"),
        (
            "huge.csv",
            "a,b,c,d\n" + "1" * 131_073 + ",2,3,4\n",
            "not a readable CSV file (field larger than field limit",
        ),
        ("garbage.onnx", os.urandom(2000), "the runtime cannot load it as a model"),
        pytest.param(
            "garbage.tflite",
            b"\x00" * 64 + os.urandom(2000),
            "The model is not a valid Flatbuffer buffer",
            marks=pytest.mark.skipif(".tflite" not in exporter.SUFFIX.values(), reason="no TFLite route"),
        ),
    ],
)
def test_predict_on_a_bad_file_is_one_line(export, capsys, name, content, message):
    """Before: an empty CSV was an IndexError, a cell over csv's limit a _csv.Error, an .onnx that is not one
    onnxruntime's InvalidProtobuf, each a traceback."""
    path = export / name
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    model, inputs = (path, [export / "x.npy"]) if path.suffix != ".csv" else (export / "tiny.onnx", [path])
    assert message in one_line(capsys, predict.main, model, *inputs)


def test_predict_on_a_byte_flipped_onnx_answers_or_refuses_in_one_line(export, capsys):
    """A flipped byte may leave a model that still loads and runs (a weight changed) or break it: either way exit 0
    or one line, never a traceback."""
    good = (export / "tiny.onnx").read_bytes()
    refusals = 0
    for offset in range(0, len(good), max(1, len(good) // 40)):
        damaged = bytearray(good)
        damaged[offset] ^= 0xFF
        (export / "bad.onnx").write_bytes(bytes(damaged))
        try:
            status = predict.main([str(export / "bad.onnx"), str(export / "x.npy")])
        except SystemExit as exit_info:
            status = exit_info.code
        printed = capsys.readouterr()
        assert status in (0, 2) and "Traceback" not in printed.err, (offset, printed.err)
        if status == 2:
            refusals += 1
            assert len(printed.err.strip().splitlines()) == 1 and printed.err.startswith("error: "), printed.err
    assert refusals > 0


@pytest.mark.parametrize(
    "main, args, message",
    [
        ("predict", ["--seed", "-1"], "--seed -1: expected an integer from 0 to 2**63 - 1"),
        ("sample", ["--seed", "-1"], "--seed -1: expected an integer from 0 to 2**63 - 1"),
        ("sample", ["--temperature", "nan"], "--temperature must be >= 0 (a finite number)"),
        ("sample", ["--temperature", "inf"], "--temperature must be >= 0 (a finite number)"),
    ],
)
def test_seed_and_temperature_out_of_range_are_one_line(export, run_copy, capsys, main, args, message):
    """Before: sample.py took NaN and infinity (every comparison with NaN is false) and a seed of -1 reached
    numpy's default_rng, a traceback."""
    if main == "predict":
        (export / "preprocessing.json").write_text(json.dumps({"vocabulary": "abc", "task": "sequence"}))
        line = one_line(capsys, predict.main, export / "tiny.onnx", "--text", "ab", *args)
    else:
        (run_copy / "preprocessing.json").write_text(json.dumps({"vocabulary": "abc"}))
        line = one_line(capsys, sample.main, "--run", run_copy, "--prompt", "ab", *args)
    assert message in line, line


# ---------------------------------------------------------------------------------------- configs, data, the loop
@pytest.mark.parametrize(
    "change, message",
    [
        (["--set", "metrics.\u00b2.name=accuracy"], "metrics.\u00b2: no such list index"),  # "²".isdigit() is True
        (["--set", "metrics.\u0663.name=accuracy"], "no such list index"),  # Arabic-Indic 3: isdecimal() is True
        (["--set", 'trainer.save_dir="saved/\\ud800"'], "holds a lone surrogate, which no file or file name can hold"),
    ],
)
def test_config_values_no_file_can_hold_and_non_ascii_indexes_are_one_line(tmp_path, capsys, change, message):
    """Before: int("²") raised ValueError; a save_dir with a lone surrogate failed in mkdir (UnicodeEncodeError)."""
    config = make_config(tmp_path, tmp_path / "data")
    assert message in one_line(capsys, train.main, "-c", config, *change)


def test_a_lone_surrogate_in_a_config_file_is_one_line(tmp_path, capsys):
    config = make_config(tmp_path, tmp_path / "data")
    config.write_text(config.read_text().replace('"name": "tiny"', '"name": "tiny\\udfff"'))
    assert "config.json: name: " in one_line(capsys, train.main, "-c", config)


def test_a_csv_cell_over_the_csv_limit_names_the_file_and_line(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text("x,y\n1,2\n3," + "4" * 131_073 + "\n")
    with pytest.raises(ValueError, match=r"rows\.csv: line 3: not readable as CSV \(field larger than field limit"):
        tabular._read(path)


def test_a_step_checkpoint_kept_by_hand_survives_the_rotation(tmp_path):
    """checkpoint_every.keep rotates the numbered files it wrote; one renamed by hand is left alone. Before: int()
    of "good" raised in the checkpoint writer and stopped the run."""
    trainer = make_trainer(tmp_path, "run")
    (trainer.run_dir / "checkpoint-step_good.params").write_bytes(b"kept")
    trainer.begin(startup.from_seed(trainer))
    trainer.train()
    assert (trainer.run_dir / "checkpoint-step_good.params").read_bytes() == b"kept"
    assert sorted(p.name for p in trainer.run_dir.glob("checkpoint-step_*.params")) == [
        "checkpoint-step_6.params",
        "checkpoint-step_8.params",
        "checkpoint-step_good.params",
    ]


# ------------------------------------------------------------------------------------------------------ the export
@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--name", "n" * 300],
            "--name 'nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn'...: 300 bytes, expected at most 100",
        ),
        (["--name", "x", "--output-dir", "/dev/null"], "--output-dir /dev/null: /dev/null is not a folder"),
        (["--name", "x", "--output-dir", "/dev/null/sub"], "--output-dir /dev/null/sub: /dev/null is not a folder"),
    ],
)
def test_export_name_and_output_dir_are_checked_before_anything_is_read(tmp_path, capsys, args, message):
    """The run named does not even exist: these are refused first. Before: only after the model was loaded."""
    assert message in one_line(capsys, convert_tflite.main, "--run", tmp_path / "missing", *args)


# ----------------------------------------------------------------------------------- processes: pipes and signals
def started(args: list, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, *map(str, args)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "JAX_PLATFORMS": "cpu", **(env or {})},
    )


@pytest.mark.parametrize("command", ["train", "test", "predict"])
def test_a_closed_pipe_ends_quietly_with_status_141(export, run_copy, command):
    """`train.py --list | head -1`: the reader has gone before the output is written. Before: a BrokenPipeError
    traceback and status 1 (or 120 from the flush at exit)."""
    args = {
        "train": ["train.py", "--list"],
        "test": ["test.py", "--run", run_copy],
        "predict": ["inference/predict.py", export / "tiny.onnx", *[export / "x.npy"] * 2000],  # 10,000 lines
    }[command]
    process = started(args)
    process.stdout.close()  # as `head -1` does once it has its line
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=120) == 128 + signal.SIGPIPE and stderr == "", stderr


# Runs a command's file as `python FILE ARGS` would, after making `module.function` send this process SIGINT
# (as Ctrl-C does) when it is called: a point where the command is at work.
INTERRUPTED = r"""
import importlib, os, runpy, signal, sys
# Ctrl-C as in a terminal, even where the tests run with SIGINT ignored (a shell's background job), which Python keeps
signal.signal(signal.SIGINT, signal.default_int_handler)
module, function = sys.argv[1].rsplit(".", 1)
owner = importlib.import_module(module)
real = getattr(owner, function)
def interrupted(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGINT)
    return real(*args, **kwargs)
setattr(owner, function, interrupted)
sys.argv = sys.argv[2:]
sys.path.insert(0, os.getcwd())
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize(
    "script, at, args",
    [
        ("test.py", "training.run.checkpoint.restore", ["--run", "{run}"]),
        ("sample.py", "training.config.file.read_config_file", ["--run", "{run}"]),
        ("inference/predict.py", "numpy.load", ["{export}/tiny.onnx", "{export}/x.npy"]),
        pytest.param(
            "inference/convert_tflite.py",
            "inference.exporter.collect_validation",
            ["--run", "{run}", "--name", "x", "--output-dir", "{tmp}/exports", "--formats", "jax"],
            marks=pytest.mark.slow,
        ),
    ],
)
def test_ctrl_c_is_one_line_and_status_130(run_copy, export, tmp_path, script, at, args):
    """Before: a KeyboardInterrupt traceback from each."""
    args = [a.format(run=run_copy, export=export, tmp=tmp_path) for a in args]
    process = started(["-c", INTERRUPTED, at, REPO / script, *args])
    out, err = (s.decode() for s in process.communicate(timeout=300))
    assert process.returncode == 130, err
    assert err.strip().splitlines() == ["error: stopped by SIGINT (Ctrl-C)"], err
    assert not (tmp_path / "project").exists() and not (tmp_path / "exports" / "x").exists()


# ----------------------------------------------------------------------------------- the platform and the terminal
CUDA_PLUGIN = any(importlib.util.find_spec(f"jax_cuda{v}_plugin") for v in (12, 13))


@pytest.mark.skipif(CUDA_PLUGIN, reason="a CUDA plugin is installed: JAX_PLATFORMS=cuda may well start")
@pytest.mark.parametrize("script", ["test.py", "train.py"])
def test_a_platform_jax_cannot_start_is_one_line(run_copy, script):
    """JAX_PLATFORMS=cuda on a machine without its plugin or a GPU. Before: an AssertionError traceback from JAX
    (train.py), or a line blaming the model (test.py)."""
    args = ["--run", run_copy] if script == "test.py" else ["-c", run_copy / "config.json", "--run-id", "r"]
    process = started([script, *args], env={"JAX_PLATFORMS": "cuda"})
    out, err = (s.decode() for s in process.communicate(timeout=300))
    assert process.returncode == 2, err
    (line,) = err.strip().splitlines()
    assert line.startswith("error: JAX_PLATFORMS=cuda: JAX cannot start it here ("), line
    assert not (run_copy / "saved").exists()


def test_unicode_class_names_on_an_ascii_terminal(export):
    """LC_ALL=C without Python's UTF-8 mode: stdout's encoding is ASCII. Before: UnicodeEncodeError."""
    (export / "preprocessing.json").write_text(json.dumps({"classes": ["caf\u00e9", "stra\u00dfe", "\u5b57"]}))
    process = started(
        ["inference/predict.py", export / "tiny.onnx", export / "x.npy", "--top", "3"],
        env={"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0", "PYTHONIOENCODING": ""},
    )
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err.decode()
    assert b"caf\\xe9" in out and b"stra\\xdfe" in out and b"\\u5b57" in out, out
