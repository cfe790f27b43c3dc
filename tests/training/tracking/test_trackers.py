"""Trackers for real: `train.py` runs with wandb (offline) and TensorBoard on tiny generated data, and the files they
write are read back with readers of their own (the wandb run log parsed record by record, the event files' TFRecord
framing read and checksummed here) and compared with `metrics.jsonl` and `train.log`. Nothing contacts the network."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import struct
from pathlib import Path

import numpy as np
import pytest

from tests.end_to_end.test_train import ROOT, data_dir, make_config, run  # noqa: F401  (data_dir is a fixture)
from training.config.file import read_config_file
from training.run.figures import plots
from training.tracking.trackers import flatten, scalars

OFFLINE = {"enabled": True, "project": "tiny-tests", "mode": "offline", "tags": ["e2e"]}


@pytest.fixture
def no_network(tmp_path, monkeypatch):
    """wandb settings that cannot reach a server: no API key, no user settings, an unroutable base URL."""
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_DIR", "WANDB_ENTITY", "WANDB_PROJECT", "WANDB_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    # matplotlib keeps its font cache under the real home: a fresh one would be rebuilt in every run
    fonts = os.environ.get("MPLCONFIGDIR", str(Path.home() / ".cache" / "matplotlib"))
    return {
        "HOME": str(home),
        "WANDB_CONFIG_DIR": str(home / "wandb-config"),
        "WANDB_CACHE_DIR": str(home / "cache"),
        "WANDB_DATA_DIR": str(home / "data"),
        "WANDB_BASE_URL": "http://127.0.0.1:9",
        "WANDB_SILENT": "true",
        "MPLCONFIGDIR": fonts,
    }


# ------------------------------------------------------------------------------------------------- readers
def wandb_records(path: Path):
    """The protobuf records of a `.wandb` run log: a 7-byte header, then LevelDB-log framing (32 KiB blocks; records
    of 7-byte headers: crc, length, type FULL/FIRST/MIDDLE/LAST)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:  # block trailer
            pos += left
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST: a whole record
            yield wandb_internal_pb2.Record.FromString(pending)
            pending = b""


def items(entries) -> dict:
    return {e.key or "/".join(e.nested_key): json.loads(e.value_json) for e in entries}


