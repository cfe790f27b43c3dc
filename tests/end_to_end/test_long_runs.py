"""Long runs: step checkpoints with rotation, resume from any of them, `-r auto` for requeued jobs, debug modes."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import jax
import numpy as np
import pytest

from tests.end_to_end.test_run_faults import assert_consistent, data_dir, fault_config, reference, rows_of, run_faulty  # noqa: F401
from tests.end_to_end.test_train import ROOT, run, train_py_in_one_process, write_config
from training.run import checkpoint


def assert_same_state(path, want_path) -> None:
    got, header = checkpoint.read(path)
    want, want_header = checkpoint.read(want_path)
    assert (header["epoch"], header["step"]) == (want_header["epoch"], want_header["step"])
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def step_config(tmp_path, data_dir, async_checkpoints=True, **every):
    spec = json.loads(fault_config(tmp_path, data_dir).read_text())
    spec["trainer"].update(checkpoint_every=every, async_checkpoints=async_checkpoints)
    return write_config(tmp_path, spec, {})


def test_step_checkpoints_rotate_and_change_nothing(tmp_path, data_dir, reference):
    """Every 4 steps (calls of 2, epochs of 9): a save at the first call boundary past each multiple of 4 since the
    last save (epoch ends count as saves), numbered step checkpoints 4, 8, 13, 17, 20, 24 of which the last 2 are
    kept; the run ends exactly as the reference."""
    config = step_config(tmp_path, data_dir, steps=4, keep=2)
    result = run("train.py", "-c", config, "--run-id", "s")
    assert result.returncode == 0, result.stderr
    run_dir = tmp_path / "saved/tiny/s"
    steps = sorted(int(p.stem.rsplit("_", 1)[1]) for p in run_dir.glob("checkpoint-step_*.params"))
    assert steps == [20, 24], steps
    assert "checkpoint at step 4 (4 of 9 into epoch 1)" in result.stdout
    assert_same_state(run_dir / "checkpoint-latest.params", reference / "checkpoint-latest.params")
    assert rows_of(run_dir) == rows_of(reference)
    header = checkpoint.read(run_dir / "checkpoint-step_20.params")[1]
    assert (header["epoch"], header["position"]) == (2, 2)


@pytest.mark.slow
def test_kill_after_a_step_checkpoint_resumes_from_it_exactly(tmp_path, data_dir, reference):
    # written in the loop, so the save of step 13 is on disk when the kill comes (a background write could still
    # be in flight, and the kill would then leave the save before it: correct, but not this test's point)
    config = step_config(tmp_path, data_dir, async_checkpoints=False, steps=4)
    killed = run_faulty("step:15:SIGKILL", "-c", config, "--run-id", "k")
    assert killed.returncode == -signal.SIGKILL
    run_dir = tmp_path / "saved/tiny/k"
    assert checkpoint.read(run_dir / "checkpoint-latest.params")[1]["position"] == 4  # step 13, epoch 2
    assert_consistent(run_dir)
    resumed = run("train.py", "-r", run_dir / "checkpoint-latest.params")
    assert resumed.returncode == 0, resumed.stderr
    assert "(4 step(s) into epoch 2)" in resumed.stdout
    assert_same_state(run_dir / "checkpoint-latest.params", reference / "checkpoint-latest.params")
    assert_same_state(run_dir / "model_best.params", reference / "model_best.params")
    assert rows_of(run_dir) == rows_of(reference)


def test_resume_auto_starts_then_continues_the_named_run(tmp_path, data_dir, reference):
    config = fault_config(tmp_path, data_dir)
    stopped = run_faulty("step:13:SIGTERM", "-r", "auto", "-c", config, "--run-id", "job")
    assert stopped.returncode == 143, stopped.stderr
    assert "state: fresh state from seed" in stopped.stdout
    resumed = run("train.py", "-r", "auto", "-c", config, "--run-id", "job")
    assert resumed.returncode == 0, resumed.stderr
    run_dir = tmp_path / "saved/tiny/job"
    assert f"state: resumed from {run_dir / 'checkpoint-latest.params'}: epoch 1, step 15" in resumed.stdout
    assert_same_state(run_dir / "checkpoint-latest.params", reference / "checkpoint-latest.params")
    assert rows_of(run_dir) == rows_of(reference)
    assert sorted(p.name for p in (tmp_path / "saved/tiny").iterdir()) == ["job"]


def test_resume_auto_reuses_a_folder_whose_first_attempt_wrote_no_checkpoint(tmp_path, data_dir, reference):
    config = fault_config(tmp_path, data_dir)
    killed = run_faulty("step:3:SIGKILL", "-r", "auto", "-c", config, "--run-id", "job")
    assert killed.returncode == -signal.SIGKILL
    assert not (tmp_path / "saved/tiny/job/checkpoint-latest.params").exists()
    again = run("train.py", "-r", "auto", "-c", config, "--run-id", "job")
    assert again.returncode == 0, again.stderr
    assert sorted(p.name for p in (tmp_path / "saved/tiny").iterdir()) == ["job"]
    assert rows_of(tmp_path / "saved/tiny/job") == rows_of(reference)


def test_resume_auto_needs_a_run_name(tmp_path, data_dir):
    result = run("train.py", "-r", "auto", "-c", fault_config(tmp_path, data_dir))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: -r auto: name the run with --run-id NAME (or trainer.run_id), so a requeued job finds it"
    ]


def test_fast_dev_run_checks_everything_and_leaves_nothing(tmp_path, data_dir):
    config = fault_config(tmp_path, data_dir)
    result = run("train.py", "-c", config, "--fast-dev-run")
    assert result.returncode == 0, result.stderr
    assert "epoch 1/1" in result.stdout and "test (1 batch): loss" in result.stdout
    line = next(line for line in result.stdout.splitlines() if line.startswith("fast dev run passed"))
    folder = line.split("(in ", 1)[1].split(",", 1)[0]
    assert not Path(folder).exists() and not (tmp_path / "saved").exists()
    assert "first 1 training step(s) done" in result.stdout


def test_limit_and_overfit_batches(tmp_path, data_dir):
    config = fault_config(tmp_path, data_dir)
    limited, overfit, bad = train_py_in_one_process(  # one process: two JAX starts fewer
        ["-c", config, "--limit-batches", "2", "--run-id", "lim"],
        ["-c", config, "--overfit-batches", "1", "--epochs", "25", "--run-id", "of"],
        ["-c", config, "--overfit-batches", "0"],
    )
    assert limited.returncode == 0, limited.stderr
    assert [row["step"] for row in rows_of(tmp_path / "saved/tiny/lim")] == [2, 4, 6]
    assert overfit.returncode == 0, overfit.stderr
    rows = rows_of(tmp_path / "saved/tiny/of")
    assert rows[-1]["step"] == 25 and rows[-1]["val/loss"] < 0.01, rows[-1]
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "error: --overfit-batches: expected a number of batches >= 1, got 0"
    ]


def test_detect_nans_names_the_first_bad_operation(tmp_path, data_dir):
    """A learning rate of 1e30 sends the parameters to infinity in the first step; the next step's values are NaN:
    --detect-nans stops there (exit status 1), naming the operation and the line of the template's code that ran
    it. Which operation that is depends on the CPU's kernels (the loss's sub on some, the model's dot_general on
    others), so the test checks that a real line of this project is named, not which one."""
    config = fault_config(tmp_path, data_dir)
    result = run(
        "train.py",
        "-c",
        config,
        "--detect-nans",
        "--set",
        "optimizer.args.lr=1e30",
        "--set",
        "trainer.steps_per_call=1",
        "--limit-batches",
        "3",
        "--run-id",
        "n",
    )
    assert result.returncode == 1, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("--detect-nans:")]
    assert len(lines) == 1, result.stdout
    found = re.fullmatch(
        r"--detect-nans: invalid value \(nan\) encountered in (\w+) at ([\w/]+\.py):(\d+) "
        r"\((.+)\); training stopped",
        lines[0],
    )
    assert found, lines[0]
    source = ROOT / found[2]
    assert source.is_file() and ".venv" not in source.parts, lines[0]
    assert source.read_text().splitlines()[int(found[3]) - 1].strip() == found[4], lines[0]
    assert "Traceback" not in result.stdout + result.stderr


def test_no_jit_runs_op_by_op_and_trains_as_compiled(tmp_path):
    """--no-jit: the loss sees real values (what a breakpoint or a print there shows; compiled, the same line
    raises a ConcretizationTypeError), and the step ends where the compiled step does."""
    from tests.training.test_accumulate_precision import make_trainer
    from training.step import make_train_call

    compiled = make_trainer(tmp_path, "aot", 32, n=32)
    eager = make_trainer(tmp_path, "eager", 32, n=32)
    seen = []

    def watched(outputs, targets, **kw):
        seen.append(float(jax.lax.stop_gradient(outputs).sum()))
        return eager.run.loss_fn(outputs, targets, **kw)

    eager.execution = eager.compiled.execution = "eager"
    eager.compiled.train = jax.jit(
        make_train_call(eager.run.model, watched, eager.optimizer, eager.run.metrics, lr_fn=eager.lr_fn)
    )
    compiled.train()
    with jax.disable_jit():
        eager.train()
    # real numbers: the step, and the inactive entry that completes its call of 2 (the scan ran as a Python loop)
    assert len(seen) == 2 and all(np.isfinite(seen))
    for a, b in zip(jax.tree.leaves(compiled.train_state), jax.tree.leaves(eager.train_state)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
