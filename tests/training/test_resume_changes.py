"""A resume under another config: what would change the meaning of the saved position inside an epoch is refused
naming the key; a changed monitor starts its best value afresh, saying so; safe changes go on and are listed. The
header's position, epoch and step are checked against each other and against the run they resume into."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest

from data_loader.loader import ArrayDataset, DataLoader
from tests.end_to_end.test_train import make_config, run, train_py_in_one_process
from tests.training.test_checkpoint_integrity import rewrite
from training import optimizers, startup
from training.assembly import assemble
from training.config.validation import validate
from training.run import checkpoint
from training.run.checkpoint import CheckpointError
from training.trainer import Trainer

SGD = {"name": "sgd", "args": {"lr": 0.1}}


def make_trainer(tmp_path, name, batch=16, n=160, epochs=1, monitor="min train/loss", accumulate=1, optimizer=SGD):
    config = validate(
        {
            "name": "t",
            "seed": 1,
            "model": {"name": "mlp", "args": {"num_classes": 5, "hidden": [8]}},
            "loss": {"name": "cross_entropy"},
            "metrics": [{"name": "accuracy"}],
            "optimizer": optimizer,
            "data_loader": {"train": {"name": "mnist", "args": {"batch_size": batch}}},
            "trainer": {
                "epochs": epochs,
                "steps_per_call": 2,
                "save_dir": str(tmp_path),
                "monitor": monitor,
                "accumulate_steps": accumulate,
                "checkpoint_every": {"steps": 2, "keep": 2},
            },
        }
    )
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(n, 6)).astype(np.float32), rng.integers(0, 5, n).astype(np.int32)
    assembled = assemble(config)
    assembled.use_data({"train": DataLoader(ArrayDataset(input=x, target=y), batch, shuffle=True, prefetch=0)})
    (tmp_path / name).mkdir()
    return Trainer(assembled, tmp_path / name)


@pytest.fixture
def trained(tmp_path):
    """One epoch of 10 batches with step checkpoints every 2 steps (the last two kept): checkpoint-step_8.params is
    saved 8 batches into epoch 1, checkpoint-latest.params at its end."""
    trainer = make_trainer(tmp_path, "first")
    trainer.begin(startup.from_seed(trainer))
    trainer.train()
    assert checkpoint.read(trainer.run_dir / "checkpoint-step_8.params")[1]["position"] == 8
    return trainer.run_dir


@pytest.mark.parametrize(
    "change, named",
    [
        ({"batch": 32}, "data_loader.train.args.batch_size 16; this config has 32"),
        ({"accumulate": 2}, "trainer.accumulate_steps 1; this config has 2"),
        ({"n": 320}, "saved 8 batch(es) into epoch 1 of 10; the training data now has 20 batches per epoch"),
    ],
)
def test_a_mid_epoch_position_under_other_data_settings_is_refused(tmp_path, trained, change, named):
    resumed = make_trainer(tmp_path, "resumed", **change)
    with pytest.raises(CheckpointError) as error:
        resumed.begin(startup.from_checkpoint(resumed, trained / "checkpoint-step_8.params"))
    assert named in str(error.value), error.value
    assert str(error.value).startswith(str(trained / "checkpoint-step_8.params"))


def test_at_an_epoch_end_the_same_changes_are_allowed_and_listed(tmp_path, trained):
    resumed = make_trainer(tmp_path, "resumed", batch=32, epochs=2)
    resumed.begin(startup.from_checkpoint(resumed, trained / "checkpoint-latest.params"))
    (notes,) = resumed.start.notes
    assert notes.startswith("config changed since the checkpoint: ")
    assert "data_loader.train.args.batch_size 16 -> 32" in notes and "trainer.epochs 1 -> 2" in notes
    assert "trainer.save_dir" not in notes  # the same folder: unchanged keys are not listed
    resumed.train()
    assert resumed.epoch == 2


def test_a_changed_monitor_starts_its_best_value_afresh_saying_so(tmp_path, trained):
    before = checkpoint.read(trained / "checkpoint-latest.params")[1]
    assert before["best"] is not None and before["monitor"] == "min train/loss"
    resumed = make_trainer(tmp_path, "resumed", epochs=2, monitor="max train/accuracy")
    resumed.begin(startup.from_checkpoint(resumed, trained / "checkpoint-latest.params"))
    assert resumed.checkpoints.best is None and resumed.checkpoints.bad_epochs == 0
    assert any(
        "trainer.monitor changed from 'min train/loss' to 'max train/accuracy'" in n for n in resumed.start.notes
    )
    resumed.train()
    after = checkpoint.read(resumed.run_dir / "model_best.params")[1]
    assert after["monitor"] == "max train/accuracy" and after["best"] == after["row"]["train/accuracy"]


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"position": 9, "batches": 9}, "field 'position' is 9, expected less than 'batches' (9)"),
        ({"best_epoch": 3}, "field 'best_epoch' is 3, expected at most 'epoch' (1)"),
        ({"bad_epochs": 2}, "field 'bad_epochs' is 2, expected at most 'epoch' (1)"),
    ],
)
def test_header_fields_that_bound_each_other_are_checked_when_read(trained, tmp_path, fields, message):
    arrays, header = checkpoint.read(trained / "checkpoint-latest.params")
    rewrite(tmp_path / "bad.params", arrays, json.dumps({**header, **fields}))  # checksums recomputed
    with pytest.raises(CheckpointError, match=message.replace("(", r"\(").replace(")", r"\)")):
        checkpoint.read(tmp_path / "bad.params")


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"position": 50, "batches": 60}, "of 60; the training data now has 10 batches per epoch"),
        ({"position": 10**12}, "its position 1000000000000 is not a step boundary inside an epoch of 10 batches"),
        ({"step": 3}, "its header says step 3 but its state's step counter is 8"),
    ],
)
def test_a_lying_header_is_refused_against_the_run_it_resumes(trained, tmp_path, fields, message):
    """Consistent checksums, a header that lies: without the checks a position of 10**12 ends the epoch at once with
    stale totals, one of 50 trains a wrong number of steps."""
    arrays, header = checkpoint.read(trained / "checkpoint-step_8.params")
    header = {k: v for k, v in {**header, **fields}.items() if k != "batches" or "batches" in fields}
    path = trained / "checkpoint-step_9.params"
    rewrite(path, arrays, json.dumps(header))
    resumed = make_trainer(tmp_path, "resumed")
    with pytest.raises(CheckpointError, match=message):
        resumed.begin(startup.from_checkpoint(resumed, path))


@pytest.mark.slow
def test_train_py_refuses_a_changed_batch_size_mid_epoch_in_one_line(tmp_path, data_dir):
    """Before: --bs 4096 on a checkpoint saved mid-epoch ended that epoch at once with stale totals, exit 0."""
    config = make_config(
        tmp_path,
        data_dir,
        trainer__epochs=1,
        trainer__steps_per_call=2,
        trainer__checkpoint_every={"steps": 4, "keep": 1},
    )
    assert run("train.py", "-c", config, "--run-id", "r").returncode == 0
    step = next((tmp_path / "saved/tiny/r").glob("checkpoint-step_*.params"))
    files = {p.name: p.read_bytes() for p in step.parent.iterdir() if p.is_file()}
    copy = shutil.copytree(step.parent, tmp_path / "saved/tiny/copy")  # the resume that keeps the batch size
    result, resumed = train_py_in_one_process(  # one process, a JAX start fewer
        ["-r", step, "--bs", "64", "--epochs", "2"],
        ["-r", copy / step.name, "--epochs", "2", "--set", "trainer.log_every=5"],
    )
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert "with data_loader.train.args.batch_size 32; this config has 64" in line, line
    assert {p.name: p.read_bytes() for p in step.parent.iterdir() if p.is_file()} == files
    result = resumed
    assert result.returncode == 0, result.stderr
    assert "resume: config changed since the checkpoint: trainer.epochs 1 -> 2, trainer.log_every 1 -> 5" in (
        result.stdout + result.stderr
    )


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    from tests.conftest import make_idx_dataset

    folder = tmp_path_factory.mktemp("data") / "mnist"
    make_idx_dataset(folder, n_train=330, n_test=90)
    return folder


# A resume that changes trainer.monitor (max accuracy -> min loss) under a reduce_on_plateau schedule (issue 48, item 9):
# the schedule's best value, kept in the optimizer state, was of the old metric too; compared with the new one every
# epoch would count as bad and the rate would fall without a word. It starts afresh, as the checkpoints' best does,
# saying so in one line, and its learning-rate scale so far is kept.
PLATEAU_SGD = {
    "name": "sgd",
    "schedule": {"name": "reduce_on_plateau", "args": {"init_value": 0.1, "factor": 0.5, "patience": 0}},
}


def test_a_changed_monitor_starts_reduce_on_plateaus_best_afresh_saying_so(tmp_path):
    first = make_trainer(tmp_path, "first", n=64, monitor="max train/accuracy", optimizer=PLATEAU_SGD)
    first.begin(startup.from_seed(first))
    first.train()
    saved = optimizers.plateau_state(first.train_state["opt_state"])
    assert float(saved.best) < 0  # an accuracy, stored negated ("max": lower is better inside)

    resumed = make_trainer(tmp_path, "resumed", n=64, epochs=2, optimizer=PLATEAU_SGD)
    resumed.begin(startup.from_checkpoint(resumed, first.run_dir / "checkpoint-latest.params"))
    fresh = optimizers.plateau_state(resumed.train_state["opt_state"])
    assert math.isinf(float(fresh.best)) and int(fresh.bad_epochs) == 0
    assert float(fresh.scale) == float(saved.scale)  # the rate reached so far is kept
    said = [n for n in resumed.start.notes if "reduce_on_plateau" in n]
    assert len(said) == 1 and "start afresh" in said[0], resumed.start.notes
    resumed.train()  # the new metric's first value is its best: no reduction for it
    after = optimizers.plateau_state(resumed.train_state["opt_state"])
    assert float(after.scale) == float(saved.scale) and float(after.best) > 0


def test_the_same_monitor_keeps_reduce_on_plateaus_state(tmp_path):
    first = make_trainer(tmp_path, "first", n=64, optimizer=PLATEAU_SGD)
    first.begin(startup.from_seed(first))
    first.train()
    saved = optimizers.plateau_state(first.train_state["opt_state"])
    resumed = make_trainer(tmp_path, "resumed", n=64, epochs=2, optimizer=PLATEAU_SGD)
    resumed.begin(startup.from_checkpoint(resumed, first.run_dir / "checkpoint-latest.params"))
    kept = optimizers.plateau_state(resumed.train_state["opt_state"])
    assert float(kept.best) == float(saved.best) and not any("reduce_on_plateau" in n for n in resumed.start.notes)
