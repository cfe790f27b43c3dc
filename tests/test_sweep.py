"""Sweeps: argument checks, deterministic draws, the ledger, pruning; and real sweeps of train.py processes on tiny
generated IDX data that are killed and restarted, have failing trials, prune, and reproduce their best trial."""

from __future__ import annotations

import csv
import fcntl
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import sweep
from tests.conftest import make_idx_dataset
from tests.test_train import ROOT, make_config, run
from training.sweep_samplers import OptunaSampler, RandomSampler
from training.sweep_space import parse_grid, parse_sample
from training.sweeps import Ledger, MedianPruner, trials_of


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """Enough examples that an epoch outlasts the sweep's polling (a trial can be pruned or stopped mid-run)."""
    folder = tmp_path_factory.mktemp("data") / "mnist"
    make_idx_dataset(folder, n_train=1000, n_test=90)
    return folder


def sweep_folder(tmp_path: Path, name: str = "tiny") -> Path:
    found = list((tmp_path / "saved" / name).glob("sweep-*"))
    assert len(found) == 1, found
    return found[0]


def ledger_of(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "ledger.jsonl").read_text().splitlines()]


def rows_of(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--grid", "optimizer.args.lr=0.1"], "--grid optimizer.args.lr=0.1: expected KEY.PATH=[v1, v2, ...]"),
        (["--grid", "optimizer.args.lr=[]"], "a non-empty JSON list"),
        (["--grid", "=[1]"], "--grid =[1]: expected KEY.PATH="),
        (["--sample", "optimizer.args.lr=normal:0:1"], "unknown distribution 'normal'; expected uniform:LOW:HIGH"),
        (["--sample", "optimizer.args.lr=loguniform:0:1"], "loguniform needs 0 < LOW"),
        (["--sample", "optimizer.args.lr=uniform:1"], "expected uniform:LOW:HIGH with two numbers"),
        (["--sample", "model.args.hidden.0=int:8:x"], "expected int:LOW:HIGH with two integers"),
        (
            ["--grid", "optimizer.schedule.args.peak_value=[0.1]"],
            "optimizer.schedule.args.peak_value: no such key in config.json (optimizer has no 'schedule')",
        ),
        (["--grid", "trainer.epochz=[1]"], "no such key in config.json (trainer has no 'epochz')"),
        (
            ["--grid", "optimizer.args.lrr=[0.1]"],
            "--grid optimizer.args.lrr=0.1: config.json: optimizer.args.lrr: unknown argument",
        ),
        (
            ["--grid", "optimizer.args.lr=[0.01,-1]"],
            "--grid optimizer.args.lr=-1: config.json: optimizer.args.lr: must be >= 0.0",
        ),
        (["--grid", "optimizer.args.lr=[0.1]", "--set", "optimizer.args.lr=0.2"], "already given by --set"),
        (["--grid", 'name=["a","b"]'], "--grid name: the sweep names each trial's folder"),
        (["--grid", "optimizer.args.lr=[0.1]", "--prune", "mean"], "--prune mean: expected median[:WARMUP_EPOCHS"),
        (["--grid", "optimizer.args.lr=[0.1]", "--trials", "2"], "the grid has 1 point; add --sample"),
        (["--grid", "optimizer.args.lr=[0.1]", "--sampler", "grid"], "--sampler grid: expected random or optuna:tpe"),
        (["--grid", "optimizer.args.lr=[0.1]", "--parallel", "0"], "--parallel 0: expected at least 1"),
        (["--grid", "optimizer.args.lr=[0.1]", "--set", "trainer.monitor=off"], "trainer.monitor is off"),
        ([], "nothing to sweep"),
    ],
)
def test_bad_arguments_are_one_error_line_before_any_trial(tmp_path, data_dir, capsys, args, message):
    config = make_config(tmp_path, data_dir)
    with pytest.raises(SystemExit) as exit:
        sweep.main(["-c", str(config), *args])
    assert exit.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert not (tmp_path / "saved").exists()


def test_draws_depend_on_the_seed_and_the_trial_only():
    params = [
        parse_grid("optimizer.args.weight_decay=[0,0.05]"),
        parse_sample("optimizer.schedule.args.peak_value=loguniform:1e-4:1e-2"),
        parse_sample("model.args.hidden.0=int:8:64"),
        parse_sample("model.args.dropout=choice:[0.0,0.1]"),
    ]
    first = [RandomSampler(params, seed=3).params(i) for i in range(20)]
    again = RandomSampler(params, seed=3)
    assert [again.params(i) for i in reversed(range(20))][::-1] == first  # no trial's draw depends on another's
    assert first != [RandomSampler(params, seed=4).params(i) for i in range(20)]
    assert [p["optimizer.args.weight_decay"] for p in first[:4]] == [0, 0.05, 0, 0.05]
    lrs = [p["optimizer.schedule.args.peak_value"] for p in first]
    assert all(1e-4 <= lr <= 1e-2 for lr in lrs) and min(lrs) < 1e-3 < max(lrs)
    assert all(isinstance(p["model.args.hidden.0"], int) and 8 <= p["model.args.hidden.0"] <= 64 for p in first)
    assert {p["model.args.dropout"] for p in first} == {0.0, 0.1}
    grid = [parse_grid("a.b=[1,2]"), parse_grid('c.d=["x","y","z"]')]
    assert [tuple(RandomSampler(grid, 0).params(i).values()) for i in range(6)] == [
        (1, "x"),
        (1, "y"),
        (1, "z"),
        (2, "x"),
        (2, "y"),
        (2, "z"),
    ]


