"""inference/convert_tflite.py refuses, in one `error:` line (exit status 2) before the model is loaded, what would
otherwise fail after the converters ran: a task preprocessing.json names wrongly, an --output-dir it cannot write in,
a batch past the config's bound or past the memory the check's random inputs need (issue 48, item 7)."""

from __future__ import annotations

import json
import shutil

import pytest

from inference import convert_tflite
from tests.inference.test_export_cli import run_dir, write_config  # noqa: F401 (the tiny run folder fixture)
from training.config.schema import MAX_BATCH
from training.devices import memory


def refused(capsys, *args) -> str:
    """The command's one error line: exit 2, nothing on stdout (the model's line is printed once it is loaded)."""
    with pytest.raises(SystemExit) as exit_info:
        convert_tflite.main([str(a) for a in (*args, "--name", "x", "--formats", "jax")])
    printed = capsys.readouterr()
    lines = printed.err.strip().splitlines()
    assert exit_info.value.code == 2 and len(lines) == 1 and lines[0].startswith("error: "), printed.err
    assert "Traceback" not in printed.err and printed.out == "", printed
    return lines[0]


def test_a_task_preprocessing_json_names_wrongly_is_one_line(run_dir, tmp_path, capsys):  # noqa: F811
    run = tmp_path / "run"
    shutil.copytree(run_dir, run, ignore=shutil.ignore_patterns("data"))  # the config names the data by its path
    (run / "preprocessing.json").write_text(json.dumps({"task": "nonsense"}))
    line = refused(capsys, "--run", run, "--output-dir", tmp_path / "out")
    assert "preprocessing.json" in line and "'nonsense'" in line and "classification" in line, line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("output", ["/proc", "/proc/exports/here"])
def test_an_output_folder_it_cannot_write_in_is_one_line(run_dir, capsys, output):  # noqa: F811
    line = refused(capsys, "--run", run_dir, "--output-dir", output)
    assert line.startswith(f"error: --output-dir {output}: cannot write in /proc"), line


def test_an_output_folder_under_a_file_is_one_line(run_dir, tmp_path, capsys):  # noqa: F811
    (tmp_path / "file").write_text("")
    line = refused(capsys, "--run", run_dir, "--output-dir", tmp_path / "file" / "exports")
    assert "is not a folder" in line, line


@pytest.mark.parametrize("args", [["--batch", 10**9], ["--input", 10**9, 28, 28, 1, "--val-examples", 0]])
def test_a_batch_past_the_configs_bound_is_refused_first(run_dir, tmp_path, capsys, args):  # noqa: F811
    line = refused(capsys, "--run", run_dir, "--output-dir", tmp_path / "out", *args)
    assert f"more than the {MAX_BATCH:,}" in line, line


def test_a_batch_whose_random_inputs_exceed_memory_is_refused_before_loading(run_dir, tmp_path, capsys):  # noqa: F811
    need = MAX_BATCH * 28 * 28 * (8 + 4)  # the check's random inputs: drawn in 64 bits, then float32
    available = memory.host_available()
    if available is None or available[0] >= need:
        pytest.skip("this machine has the memory for the largest batch the bound allows")
    line = refused(capsys, "--run", run_dir, "--output-dir", tmp_path / "out", "--batch", MAX_BATCH)
    assert f"--batch {MAX_BATCH}: the export is checked on random inputs" in line and "choose a smaller" in line