def read_wandb_run(folder: Path) -> dict:
    (log_file,) = folder.glob("run-*.wandb")
    out = {"history": [], "summary": {}, "config": {}, "types": set()}
    for record in wandb_records(log_file):
        kind = record.WhichOneof("record_type")
        out["types"].add(kind)
        if kind == "run":
            out["run_id"], out["project"] = record.run.run_id, record.run.project
            out["tags"] = list(record.run.tags)
            out["config"].update(items(record.run.config.update))
        elif kind == "config":
            out["config"].update(items(record.config.update))
        elif kind == "history":
            out["history"].append(items(record.history.item))
        elif kind == "summary":
            out["summary"].update(items(record.summary.update))
    return out


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), bit by bit: the checksum TFRecord framing uses."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def tfrecords(path: Path) -> list[bytes]:
    """The records of a TFRecord file, each as [length u64][masked CRC of the length][data][masked CRC of the data];
    a checksum that does not match fails the test."""
    masked = lambda data: ((((c := crc32c(data)) >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF  # noqa: E731
    records, blob, at = [], path.read_bytes(), 0
    while at < len(blob):
        length, length_crc = struct.unpack_from("<QI", blob, at)
        data = blob[at + 12 : at + 12 + length]
        (data_crc,) = struct.unpack_from("<I", blob, at + 12 + length)
        assert length_crc == masked(blob[at : at + 8]) and data_crc == masked(data), f"{path.name}: bad record at {at}"
        records.append(data)
        at += 16 + length
    return records


def read_events(folder: Path) -> dict:
    """{tag: [(step, value), ...]} and the hparams plugin tags of every event file in `folder`: the TFRecord framing
    read and checksummed here, each record an Event protocol buffer (TensorBoard's schema, as tensorboardX ships it)."""
    from tensorboardX.proto import event_pb2

    values, plugin_tags = {}, {}
    for path in sorted(folder.glob("events.out.tfevents.*")):
        for raw in tfrecords(path):
            event = event_pb2.Event.FromString(raw)
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name == "hparams":
                    plugin_tags[value.tag] = value.metadata.plugin_data.content
                else:
                    values.setdefault(value.tag, []).append((event.step, value.simple_value))
    return {"scalars": values, "hparams": plugin_tags}


def step_losses(train_log: Path) -> dict[int, float]:
    pattern = re.compile(r"step (\d+): loss ([0-9.]+)")
    return {int(m[1]): float(m[2]) for m in map(pattern.search, train_log.read_text().splitlines()) if m}


# ----------------------------------------------------------------------------------------------- end to end
def check_wandb_run(run: dict, rows: list[dict], losses: dict[int, float], log_every: int, after_step: int) -> None:
    """The flattened config, a step entry every `log_every` steps after `after_step`, and every epoch's row."""
    assert run["config"]["optimizer.args.lr"] == 0.003 and run["config"]["trainer.log_every"] == log_every
    assert run["config"]["model.args.hidden.0"] == 32 and run["config"]["data_loader.train.args.batch_size"] == 32
    assert "exit" in run["types"]  # finished, not killed
    by_step = {}
    for entry in run["history"]:
        by_step.setdefault(entry["_step"], {}).update(entry)
    expected_steps = [s for s in range(after_step + 1, rows[-1]["step"] + 1) if s % log_every == 0]
    logged = sorted(s for s, e in by_step.items() if "train/step_loss" in e)
    assert logged == expected_steps
    for step in expected_steps:
        entry = by_step[step]
        assert entry["train/step_loss"] == pytest.approx(losses[step], abs=1e-6)
        assert entry["train/lr"] == pytest.approx(0.003) and np.isfinite(entry["train/grad_norm"])
    assert any(isinstance(v, list) for v in rows[0].values())  # per-class vectors are checked below
    for row in rows:  # each epoch's row, at the step that ends the epoch
        entry = by_step[row["step"]]
        for key, value in row.items():
            if key == "step" or isinstance(value, str):  # trackers take numbers ("unknown" MFU stays in the row)
                continue
            if isinstance(value, list):
                assert [entry[f"{key}/{i}"] for i in range(len(value))] == pytest.approx(value)
            else:
                assert entry[key] == pytest.approx(value), key


def check_events(events: dict, rows: list[dict], losses: dict[int, float], log_every: int) -> None:
    scalars_ = events["scalars"]
    steps = [s for s, _ in scalars_["train/step_loss"]]
    assert steps == [s for s in range(1, rows[-1]["step"] + 1) if s % log_every == 0]
    np.testing.assert_allclose([v for _, v in scalars_["train/step_loss"]], [losses[s] for s in steps], atol=1e-5)
    for key in ("train/loss", "train/accuracy", "val/loss", "val/accuracy", "val/f1", "time/examples_per_s", "lr"):
        assert [s for s, _ in scalars_[key]] == [r["step"] for r in rows], key
        np.testing.assert_allclose([v for _, v in scalars_[key]], [r[key] for r in rows], rtol=1e-6, err_msg=key)
    for c in range(10):  # a per-class vector: one scalar per class
        np.testing.assert_allclose(
            [v for _, v in scalars_[f"val/recall_per_class/{c}"]],
            [r["val/recall_per_class"][c] for r in rows],
            rtol=1e-6,
        )
    assert {"_hparams_/experiment", "_hparams_/session_start_info", "_hparams_/session_end_info"} <= set(
        events["hparams"]
    )
    assert b"optimizer.args.lr" in events["hparams"]["_hparams_/session_start_info"]
    assert b"val/accuracy" in events["hparams"]["_hparams_/experiment"]


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def load_test_script():
    """test.py as a module, loaded by path: "test" is also the name of a standard-library package."""
    spec = importlib.util.spec_from_file_location("test_script", ROOT / "test.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_wandb_offline_tensorboard_curves_and_resume(tmp_path, data_dir, no_network, capsys):  # noqa: F811
    wandb_dir = tmp_path / "wandb-files"
    env = {**no_network, "WANDB_MODE": "offline", "WANDB_DIR": str(wandb_dir)}
    log_every = 4
    metrics = [{"name": "accuracy"}, {"name": "f1"}, {"name": "recall", "args": {"average": "none"}}]
    config = make_config(
        tmp_path, data_dir, trainer__log_every=log_every, wandb=OFFLINE, tensorboard={"enabled": True}, metrics=metrics
    )
    result = run("train.py", "-c", config, env=env)
    assert result.returncode == 0, result.stderr

    # The run folder is named after the wandb run, whose id the folder's config keeps for resuming.
    (run_dir,) = (tmp_path / "saved" / "tiny").iterdir()
    run_id = read_config_file(run_dir / "config.json")["wandb"]["id"]
    assert re.fullmatch(r"\d{8}_\d{6}_[a-z0-9]{8}", run_dir.name) and run_dir.name.endswith(run_id)
    assert "total parameters: 25,450" in result.stdout and "devices: " in result.stdout  # the model summary

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = step_losses(run_dir / "train.log")
    (offline_run,) = (wandb_dir / "wandb").glob(f"offline-run-*-{run_id}")
    wandb_run = read_wandb_run(offline_run)
    assert wandb_run["run_id"] == run_id and wandb_run["project"] == "tiny-tests" and wandb_run["tags"] == ["e2e"]
    check_wandb_run(wandb_run, rows, losses, log_every, after_step=0)
    assert wandb_run["summary"]["best/val/accuracy"] == pytest.approx(max(r["val/accuracy"] for r in rows))
    check_events(read_events(run_dir / "tensorboard"), rows, losses, log_every)
    if plots() is not None:  # training/plots/ draws them
        assert png_size(run_dir / "curves.png") == (1200, 600)  # loss, accuracy, f1, lr: 3 columns x 2 rows

    # test.py (its main, in this process): the confusion matrix image and the per-class table by the checkpoint.
    assert load_test_script().main(["--run", str(run_dir)]) == 0
    printed = capsys.readouterr().out
    assert plots() is None or png_size(run_dir / "confusion_matrix.png")[0] >= 400
    table = np.genfromtxt(run_dir / "per_class.csv", delimiter=",", names=True)
    assert table["support"].sum() == 90 and list(table["class"]) == list(range(10))
    accuracy = float(re.search(r"accuracy\s+([0-9.]+)", printed)[1])
    assert (table["recall"] * table["support"]).sum() / 90 == pytest.approx(accuracy, abs=1e-4)

    # Resuming continues the same folder and the same wandb run.
    resumed = run("train.py", "-r", run_dir / "checkpoint-latest.params", "--epochs", "3", env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert [p.name for p in (tmp_path / "saved" / "tiny").iterdir()] == [run_dir.name]
    offline_runs = sorted((wandb_dir / "wandb").glob(f"offline-run-*-{run_id}"))
    assert len(offline_runs) == 2
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    second = read_wandb_run(offline_runs[1] if offline_runs[0] == offline_run else offline_runs[0])
    assert second["run_id"] == run_id
    check_wandb_run(second, rows[2:], step_losses(run_dir / "train.log"), log_every, after_step=rows[1]["step"])
    assert len(list((run_dir / "tensorboard").glob("events.out.tfevents.*"))) == 2


def test_wandb_that_cannot_start_is_a_warning_and_the_profile_trace(tmp_path, data_dir, no_network):  # noqa: F811
    # online without an API key: wandb.init refuses at once, before any connection
    config = make_config(
        tmp_path,
        data_dir,
        trainer__epochs=1,
        wandb={"enabled": True, "mode": "online"},
        trainer__profile={"start_step": 2, "num_steps": 3},
    )
    result = run("train.py", "-c", config, "--run-id", "offline", env=no_network)
    assert result.returncode == 0, result.stderr
    assert "wandb: could not start" in result.stdout and "training goes on without wandb" in result.stdout
    run_dir = tmp_path / "saved" / "tiny" / "offline"
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 1
    assert plots() is None or (run_dir / "curves.png").is_file()
    assert "profile of steps 2..4 written" in result.stdout
    import gzip

    (trace,) = (run_dir / "profile").glob("plugins/profile/*/perfetto_trace.json.gz")
    events = json.loads(gzip.decompress(trace.read_bytes()))
    events = events["traceEvents"] if isinstance(events, dict) else events
    calls = {e.get("ts") for e in events if e.get("name") == "PjitFunction(jit(train_call))"}
    assert calls  # the traced window holds the training step's executions


# ---------------------------------------------------------------------------------------------------- units
def test_the_event_files_checksum_is_crc32c():
    assert crc32c(b"123456789") == 0xE3069283  # the check value of CRC-32C (RFC 3720)


def test_scalars_flatten_vectors_and_skip_matrices():
    row = {
        "epoch": 2,
        "step": 18,
        "train/loss": 0.5,
        "val/f1": [0.25, 1.0],
        "val/confusion_matrix": [[1, 0], [0, 1]],
        "flag": True,
        "name": "x",
    }
    assert scalars(row) == {"epoch": 2.0, "train/loss": 0.5, "val/f1/0": 0.25, "val/f1/1": 1.0}
    assert "epoch" not in scalars(row, skip=("step", "epoch"))


def test_flatten_round_trips_nested_config():
    config = {"a": {"b": 1, "c": [{"d": "x"}, 2], "e": []}, "f": None, "g": {}}
    flat = flatten(config)
    assert flat == {"a.b": 1, "a.c.0.d": "x", "a.c.1": 2, "a.e": [], "f": None, "g": {}}

    rebuilt: dict = {}
    for dotted, value in flat.items():  # the inverse, written independently: digits index lists
        *parents, last = dotted.split(".")
        node = rebuilt
        for part, _following in zip(parents, parents[1:] + [last]):
            node = node.setdefault(part, {})
        node[last] = value
    listify = lambda n: (
        (
            [listify(n[k]) for k in sorted(n, key=int)]
            if n and all(k.isdigit() for k in n)
            else {k: listify(v) for k, v in n.items()}
        )
        if isinstance(n, dict) and n
        else n
    )
    assert listify(rebuilt) == config