def test_ledger_appends_whole_lines_and_drops_one_cut_short(tmp_path):
    path = tmp_path / "ledger.jsonl"
    ledger = Ledger(path)
    ledger.append({"event": "start", "trial": 0, "params": {"x": 1}, "run": "trial-000"})
    ledger.append({"event": "end", "trial": 0, "status": "done", "value": 0.5, "epoch": 2, "curve": [0.4, 0.5]})
    with open(path, "a") as f:
        f.write('{"event": "start", "trial": 1, "par')  # a crash in the middle of a write
    ledger = Ledger(path)
    ledger.append({"event": "start", "trial": 1, "params": {"x": 2}, "run": "trial-001"})
    trials = trials_of(ledger.records())
    assert trials[0].status == "done" and trials[0].value == 0.5 and trials[0].curve == (0.4, 0.5)
    assert trials[1].status == "running" and trials[1].params == {"x": 2}


def test_median_pruner():
    pruner = MedianPruner(warmup=1, min_trials=2)
    assert pruner.check(1, 0.1, [0.9, 0.8], "max") is None  # warm-up
    assert pruner.check(2, 0.1, [0.9], "max") is None  # too few earlier trials
    assert pruner.check(2, 0.1, [0.9, 0.8, 0.2], "max") == 0.8
    assert pruner.check(2, 0.85, [0.9, 0.8, 0.2], "max") is None
    assert pruner.check(2, 1.5, [1.0, 1.2], "min") == 1.1 and pruner.check(2, 1.0, [1.0, 1.2], "min") is None
    assert pruner.check(2, None, [1.0, 1.2], "min") == 1.1  # a NaN epoch loses


def test_optuna_sampler_draws_in_range_and_learns_from_the_ledger():
    pytest.importorskip("optuna", reason="optuna is optional (--sampler optuna:tpe); not installed here")
    params = [parse_grid("model.args.hidden=[[16],[32]]"), parse_sample("optimizer.args.lr=loguniform:1e-4:1e-1")]
    sampler = OptunaSampler("tpe", params, seed=0, mode="max")
    sampler.tell(0, {"model.args.hidden": [16], "optimizer.args.lr": 0.01}, "done", 0.9)  # recorded before a restart
    sampler.tell(1, {"model.args.hidden": [32], "optimizer.args.lr": 0.05}, "failed", None)
    drawn = sampler.params(2)
    assert drawn["model.args.hidden"] in ([16], [32]) and 1e-4 <= drawn["optimizer.args.lr"] <= 1e-1
    sampler.tell(2, drawn, "done", 0.5)
    assert len(sampler.study.trials) == 3


