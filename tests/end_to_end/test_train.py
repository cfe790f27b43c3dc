"""End to end: real `train.py` / `test.py` subprocesses on tiny generated IDX data in a temp folder."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import make_idx_dataset
from training.run import checkpoint

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("data") / "mnist"
    make_idx_dataset(folder, n_train=330, n_test=90)
    return folder


@pytest.fixture(scope="module")
def one_epoch(tmp_path_factory, data_dir):
    """A one-epoch run of make_config, trained once for the tests that start from a finished run: one that changes
    the run folder takes a copy of it (shutil.copytree)."""
    folder = tmp_path_factory.mktemp("one_epoch")
    result = run("train.py", "-c", make_config(folder, data_dir, trainer__epochs=1), "--run-id", "r")
    assert result.returncode == 0, result.stderr
    return folder / "saved/tiny/r"


def make_config(tmp_path: Path, data_dir: Path, **changes) -> Path:
    loader = {"name": "mnist", "args": {"data_dir": str(data_dir), "verify": False, "validation_size": 60}}
    config = {
        "name": "tiny",
        "seed": 1,
        "model": {"name": "mlp", "args": {"hidden": [32], "dropout": 0.1}},
        "loss": {"name": "cross_entropy"},
        "metrics": [{"name": "accuracy"}, {"name": "f1"}],
        "optimizer": {"name": "adam", "args": {"lr": 0.003}},
        "data_loader": {
            "train": {**loader, "args": {**loader["args"], "split": "train", "batch_size": 32, "shuffle": True}},
            "validation": {**loader, "args": {**loader["args"], "split": "validation", "batch_size": 40}},
            "test": {**loader, "args": {**loader["args"], "split": "test", "batch_size": 40}},
        },
        "trainer": {
            "epochs": 2,
            "save_dir": str(tmp_path / "saved"),
            "save_period": 1,
            "monitor": "max val/accuracy",
            "log_every": 1,
        },
    }
    return write_config(tmp_path, config, changes)


def write_config(folder: Path, config: dict, changes: dict) -> Path:
    """folder/config.json: `config` with `changes` applied, keys of nested sections joined by "__"
    (trainer__epochs=3)."""
    for dotted, value in changes.items():
        node = config
        *parents, last = dotted.split("__")
        for part in parents:
            node = node[part]
        node[last] = value
    path = folder / "config.json"
    path.write_text(json.dumps(config, indent=2))
    return path


def run(script: str, *args, env=None, timeout=300) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "JAX_PLATFORMS": "cpu", **(env or {})}
    return subprocess.run(
        [sys.executable, script, *map(str, args)],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# In one process: each command's script's main (train, test) on its arguments in turn, its output captured; prints
# one JSON line of [exit status, stdout, stderr] per command (in_one_process).
MAIN_ON_EACH = """
import contextlib, importlib, json, sys, tempfile

def call(script, *argv):  # into files, not StringIO: what asks a stream for its fileno() gets one
    out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")  # left open: a log handler may hold one
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = importlib.import_module(script).main(list(argv))
        except SystemExit as stop:
            status = stop.code
    said = []
    for stream in (out, err):
        stream.flush()
        stream.seek(0)
        said.append(stream.read())
        stream.seek(0, 2)
    return status, *said

