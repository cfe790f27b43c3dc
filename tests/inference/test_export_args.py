"""inference/convert_tflite.py's arguments checked against themselves, the model and the data before anything is
exported: each bad one is one `error:` line (exit status 2), no traceback, nothing written."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import pytest

from inference import convert_tflite
from tests.inference.test_export_cli import run_dir, write_config  # noqa: F401 (the tiny run folder fixture)
from training.config.components import build
from training.config.validation import load_config
from training.run import checkpoint


def refused(capsys, tmp_path, *args) -> str:
    """The command's one error line; it must exit 2, print nothing else and write nothing."""
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        convert_tflite.main([str(a) for a in (*args, "--name", "x", "--output-dir", out, "--formats", "jax")])
    printed = capsys.readouterr()
    lines = printed.err.strip().splitlines()
    assert exit_info.value.code == 2 and len(lines) == 1 and lines[0].startswith("error: "), printed.err
    assert "Traceback" not in printed.err and printed.out == "" and not out.exists()
    return lines[0]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--input", 1, -28, 28, 1], "error: --input 1 -28 28 1: axis 1 is -28; every size must be a positive integer"),
        (["--input", 0, 28, 28, 1], "error: --input 0 28 28 1: axis 0 (the batch) is 0;"),
        (["--input", 28], "error: --input 28: expected a batch and a sample shape"),
        (
            ["--input", 1, 28, 28, 1, "--input-dtype", "float99"],
            "error: --input-dtype float99: expected a numeric dtype",
        ),
        (["--input", 1, 28, 28, 1, "--input-dtype", "str"], "error: --input-dtype str: expected a numeric dtype"),
        (["--batch", 0], "error: --batch 0: expected a batch size of at least 1"),
        (["--batch", -2, "--input", 1, 28, 28, 1], "error: --batch -2: expected a batch size of at least 1"),
        (["--val-examples", -1], "error: --val-examples -1: expected 0"),
        (["--atol", "nan"], "error: --atol nan: expected a finite number >= 0"),
        (["--rtol", -1], "error: --rtol -1.0: expected a finite number >= 0"),
    ],
)
def test_bad_arguments_are_one_line(run_dir, tmp_path, capsys, args, message):  # noqa: F811
    assert refused(capsys, tmp_path, "--run", run_dir, *args).startswith(message)


@pytest.mark.parametrize(
    "args, data",
    [
        (["--input", 1, 32, 32, 1], "float32[1,28,28,1]"),
        (["--input", 4, 28, 28], "float32[4,28,28,1]"),
        (["--input", 1, 28, 28, 1, "--input-dtype", "int32"], "float32[1,28,28,1]"),
    ],
)
def test_an_input_the_data_cannot_check_is_refused_early(run_dir, tmp_path, capsys, args, data):  # noqa: F811
    line = refused(capsys, tmp_path, "--run", run_dir, *args)
    assert f"the validation data's examples are {data}, so they cannot check this export" in line
    assert "--val-examples 0" in line and "JAX accuracy" not in line


@pytest.mark.parametrize(
    "args, asked",
    [
        (["--input", 1, 32, 32, 1], "float32[1,32,32,1]"),  # the classifier's Linear expects 28x28's features
        (["--input", 1, 28, 28], "float32[1,28,28]"),  # a rank the convolution cannot take
    ],
)
def test_an_input_the_model_cannot_take_names_both_shapes(run_dir, tmp_path, capsys, args, asked):  # noqa: F811
    line = refused(capsys, tmp_path, "--run", run_dir, *args, "--val-examples", 0)
    assert line.startswith(f"error: --input {' '.join(map(str, args[1:]))}: the model cannot take {asked} (")
    assert line.endswith("the data's input is float32[1,28,28,1]")


def test_without_data_a_wrong_input_is_named(run_dir, tmp_path, capsys):  # noqa: F811
    run = tmp_path / "nodata"
    run.mkdir()
    write_config(run, tmp_path / "missing", {"name": "mnist_cnn", "args": {"channels": [4, 8], "hidden": 16}})
    (run / "model_best.params").write_bytes((run_dir / "model_best.params").read_bytes())
    line = refused(capsys, tmp_path, "--run", run, "--input", 1, 28, 28)
    assert line.startswith("error: --input 1 28 28: the model cannot take float32[1,28,28] (")
    assert "cannot be read" in line and "Put the four mnist IDX files" in line
    line = refused(capsys, tmp_path, "--run", run, "--input", 1, 32, 32, 1)  # takes it, but not with these weights
    assert "does not match the model" in line and "the model's shapes came from --input 1 32 32 1" in line


def test_an_input_of_another_shape_exports_when_the_model_takes_it(run_dir, tmp_path, capsys):  # noqa: F811
    """A model with global pooling takes 32x32 images: without validation on the 28x28 data it exports, checked
    on random inputs, and the report says why the real data was not used."""
    run = tmp_path / "convnext"
    run.mkdir()
    data_dir = load_config(run_dir / "config.json")["data_loader"]["validation"]["args"]["data_dir"]
    config_path = write_config(
        run, data_dir, {"name": "mnist_convnext", "args": {"dims": [4, 8], "depths": [1, 1], "kernel_size": 3}}
    )
    model = build(load_config(config_path)["model"], "model")
    params, state = model.init(jax.random.PRNGKey(0), jax.ShapeDtypeStruct((1, 28, 28, 1), jnp.float32))
    checkpoint.save(run / "model_best.params", {"params": params, "state": state}, {"epoch": 1, "step": 1})
    assert (
        convert_tflite.main(
            [
                str(a)
                for a in (
                    "--run",
                    run,
                    "--name",
                    "c",
                    "--output-dir",
                    tmp_path / "out",
                    "--formats",
                    "jax",
                    "--input",
                    1,
                    32,
                    32,
                    1,
                    "--val-examples",
                    0,
                )
            ]
        )
        == 0
    )
    assert "validation: not checked (--val-examples 0)" in capsys.readouterr().out
    report = json.loads((tmp_path / "out" / "c" / "report.json").read_text())
    assert report["inputs"][0]["shape"] == "[B,32,32,1]" and report["validated_on_real_data"] is False
    assert report["validation_skipped"] == "--val-examples 0"


def test_exports_go_to_a_folder_git_ignores_not_among_the_sources():
    import shutil
    import subprocess
    from pathlib import Path

    repo = Path(convert_tflite.__file__).resolve().parents[1]
    default = Path(convert_tflite.parse_args(["--name", "jax_mnist"]).output_dir)
    assert default == repo / "exports"
    if shutil.which("git") is None or not (repo / ".git").exists():
        pytest.skip("not a git checkout")
    ignored = subprocess.run(["git", "check-ignore", "-q", str(default / "jax_mnist" / "jax_mnist.onnx")], cwd=repo)
    assert ignored.returncode == 0, "exports/ must be ignored by git"