def start_sweep(*args) -> subprocess.Popen:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.Popen(
        [sys.executable, "sweep.py", *map(str, args)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def wait_for(condition, what: str, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def released(lock: Path) -> bool:
    """True once no process holds the run folder (train.py's lock goes when it exits)."""
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


@pytest.mark.slow
def test_a_killed_sweep_continues_without_rerunning_finished_trials(tmp_path, data_dir):
    config = make_config(tmp_path, data_dir, trainer__epochs=10)
    args = ["-c", config, "--grid", "optimizer.args.lr=[0.003,0.01]"]
    process = start_sweep(*args)
    try:
        wait_for(
            lambda: list((tmp_path / "saved" / "tiny").glob("sweep-*/trial-001/checkpoint-latest.params")),
            "the second trial's first epoch",
        )
    finally:
        process.kill()  # no handler runs: the trial learns of it from the kernel (parent-death signal)
        output = process.communicate()[0]
    folder = sweep_folder(tmp_path)
    assert [r["status"] for r in ledger_of(folder) if r["event"] == "end"] == ["done"], output
    wait_for(lambda: released(folder / "trial-001" / ".lock"), "the orphaned trial to save and exit", timeout=60)
    first = {p.name: p.stat().st_mtime_ns for p in (folder / "trial-000").iterdir()}
    stopped_at = len(rows_of(folder / "trial-001"))
    assert 1 <= stopped_at < 10

    result = run("sweep.py", *args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 of 2 trials already ended" in result.stdout and "trial 1: resumed" in result.stdout
    assert "trial 0: started" not in result.stdout
    assert {p.name: p.stat().st_mtime_ns for p in (folder / "trial-000").iterdir()} == first
    records = ledger_of(folder)
    assert [(r["trial"], r["resume"]) for r in records if r["event"] == "start"] == [(0, False), (1, False), (1, True)]
    assert [(r["trial"], r["status"]) for r in records if r["event"] == "end"] == [(0, "done"), (1, "done")]
    assert [r["epoch"] for r in rows_of(folder / "trial-001")] == list(range(1, 11))
    assert "resumed from" in (folder / "trial-001" / "train.log").read_text()
    with open(folder / "results.csv") as f:
        assert [row["status"] for row in csv.DictReader(f)] == ["done", "done"]

    again = run("sweep.py", *args)  # a finished sweep only reports
    assert again.returncode == 0 and "started" not in again.stdout and "resumed" not in again.stdout
    assert len(ledger_of(folder)) == len(records)


@pytest.mark.slow
def test_failed_trials_are_recorded_and_the_best_config_reproduces_its_trial(tmp_path, data_dir):
    config = make_config(tmp_path, data_dir)
    # lr 1e30 diverges before its first checkpoint (exit 2, its folder removed); b1 2 passes the config's checks
    # but not the optimizer's (exit 2)
    args = [
        "-c",
        config,
        "--grid",
        "optimizer.args.lr=[1e30,0.003]",
        "--grid",
        "optimizer.args.b1=[0.9,2.0]",
        "--trials",
        3,
    ]
    result = run("sweep.py", *args)
    assert result.returncode == 0, result.stdout + result.stderr
    folder = sweep_folder(tmp_path)
    ends = {r["trial"]: r for r in ledger_of(folder) if r["event"] == "end"}
    assert [ends[i]["status"] for i in range(3)] == ["failed", "failed", "done"]
    assert ends[0]["exit"] == 2 and "non-finite loss" in ends[0]["error"]
    assert ends[1]["exit"] == 2 and ends[1]["error"].startswith("error: ") and "optimizer.args.b1" in ends[1]["error"]
    assert "failed:" in result.stdout  # the table lists each failed trial's error
    with open(folder / "results.csv") as f:
        table = list(csv.DictReader(f))
    assert [row["trial"] for row in table] == ["2", "0", "1"]
    assert float(table[0]["val/accuracy"]) == pytest.approx(ends[2]["value"])

    best = json.loads((folder / "best" / "config.json").read_text())
    assert best["name"] == "tiny" and best["optimizer"]["args"] == {"lr": 0.003, "b1": 0.9} and best["seed"] == 1
    rerun = run("train.py", "-c", folder / "best" / "config.json", "--run-id", "again")
    assert rerun.returncode == 0, rerun.stderr
    strip = lambda row: {k: v for k, v in row.items() if not k.startswith("time/")}
    assert strip(rows_of(tmp_path / "saved" / "tiny" / "again")[-1]) == strip(rows_of(folder / "trial-002")[-1])

    kept = run("sweep.py", *args)
    assert "2 failed, --retry-failed reruns them" in kept.stdout and "started" not in kept.stdout
    retried = run("sweep.py", *args, "--retry-failed")
    assert retried.returncode == 0 and "trial 0: resumed" in retried.stdout and "trial 2:" not in retried.stdout
    ends = [r for r in ledger_of(folder) if r["event"] == "end"]
    assert [(r["trial"], r["status"]) for r in ends[3:]] == [(0, "failed"), (1, "failed")]


@pytest.mark.slow
def test_median_pruning_stops_a_clearly_bad_trial(tmp_path, data_dir):
    # epochs enough that the bad trial is still running when the sweep reads its first epoch (a tiny epoch takes
    # tens of milliseconds once the step is in the compilation cache; the sweep looks every 0.25 s)
    config = make_config(tmp_path, data_dir, trainer__epochs=60)
    result = run(
        "sweep.py",
        "-c",
        config,
        "--grid",
        "optimizer.args.lr=[0.003,0.01,0]",
        "--prune",
        "median",
        "--set",
        "name=pruned",
    )  # a --set of the name moves the sweep, not its trials out of it
    assert result.returncode == 0, result.stdout + result.stderr
    folder = sweep_folder(tmp_path, "pruned")
    ends = {r["trial"]: r for r in ledger_of(folder) if r["event"] == "end"}
    assert [ends[i]["status"] for i in range(3)] == ["done", "done", "pruned"]
    assert ends[2]["epoch"] == 1 and ends[2]["value"] < ends[2]["median"]
    assert len(rows_of(folder / "trial-002")) < 60
    assert "stopped by SIGTERM" in (folder / "trial-002" / "train.log").read_text()
    assert "below the median" in result.stdout
    assert all(math.isfinite(ends[i]["value"]) for i in range(3))
    for name in ("results.csv", "curves.png", "sweep.png", "param_optimizer.args.lr.png", "best/config.json"):
        assert (folder / name).is_file(), name