print(json.dumps([call(*command) for command in json.loads(sys.argv[1])]))
"""


def in_one_process(*commands: list, env=None, timeout=300) -> list[subprocess.CompletedProcess]:
    """Each command (``["train", *args]``, ``["test", *args]``) run by its script's main, one after the other in one
    process (a JAX start and its imports for all, where a test's point is not the process): each one's status and
    output as its own process's would be."""
    commands = [list(map(str, command)) for command in commands]
    done = run("-c", MAIN_ON_EACH, json.dumps(commands), env=env, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(said) == len(commands), said
    return [subprocess.CompletedProcess([f"{c[0]}.py", *c[1:]], *s) for c, s in zip(commands, said)]


def train_py_in_one_process(*argvs: list, env=None, timeout=300, script="train") -> list[subprocess.CompletedProcess]:
    """train.py's runs of `argvs` (``script="test"``: test.py's) in one process (``in_one_process``)."""
    return in_one_process(*([script, *argv] for argv in argvs), env=env, timeout=timeout)


def params_of(path: Path) -> dict:
    arrays, header = checkpoint.read(path)
    return arrays, header


def test_run_folder_contents_best_checkpoint_and_test_py(tmp_path, data_dir):
    config = make_config(tmp_path, data_dir, trainer__epochs=3)
    result = run("train.py", "-c", config, "--run-id", "r1")
    assert result.returncode == 0, result.stderr
    run_dir = tmp_path / "saved" / "tiny" / "r1"
    names = {p.name for p in run_dir.iterdir()}
    assert {
        "config.json",
        "model",
        "train.log",
        "metrics.jsonl",
        "checkpoint-latest.params",
        "model_best.params",
        "checkpoint-epoch_1.params",
        "checkpoint-epoch_2.params",
        "checkpoint-epoch_3.params",
    } <= names
    assert (run_dir / "model" / "model.py").is_file()
    saved = json.loads((run_dir / "config.json").read_text())
    assert saved["trainer"]["early_stop"] == 0 and saved["trainer"]["async_checkpoints"] is True  # defaults filled
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2, 3]
    for key in ("train/loss", "train/accuracy", "val/loss", "val/accuracy", "val/f1", "time/examples_per_s"):
        assert all(np.isfinite(r[key]) for r in rows), key
    assert rows[-1]["train/loss"] < rows[0]["train/loss"]
    accuracies = [r["val/accuracy"] for r in rows]
    _, best_header = params_of(run_dir / "model_best.params")
    assert best_header["epoch"] == 1 + int(np.argmax(accuracies))  # first epoch with the best value
    assert best_header["best"] == pytest.approx(max(accuracies))
    assert "epoch 1 step 1:" in (run_dir / "train.log").read_text()

    tested, validated = train_py_in_one_process(  # test.py twice in one process: a JAX start fewer
        ["--run", run_dir], ["--run", run_dir, "--split", "validation"], script="test"
    )
    assert tested.returncode == 0, tested.stderr
    assert "accuracy" in tested.stdout and "confusion matrix" in tested.stdout
    assert validated.returncode == 0 and "validation split, 60 examples" in validated.stdout


def test_resume_is_bitwise_exact(tmp_path, data_dir):
    config = make_config(tmp_path, data_dir)
    assert run("train.py", "-c", config, "--run-id", "straight").returncode == 0
    first = run("train.py", "-c", config, "--run-id", "split", "--epochs", "1")
    assert first.returncode == 0, first.stderr
    resumed = run("train.py", "-r", tmp_path / "saved/tiny/split/checkpoint-latest.params", "--epochs", "2")
    assert resumed.returncode == 0, resumed.stderr
    a, header_a = params_of(tmp_path / "saved/tiny/straight/checkpoint-latest.params")
    b, header_b = params_of(tmp_path / "saved/tiny/split/checkpoint-latest.params")
    assert header_a["epoch"] == header_b["epoch"] == 2 and header_a["step"] == header_b["step"]
    assert a.keys() == b.keys() and any(k.startswith("opt_state") for k in a)
    for key in a:
        assert np.array_equal(a[key], b[key]), key
    rows_a = (tmp_path / "saved/tiny/straight/metrics.jsonl").read_text().splitlines()
    rows_b = (tmp_path / "saved/tiny/split/metrics.jsonl").read_text().splitlines()
    strip = lambda line: {k: v for k, v in json.loads(line).items() if not k.startswith("time/")}
    assert [strip(r) for r in rows_a] == [strip(r) for r in rows_b]


def test_early_stopping(tmp_path, data_dir):
    # lr 0: the monitored loss never improves after epoch 1, so patience 2 stops after epoch 3.
    config = make_config(
        tmp_path,
        data_dir,
        optimizer={"name": "sgd", "args": {"lr": 0.0}},
        trainer__epochs=10,
        trainer__early_stop=2,
        trainer__monitor="min val/loss",
    )
    result = run("train.py", "-c", config, "--run-id", "es")
    assert result.returncode == 0, result.stderr
    rows = (tmp_path / "saved/tiny/es/metrics.jsonl").read_text().splitlines()
    assert len(rows) == 3 and "early stop" in result.stdout


def test_nan_stops_training_and_keeps_last_good_checkpoint(tmp_path, one_epoch):
    latest = Path(shutil.copytree(one_epoch, tmp_path / "nan")) / "checkpoint-latest.params"
    before = latest.read_bytes()
    result = run("train.py", "-r", latest, "--epochs", "3", "--lr", "1e30")
    assert result.returncode == 1
    assert "non-finite loss" in result.stdout and "epoch 2, step" in result.stdout
    assert latest.read_bytes() == before


@pytest.mark.parametrize(
    "change, message",
    [
        ({"model": {"name": "mlpp"}}, "config.json: model.name: unknown model 'mlpp'; available: char_transformer, "),
        ({"model": {"name": "mlpp"}}, ". Did you mean 'mlp'?"),
        (
            {"model": {"name": "mlp", "args": {"hiden": [3]}}},
            "config.json: model.args.hiden: unknown argument. Did you mean 'hidden'?",
        ),
        (
            {
                "optimizer": {"name": "adam", "args": {"lrr": 0.1}}
            },  # the signature as written, no quotes, no return type
            "optimizer.args.lrr: unknown argument. Did you mean 'lr'? Accepted: adam(lr: Hyper, b1: float = 0.9, b2: float "
            "= 0.999, eps: float = 1e-08)",
        ),
        ({"optimizer": {"name": "adam", "args": {"lr": "fast"}}}, "optimizer.args.lr: expected float"),
        ({"optimizer": {"name": "adam", "args": {"lr": -1.0}}}, "optimizer.args.lr: must be >= 0.0"),
        (
            {"optimizer": {"name": "adam", "schedule": {"name": "cosine_decay", "args": {"init_value": 0.1}}}},
            "optimizer.schedule.args: missing argument 'decay_steps'",
        ),
        ({"trainer__monitor": "max val/acc"}, "trainer.monitor: 'val/acc' is not logged. Did you mean 'val/accuracy'?"),
        ({"trainer__epochs": 0}, "trainer.epochs: must be >= 1"),
        ({"trainer__epoch": 3}, "trainer.epoch: unknown setting. Did you mean 'epochs'?"),
        ({"data_loader__train__args__batch_size": 0}, "data_loader.train.args.batch_size: must be >= 1"),
        ({"metrics": [{"name": "acuracy"}]}, "metrics.0.name: unknown metrics 'acuracy'"),
        ({"loss": {"name": "cross_entropy", "args": {"smoothing": 0.1}}}, "loss.args.smoothing: unknown argument"),
    ],
)
def test_bad_config_exits_2_with_one_line_and_writes_nothing(tmp_path, data_dir, capsys, monkeypatch, change, message):
    line = refused_in_process(["-c", str(make_config(tmp_path, data_dir, **change))], capsys, monkeypatch)
    assert message in line
    assert not (tmp_path / "saved").exists()


def refused_in_process(argv: list[str], capsys, monkeypatch) -> str:
    """The one `error:` line of train.main(argv) refusing it in this process with exit status 2 (train.py's own
    process refusing a bad config: test_config_fuzz.py)."""
    import train

    monkeypatch.setattr(train, "setup_logging", lambda *a, **k: None)  # dictConfig would close pytest's handlers
    with pytest.raises(SystemExit) as exit_info:
        train.main(argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert exit_info.value.code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


def test_malformed_json_reports_line_and_column(tmp_path, capsys, monkeypatch):
    path = tmp_path / "config.json"
    path.write_text('{\n  "name": "x",\n  "seed": 1,,\n}')
    assert "line 3, column 13" in refused_in_process(["-c", str(path)], capsys, monkeypatch)


def test_bad_override_and_missing_data(tmp_path, data_dir, capsys, monkeypatch):
    config = make_config(tmp_path, data_dir)
    line = refused_in_process(["-c", str(config), "--set", "metrics.7.name=x"], capsys, monkeypatch)
    assert "metrics.7: no such list index" in line
    config = make_config(tmp_path, data_dir, data_loader__train__args__data_dir=str(tmp_path / "none"))
    assert "Put the four mnist IDX files" in refused_in_process(["-c", str(config)], capsys, monkeypatch)
    assert not (tmp_path / "saved").exists()


def test_corrupt_checkpoint_is_refused_clearly(tmp_path, data_dir, one_epoch):
    run_dir = Path(shutil.copytree(one_epoch, tmp_path / "c"))
    latest = run_dir / "checkpoint-latest.params"
    latest.write_bytes(latest.read_bytes()[:-100])
    result = run("train.py", "-r", latest, "--epochs", "2")
    assert result.returncode == 2 and "truncated or corrupt" in result.stderr and "Traceback" not in result.stderr
    other = make_config(tmp_path, data_dir, model={"name": "mlp", "args": {"hidden": [16]}})
    best = run_dir / "model_best.params"
    result = run("test.py", "--run", best, "-c", other)
    assert (
        result.returncode == 2
        and "params.fc0.weight: file has float32[784, 32], model expects float32[784, 16]" in result.stderr
    )


def test_four_devices_match_one(tmp_path, data_dir):
    config = make_config(tmp_path, data_dir, model={"name": "mlp", "args": {"hidden": [32]}})
    one = run("train.py", "-c", config, "--run-id", "one")
    four = run(
        "train.py", "-c", config, "--run-id", "four", env={"XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    )
    assert one.returncode == 0 and four.returncode == 0, four.stderr
    assert "TFRT_CPU_3" in four.stdout or "CpuDevice(id=3)" in four.stdout or "cpu:3" in four.stdout.lower()

    def step_losses(run_id):
        lines = (tmp_path / f"saved/tiny/{run_id}/train.log").read_text().splitlines()
        return np.array([float(l.split("loss ")[1].split()[0]) for l in lines if " step " in l and "loss " in l])

    a, b = step_losses("one"), step_losses("four")
    assert len(a) == len(b) == 2 * 9
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)


def test_runtime_config_problems_exit_2_and_leave_no_run_folder(tmp_path, data_dir):
    config = make_config(tmp_path, data_dir, data_loader__train__args__batch_size=30)
    result = run("train.py", "-c", config, env={"XLA_FLAGS": "--xla_force_host_platform_device_count=4"})
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        "error: data_loader.train.args.batch_size 30 must be a multiple of the 4 devices in use: 28 or 32"
    ]
    assert not (tmp_path / "saved").exists()


def test_a_resume_on_fewer_devices_names_the_mesh_setting_that_fits_them(tmp_path, data_dir):
    config = make_config(tmp_path, data_dir, mesh={"data": -1, "fsdp": 4}, trainer__epochs=1)
    devices = lambda n: {"XLA_FLAGS": f"--xla_force_host_platform_device_count={n}"}
    assert run("train.py", "-c", config, "--run-id", "r", env=devices(4)).returncode == 0
    latest, metrics = tmp_path / "saved/tiny/r/checkpoint-latest.params", tmp_path / "saved/tiny/r/metrics.jsonl"
    before = metrics.read_bytes()
    copy = shutil.copytree(tmp_path / "saved/tiny/r", tmp_path / "saved/tiny/copy")  # the named setting resumes it
    refusal, resumed = train_py_in_one_process(  # one process on 2 devices, a JAX start fewer
        ["-r", latest, "--epochs", "2"],
        ["-r", copy / "checkpoint-latest.params", "--epochs", "2", "--set", "mesh.fsdp=2"],
        env=devices(2),
    )
    assert refused(refusal) == "error: mesh.fsdp 4 does not divide the 2 devices in use; --set mesh.fsdp=2 does"
    assert metrics.read_bytes() == before
    assert resumed.returncode == 0, resumed.stderr  # the setting named works


def test_a_batch_padded_past_the_memory_is_one_line_and_nothing_written(tmp_path, data_dir, capsys, monkeypatch):
    """Issue 58: one padded batch of 1,000,000 rows for 3,000 examples was OOM-killed: the rows one example's bytes
    make are checked against what the host has free (made 100 MiB here) before any batch is read. A small split in
    a larger batch (270 examples in 300) trains, as one padded batch."""
    import train
    from training.devices import memory

    monkeypatch.setattr(memory, "host_available", lambda: (100 * 2**20, "the memory limit (test)"))
    monkeypatch.setattr(train, "setup_logging", lambda *a, **k: None)  # dictConfig would close pytest's handlers
    config = make_config(tmp_path, data_dir, data_loader__train__args__batch_size=1_000_000)
    with pytest.raises(SystemExit) as exit_info:
        train.main(["-c", str(config)])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: config.json: data_loader.train.args.batch_size: 1,000,000 rows of 3.1 KiB take 8.8 GiB with the "
        "batches prefetched, more than the 100.0 MiB of the memory limit (test), for a train split of 270 "
        "examples: at most 270"
    ]
    assert not (tmp_path / "saved").exists()
    padded = make_config(tmp_path, data_dir, data_loader__train__args__batch_size=300, trainer__epochs=1)
    assert train.main(["-c", str(padded)]) == 0


def test_an_mlp_of_100000_layers_is_one_line_and_nothing_written(tmp_path, data_dir, capsys, monkeypatch):
    # issue 58: tracing and compiling 100,000 layers took 2.8 GB in minutes, before any memory figure existed
    config = make_config(tmp_path, data_dir, model__args__hidden=[1] * 100_000)
    line = refused_in_process(["-c", str(config)], capsys, monkeypatch)
    assert line == "error: config.json: model.args.hidden: 100,000 entries, one layer each; at most 1,000"
    assert not (tmp_path / "saved").exists()


def refused(result: subprocess.CompletedProcess) -> str:
    """The one `error:` line of a run refused as bad input (status 2, no traceback)."""
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def test_a_model_with_fewer_outputs_than_the_data_has_classes_is_refused_before_compiling(tmp_path, data_dir):
    """Its loss would be NaN from the first step on; the class count is known from the data before anything compiles:
    the class names, a language model's vocabulary, or else the labels of a batch."""
    saved = {"trainer__save_dir": str(tmp_path / "saved")}  # three configs, one folder each: one process refuses all
    for name in ("classes", "vocabulary", "labels"):
        (tmp_path / name).mkdir()
    classes = make_config(
        tmp_path / "classes", data_dir, model={"name": "mlp", "args": {"hidden": [8], "num_classes": 7}}, **saved
    )
    text = tmp_path / "text.txt"
    text.write_text("".join(chr(33 + i % 40) for i in range(3000)))
    lm = {"name": "char_text", "args": {"path": str(text), "context": 16, "batch_size": 8}}
    vocabulary = make_config(
        tmp_path / "vocabulary",
        data_dir,
        metrics=[],
        model={
            "name": "char_transformer",
            "args": {"vocab_size": 30, "context": 16, "dim": 16, "depth": 1, "num_heads": 2},
        },
        data_loader={
            "train": {**lm, "args": {**lm["args"], "split": "train"}},
            "validation": {**lm, "args": {**lm["args"], "split": "validation"}},
        },
        trainer__monitor="min val/loss",
        **saved,
    )
    labels = np.arange(48) % 4
    np.savez(tmp_path / "xy.npz", x=np.random.default_rng(0).standard_normal((48, 5)).astype(np.float32), y=labels)
    arrays = {"path": str(tmp_path / "xy.npz"), "input": "x", "target": "y", "batch_size": 16}
    labels = make_config(
        tmp_path / "labels",
        data_dir,
        model={"name": "mlp", "args": {"hidden": [8], "num_classes": 3}},
        data_loader={"train": {"name": "arrays", "args": arrays}},
        trainer__monitor="off",
        **saved,
    )
    by_classes, by_vocabulary, by_labels = train_py_in_one_process(["-c", classes], ["-c", vocabulary], ["-c", labels])
    assert refused(by_classes) == (
        "error: config.json: model.args.num_classes: the model gives 7 "
        "outputs per example, but the data has 10 classes; set it to 10"
    )
    assert refused(by_vocabulary) == (
        "error: config.json: model.args.vocab_size: the model gives 30 outputs per position, but the data has 40 "
        "tokens in its vocabulary; set it to 40"
    )
    assert refused(by_labels).endswith(
        "the model gives 3 outputs per example, but the data has 4 classes (a label 3 in its first batch); set it to 4"
    )
    assert not (tmp_path / "saved").exists()


def test_integer_pixels_into_a_float_model_say_how_to_convert_them(tmp_path, data_dir):
    images = np.random.default_rng(0).integers(0, 256, (32, 8, 8, 3), dtype=np.uint8)
    np.savez(tmp_path / "images.npz", x=images, y=np.arange(32) % 10)
    loader = {
        "name": "arrays",
        "args": {"path": str(tmp_path / "images.npz"), "input": "x", "target": "y", "batch_size": 16},
    }
    config = make_config(
        tmp_path,
        data_dir,
        model={"name": "mnist_cnn", "args": {"channels": [4], "hidden": 8}},
        data_loader={"train": loader},
        trainer__monitor="off",
    )
    (tmp_path / "normalized").mkdir()  # the config that trains: its own folder, its own save_dir
    normalized = make_config(
        tmp_path / "normalized",
        data_dir,
        model={"name": "mnist_cnn", "args": {"channels": [4], "hidden": 8}},
        data_loader={"train": {**loader, "augment": [{"name": "normalize"}]}},
        trainer__monitor="off",
        trainer__epochs=1,
    )
    result, trained = train_py_in_one_process(["-c", config], ["-c", normalized, "--run-id", "normalized"])
    line = refused(result)
    assert line.startswith("error: config.json: model: cannot take the data's input uint8[16, 8, 8, 3] (")
    assert line.endswith(
        'integer pixels become float32 with {"name": "normalize"} in data_loader.train.augment (or '
        'the loader\'s "dtype": "float32" where it has one)'
    )
    assert not (tmp_path / "saved").exists()
    assert trained.returncode == 0, trained.stderr


def test_fine_tune_onto_a_new_head_and_test_py_without_monitor(tmp_path, data_dir, one_epoch):
    weights = one_epoch / "model_best.params"  # read only
    bigger = make_config(
        tmp_path,
        data_dir,
        trainer__epochs=1,
        trainer__monitor="off",
        model={"name": "mlp", "args": {"hidden": [32], "num_classes": 12}},
    )
    result, tuned_run = train_py_in_one_process(  # one process: a JAX start fewer
        ["-c", bigger, "--weights", weights, "--run-id", "whole"],
        ["-c", bigger, "--weights", weights, "--exclude", "params.head", "--run-id", "new_head"],
    )
    assert (
        result.returncode == 2 and "params.head.bias: file has float32[10], model expects float32[12]" in result.stderr
    )
    assert not (tmp_path / "saved/tiny/whole").exists()
    result = tuned_run
    assert result.returncode == 0, result.stderr
    assert "kept fresh: params.head" in (tmp_path / "saved/tiny/new_head/train.log").read_text()
    base, _ = params_of(weights)
    # the body starts from the old weights: one epoch of adam at lr 0.003 moves them a little, not to a fresh init
    tuned, _ = params_of(tmp_path / "saved/tiny/new_head/checkpoint-latest.params")
    assert np.abs(tuned["params.fc0.weight"] - base["params.fc0.weight"]).max() < 0.1
    # monitor off: no model_best.params, and test.py falls back to the latest checkpoint
    run_dir = tmp_path / "saved/tiny/new_head"
    assert not (run_dir / "model_best.params").exists()
    tested = run("test.py", "--run", run_dir)
    assert tested.returncode == 0 and "checkpoint-latest.params" in tested.stdout, tested.stderr


def test_test_py_evaluates_the_validation_split_of_a_config_without_a_test_split(tmp_path, data_dir):
    """A language model's config has train and validation splits only: `test.py -r RUN` evaluates the validation
    split and says so (an explicit --split test is still refused, naming the splits there are)."""
    config = make_config(tmp_path, data_dir, trainer__epochs=1, model={"name": "mlp", "args": {"hidden": [8]}})
    content = json.loads(config.read_text())
    del content["data_loader"]["test"]
    config.write_text(json.dumps(content))
    assert run("train.py", "-c", config, "--run-id", "no_test").returncode == 0
    run_dir = tmp_path / "saved/tiny/no_test"
    tested, no_split = train_py_in_one_process(  # test.py twice in one process: a JAX start fewer
        ["--run", run_dir], ["--run", run_dir, "--split", "test"], script="test"
    )
    assert tested.returncode == 0, tested.stderr
    assert "validation split, 60 examples" in tested.stdout and (run_dir / "per_class_validation.csv").is_file()
    assert refused(no_split) == "error: data_loader.test: not in the config; splits: train, validation"


def test_docs_quote_the_unknown_name_error_as_train_py_prints_it(tmp_path, data_dir, capsys, monkeypatch):
    """docs/config.md's example error is what train.py prints, with the list of registered models (which grows with
    every model a forker adds) written as a placeholder."""
    docs = (ROOT / "docs" / "config.md").read_text()
    config = make_config(tmp_path, data_dir, model={"name": "mnist_convnxt"})
    line = refused_in_process(["-c", str(config)], capsys, monkeypatch)
    head, models, tail = re.fullmatch(r"(.*; available: )([\w, ]+)(\. Did you mean .*)", line).groups()
    assert "mnist_convnext" in models.split(", ")
    assert f"\n{head}(every registered model){tail}\n" in docs, line


def test_schedule_lengths_are_the_config_s_in_debug_modes_and_checked_with_the_data(tmp_path, data_dir):
    """A schedule counted in epochs or as "all" keeps the configured run's length when --fast-dev-run shortens the
    loop to one epoch; one that the data makes impossible (a warm-up past the whole run) is one error line."""
    schedule = {
        "name": "warmup_cosine_decay",
        "args": {"init_value": 0.0, "peak_value": 0.003, "warmup_steps": {"epochs": 2}, "decay_steps": "all"},
    }
    config = make_config(tmp_path, data_dir, trainer__epochs=3, optimizer__args={}, optimizer__schedule=schedule)
    schedule["args"]["warmup_steps"] = 100  # 2 epochs of 9 steps: "all" is 18
    (tmp_path / "long").mkdir()
    long = make_config(
        tmp_path / "long",
        data_dir,
        trainer__epochs=2,
        optimizer__args={},
        optimizer__schedule=schedule,
        trainer__save_dir=str(tmp_path / "saved"),
    )
    fast, long_warmup = train_py_in_one_process(
        ["-c", config, "--fast-dev-run"], ["-c", long, "--run-id", "long_warmup"]
    )
    assert fast.returncode == 0, fast.stderr
    assert refused(long_warmup) == (
        'error: config.json: optimizer.schedule: warmup_cosine_decay: decay_steps "all" (18 steps, the whole 2-epoch '
        "run) must exceed warmup_steps 100, which it counts"
    )
    assert not (tmp_path / "saved/tiny/long_warmup").exists()


@pytest.mark.slow
def test_fine_tuning_with_a_frozen_backbone(tmp_path, data_dir):
    """--weights from another run with optimizer.frozen: the frozen layer keeps the loaded weights bit for bit
    (AdamW's weight decay included), the head trains, and the summary counts both."""
    (tmp_path / "base").mkdir()  # its config in a folder of its own, its run beside the tuned one
    first = make_config(tmp_path / "base", data_dir, trainer__epochs=1, trainer__save_dir=str(tmp_path / "saved"))
    base = tmp_path / "saved/tiny/base/checkpoint-latest.params"
    optimizer = {"name": "adamw", "args": {"lr": 0.01, "weight_decay": 0.1}, "frozen": ["params.fc0"]}
    config = make_config(tmp_path, data_dir, optimizer=optimizer, trainer__epochs=1)
    trained, tuned = train_py_in_one_process(  # one after the other in one process: a JAX start fewer
        ["-c", first, "--run-id", "base"],
        ["-c", config, "--run-id", "tuned", "--weights", base, "--exclude", "params.head"],
    )
    assert trained.returncode == 0, trained.stderr
    assert tuned.returncode == 0, tuned.stderr
    before, _ = params_of(base)
    after, _ = params_of(tmp_path / "saved/tiny/tuned/checkpoint-latest.params")
    for key in ("params.fc0.weight", "params.fc0.bias"):
        assert after[key].tobytes() == before[key].tobytes(), key
    assert not np.array_equal(after["params.head.weight"], before["params.head.weight"])
    assert not any(key.startswith("opt_state") and after[key].shape == (784, 32) for key in after)  # no moments
    assert (
        "total parameters: 25,450 (0.10 MB); trainable 330, frozen 25,120"
        in (tmp_path / "saved/tiny/tuned/train.log").read_text()
    )
