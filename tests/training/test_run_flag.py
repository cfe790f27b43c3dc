"""test.py, sample.py and the export take the run folder as --run: train.py's -r/--resume (continue training) given to
them is one `error:` line naming --run, exit status 2, before anything is read."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = {"test.py": [], "sample.py": [], "inference/convert_tflite.py": ["--name", "x"]}


def script(path: str):
    """The command as a module, loaded by path: "test" is also the name of a standard-library package."""
    spec = importlib.util.spec_from_file_location(f"{Path(path).stem}_script", ROOT / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize(
    "old, flag", [(["-r", "saved/tiny/run"], "-r"), (["--resume=saved/tiny/run"], "--resume"), (["-rsaved/x"], "-r")]
)
def test_train_resume_flag_is_refused_with_run_named(command, old, flag, capsys):
    with pytest.raises(SystemExit) as exit_info:
        script(command).main([*old, *COMMANDS[command]])
    printed = capsys.readouterr()
    (line,) = printed.err.strip().splitlines()
    assert exit_info.value.code == 2 and printed.out == "", printed.err
    assert line.startswith(f"error: {flag}: give the run folder as --run RUN (-r and --resume are train.py's")


@pytest.mark.parametrize("command", COMMANDS)
def test_help_names_run_and_hides_resume(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        script(command).main(["--help"])
    shown = capsys.readouterr().out
    assert exit_info.value.code == 0 and "--run RUN" in shown and "--resume" not in shown
