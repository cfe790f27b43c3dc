"""Sweeps on Optuna: argument checks, and real sweeps of train.py processes on tiny generated IDX data, with two
workers on one journal file or one PostgreSQL server, a worker killed mid-trial, pruning and failing trials."""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna
import pytest

import sweep
from tests.conftest import make_idx_dataset
from tests.end_to_end.test_train import ROOT, make_config, run


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """Enough examples that an epoch outlasts the worker's polling (a trial can be pruned or killed mid-run)."""
    folder = tmp_path_factory.mktemp("data") / "mnist"
    make_idx_dataset(folder, n_train=1000, n_test=90)
    return folder


def sweep_folder(tmp_path: Path, name: str = "tiny") -> Path:
    found = list((tmp_path / "saved" / name).glob("sweep-*"))
    assert len(found) == 1, found
    return found[0]


def rows_of(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def strip(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith("time/")}


def start_sweep(*args) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "sweep.py", *map(str, args)],
        cwd=ROOT,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
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


@pytest.mark.parametrize(
    "args, message",
    [
        (["--grid", "optimizer.args.lr=0.1"], "--grid optimizer.args.lr=0.1: expected KEY.PATH=[v1, v2, ...]"),
        (["--grid", "optimizer.args.lr=[]"], "a non-empty JSON list"),
        (["--grid", "optimizer.args.lr=" + "[" * 100_000 + "]" * 100_000], "a non-empty JSON list"),
        (["--sample", "optimizer.args.lr=normal:0:1"], "unknown distribution 'normal'; expected uniform:LOW:HIGH"),
        (["--sample", "optimizer.args.lr=loguniform:0:1"], "loguniform needs 0 < LOW"),
        (["--sample", "model.args.hidden.0=int:8:x"], "expected int:LOW:HIGH with two integers"),
        (["--grid", "trainer.epochz=[1]"], "no such key in config.json (trainer has no 'epochz')"),
        (["--grid", "optimizer.args.lr=[0.01,-1]"], "--grid optimizer.args.lr=-1: config.json: optimizer.args.lr"),
        (["--grid", "optimizer.args.lr=[0.1]", "--set", "optimizer.args.lr=0.2"], "already given by --set"),
        (["--grid", 'name=["a","b"]'], "--grid name: the sweep names each trial's folder"),
        (["--grid", "optimizer.args.lr=[0.1]", "--prune", "mean"], "--prune mean: expected median[:WARMUP"),
        (["--grid", "optimizer.args.lr=[0.1]", "--prune", "percentile:100"], "--prune percentile:100: expected"),
        (["--grid", "optimizer.args.lr=[0.1]", "--trials", "2"], "the grid has 1 point; add --sample"),
        (["--grid", "optimizer.args.lr=[0.1]", "--sampler", "anneal"], "--sampler anneal: expected one of grid"),
        (["--sample", "optimizer.args.lr=uniform:0:1", "--sampler", "grid"], "--sampler grid: every swept value"),
        (["--grid", "optimizer.args.lr=[0.1]", "--parallel", "0"], "--parallel 0: expected at least 1"),
        (["--grid", "optimizer.args.lr=[0.1]", "--parallel", "100000"], "--parallel 100000: this machine runs at most"),
        (["--grid", "optimizer.args.lr=[0.1]", "--set", "trainer.monitor=off"], "trainer.monitor is off"),
        (
            ["--grid", "optimizer.args.lr=[0.1]", "--storage", "sweeps.db"],
            "--storage sweeps.db: expected a database URL",
        ),
        (["--grid", "optimizer.args.lr=[0.1]", "--storage", "nosuch://x"], "--storage nosuch://x: "),
        (["--grid", "optimizer.args.lr=[0.1]", "--study", "a/b"], "--study 'a/b': expected letters"),
        (["--grid", "optimizer.args.lr=[0.1]", "--seed", "-1"], "--seed -1: expected 0 to 4294967295"),
        (["--grid", "optimizer.args.lr=[0.1]", "--seed", str(2**64)], f"--seed {2**64}: expected 0 to 4294967295"),
        (["--sample", "optimizer.args.lr=uniform:0:1", "--seed", str(2**32)], f"--seed {2**32}: expected 0 to"),
        (["--grid", "optimizer.args.lr=[0.1]", "--database-wait", "-1"], "--database-wait -1: expected 0 to 86400"),
        ([], "nothing to sweep"),
    ],
)
def test_bad_arguments_are_one_error_line_before_anything_is_written(tmp_path, data_dir, capsys, args, message):
    config = make_config(tmp_path, data_dir)
    with pytest.raises(SystemExit) as exit:
        sweep.main(["-c", str(config), *args])
    assert exit.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]


def assert_once_each(folder: Path, trials: int, epochs: int, study: optuna.Study) -> None:
    """Exactly `trials` trial folders, each trained once through its epochs, and as many finished trials."""
    assert sorted(p.name for p in folder.glob("trial-*")) == [f"trial-{i:03d}" for i in range(trials)]
    for run_dir in folder.glob("trial-*"):
        assert [r["epoch"] for r in rows_of(run_dir)] == list(range(1, epochs + 1)), run_dir
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) == trials and len({t.number for t in done}) == trials
    with open(folder / "results.csv") as f:
        assert sorted(int(row["trial"]) for row in csv.DictReader(f) if row["status"] == "done") == list(range(trials))


def two_workers(config: Path, *extra) -> list[str]:
    # heartbeats every 3 s, not 10: the worker whose trials end first looks again after a heartbeat's time for the
    # other's last trial (a trial is failed as lost only after three missed ones, 9 s)
    args = ["-c", config, "--sample", "optimizer.args.lr=loguniform:1e-3:1e-2", "--sampler", "random", "--trials", 4]
    args += ["--heartbeat", 3]
    workers = [start_sweep(*args, *extra, "--seed", seed) for seed in (1, 2)]
    outputs = [w.communicate(timeout=300)[0] for w in workers]
    assert [w.returncode for w in workers] == [0, 0], outputs
    started = sorted(line.split(":")[0] for out in outputs for line in out.splitlines() if ": started " in line)
    assert started == [f"trial-{i:03d}" for i in range(4)], outputs  # each trial started by one worker, once
    return outputs


@pytest.mark.slow
def test_two_workers_on_one_journal_file_run_each_trial_once(tmp_path, data_dir):
    config = make_config(tmp_path, data_dir, trainer__epochs=1)
    outputs = two_workers(config, "--study", "shared")
    folder = tmp_path / "saved" / "tiny" / "sweep-shared"
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(folder / "journal.log")))
    assert_once_each(folder, 4, 1, optuna.load_study(study_name="shared", storage=storage))
    assert (folder / "best" / "config.json").is_file() and (folder / "curves.png").is_file()
    said = f"; reproduce it with python train.py -c {folder / 'best' / 'config.json'}"
    assert all(said in out for out in outputs), outputs  # each worker ends with the study's best trial


@pytest.fixture(scope="module")
def postgres(postgres_server):
    return postgres_server[0]


@pytest.fixture(scope="module")
def postgres_server():
    """A real PostgreSQL server for the module: initdb in a temporary folder, as the postgres user when we are root
    (initdb refuses root), on a free port of localhost; stopped and removed at the end. Yields its URL, and what
    stops it (``ctl("stop")``) and starts it again (``ctl("start")``) as the test wants."""
    found = (
        subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True) if shutil.which("pg_config") else None
    )
    bindirs = [Path(found.stdout.strip())] if found and found.returncode == 0 else []
    bindirs += sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)  # Debian's, without pg_config
    bindir = next((b for b in bindirs if (b / "initdb").is_file()), None)
    if bindir is None:
        pytest.skip("PostgreSQL's server is not installed (no initdb in pg_config --bindir); .ci/run installs it")
    as_user = []
    if os.geteuid() == 0:
        if not shutil.which("runuser"):
            pytest.skip("running as root without runuser: initdb refuses root")
        as_user = ["runuser", "-u", "postgres", "--"]
    folder = Path(tempfile.mkdtemp(prefix="sweep-pg-"))
    if as_user:
        shutil.chown(folder, "postgres")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pg = lambda *command: subprocess.run([*as_user, *map(str, command)], capture_output=True, text=True, check=True)
    pg(bindir / "initdb", "-D", folder / "data", "-U", "postgres", "--auth=trust", "-E", "UTF8")
    options = f"-p {port} -k {folder} -c listen_addresses=127.0.0.1"
    ctl = lambda action: pg(
        bindir / "pg_ctl", "-D", folder / "data", "-o", options, "-l", folder / "server.log", "-w", action
    )
    ctl("start")
    try:
        pg(bindir / "createdb", "-h", "127.0.0.1", "-p", port, "-U", "postgres", "sweeps")
        yield f"postgresql://postgres@127.0.0.1:{port}/sweeps", ctl
    finally:
        pg(bindir / "pg_ctl", "-D", folder / "data", "-m", "immediate", "stop")
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.slow
def test_two_workers_on_one_postgresql_server_run_each_trial_once(tmp_path, data_dir, postgres):
    config = make_config(tmp_path, data_dir, trainer__epochs=1)
    two_workers(config, "--storage", postgres, "--study", "pg")
    study = optuna.load_study(study_name="pg", storage=postgres.replace("://", "+psycopg://", 1))  # as named
    assert_once_each(tmp_path / "saved" / "tiny" / "sweep-pg", 4, 1, study)
    bad = run("sweep.py", "-c", config, "--grid", "optimizer.args.lr=[0.1]", "--storage", postgres + "x")
    assert bad.returncode == 2 and bad.stderr.startswith("error: --storage ") and len(bad.stderr.splitlines()) == 1
    with_password = postgres.replace("postgres@", "postgres:S3cr3t-pw@") + "x"  # a server that answers: no such db
    bad = run("sweep.py", "-c", config, "--grid", "optimizer.args.lr=[0.1]", "--storage", with_password)
    warning, error = bad.stderr.splitlines()  # the password is visible in `ps`: said where it is given
    assert warning.startswith("warning: --storage holds a password") and "PGPASSWORD" in warning
    assert bad.returncode == 2 and error.startswith("error: --storage ") and "sweepsx" in error, bad.stderr
    assert "S3cr3t" not in bad.stdout + bad.stderr and "postgres:***@" in error


@pytest.mark.slow
def test_a_sweep_waits_for_its_database_and_stops_in_one_line_when_it_stays_away(tmp_path, data_dir, postgres_server):
    """Before, PostgreSQL stopped for a few seconds mid-sweep was a StorageInternalError traceback and exit 1."""
    url, ctl = postgres_server
    config = make_config(tmp_path, data_dir, trainer__epochs=3)
    wait = 15  # seconds: past the 5 s outage below, and short for the test (the default is DATABASE_WAIT_SECONDS)
    args = ["-c", config, "--grid", "optimizer.args.lr=[0.003,0.001]", "--database-wait", wait, "--storage", url]
    worker = start_sweep(*args, "--study", "outage")
    folder = tmp_path / "saved" / "tiny" / "sweep-outage"
    try:
        wait_for(lambda: epoch_ended(folder / "trial-000"), "epoch 1")
        ctl("stop")  # fast: every session cut off, and nothing answers for 5 s, a restart's time
        time.sleep(5)
    finally:
        ctl("start")
    out = worker.communicate(timeout=300)[0]
    assert worker.returncode == 0, out
    study = optuna.load_study(study_name="outage", storage=url.replace("://", "+psycopg://", 1))
    assert_once_each(folder, 2, 3, study)

    # stopped for good: a line once the bound has passed, the password nowhere (trust: the server never asks for it)
    wait = args[args.index("--database-wait") + 1] = 4  # nothing to outlast: the bound alone
    args[-1] = url.replace("postgres@", "postgres:S3cr3t-pw@")
    config.write_text(config.read_text().replace('"epochs": 3', '"epochs": 100'))  # still training when it stops
    io = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    io["env"] = {**os.environ, "JAX_PLATFORMS": "cpu"}
    worker = subprocess.Popen([sys.executable, "sweep.py", *map(str, args), "--study", "lost"], cwd=ROOT, **io)
    try:
        wait_for(lambda: epoch_ended(tmp_path / "saved" / "tiny" / "sweep-lost" / "trial-000"), "epoch 1")
        ctl("stop")
        out, err = worker.communicate(timeout=wait + 60)
    finally:
        ctl("start")
    assert worker.returncode == 2 and "Traceback" not in err and "S3cr3t" not in out + err, out + err
    warning, error = err.splitlines()
    assert warning.startswith("warning: --storage holds a password"), err
    assert error.startswith(
        f"error: --storage {args[-1].replace('S3cr3t-pw', '***')}: the database did not answer for "
        f"{wait} s (OperationalError: connection failed: "
    ), err
    assert error.endswith("; the trials keep their checkpoints: the same command goes on once it is back"), err


def epoch_ended(run_dir: Path) -> bool:
    """Its checkpoint and its whole metrics row are there (the kill must not come between the two writes)."""
    rows = run_dir / "metrics.jsonl"
    return (run_dir / "checkpoint-latest.params").is_file() and rows.is_file() and rows.read_text().endswith("\n")


@pytest.mark.slow
def test_a_trial_of_a_killed_worker_is_taken_up_from_its_checkpoint(tmp_path, data_dir):
    config = make_config(tmp_path, data_dir, trainer__epochs=10)
    args = ["-c", config, "--grid", "optimizer.args.lr=[0.003]", "--heartbeat", 1]
    first = start_sweep(*args)
    try:
        wait_for(lambda: any(map(epoch_ended, (tmp_path / "saved").glob("tiny/sweep-*/trial-000"))), "epoch 1")
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # no handler runs: the trial learns of it from the kernel and saves
        first.communicate()
    folder = sweep_folder(tmp_path)
    stopped_at = len(rows_of(folder / "trial-000"))
    second = run("sweep.py", *args)  # fails the trial once three heartbeats are missed, and takes it up
    assert second.returncode == 0, second.stdout + second.stderr
    assert "trial-000: resumed" in second.stdout and "trial-000: done" in second.stdout
    assert "resumed from" in (folder / "trial-000" / "train.log").read_text() and 1 <= stopped_at < 10
    rows = rows_of(folder / "trial-000")
    assert [r["epoch"] for r in rows] == list(range(1, 11))

    rerun = run("train.py", "-c", folder / "best" / "config.json", "--run-id", "again")  # never interrupted
    assert rerun.returncode == 0, rerun.stderr
    assert strip(rows_of(tmp_path / "saved" / "tiny" / "again")[-1]) == strip(rows[-1])


@pytest.mark.slow
def test_median_pruning_stops_a_trial_that_cannot_learn(tmp_path, data_dir):
    # epochs enough that the bad trial still runs when its first epoch is read; seed 1 shuffles the grid so that
    # lr 0 comes last, after a finished trial (MIN_TRIALS 1: one is enough)
    config = make_config(tmp_path, data_dir, trainer__epochs=60)
    grid = ["--grid", "optimizer.args.lr=[0.003,0]", "--seed", 1, "--prune", "median:1:1"]
    result = run("sweep.py", "-c", config, *grid, "--set", "name=pruned")
    assert result.returncode == 0, result.stdout + result.stderr
    folder = sweep_folder(tmp_path, "pruned")
    with open(folder / "results.csv") as f:
        table = {row["optimizer.args.lr"]: row for row in csv.DictReader(f)}
    assert [table[lr]["status"] for lr in ("0.003", "0")] == ["done", "pruned"]
    assert table["0"]["best_epoch"] == "2" and table["0"]["trial"] == "1"  # epoch 1 is the warm-up
    assert 2 <= len(rows_of(folder / "trial-001")) < 60
    assert "stopped by SIGTERM" in (folder / "trial-001" / "train.log").read_text()
    for name in ("results.csv", "curves.png", "history.png", "parallel.png", "best/config.json"):
        assert (folder / name).is_file(), name


@pytest.mark.slow
def test_failed_trials_are_recorded_with_their_error_and_retried_only_when_asked(tmp_path, data_dir):
    config = make_config(tmp_path, data_dir, trainer__epochs=1)
    # b1 2 passes the config's checks but not the optimizer's (exit 2)
    args = ["-c", config, "--grid", "optimizer.args.b1=[0.9,2.0]"]
    result = run("sweep.py", *args)
    assert result.returncode == 0, result.stdout + result.stderr
    folder = sweep_folder(tmp_path)
    with open(folder / "results.csv") as f:
        table = list(csv.DictReader(f))
    assert [row["status"] for row in table] == ["done", "failed"]
    assert table[1]["error"].startswith("error: ") and "optimizer.args.b1" in table[1]["error"]
    assert "failed:" in result.stdout
    kept = run("sweep.py", *args)
    assert kept.returncode == 0 and "started" not in kept.stdout and "resumed" not in kept.stdout
    retried = run("sweep.py", *args, "--retry-failed")
    assert retried.returncode == 0 and f"trial-{table[1]['trial'].zfill(3)}: resumed" in retried.stdout
    assert retried.stdout.count("resumed") == 1


def test_a_bad_flag_from_another_working_folder_is_one_line_and_writes_nothing(tmp_path):
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    swept = subprocess.run(
        [sys.executable, str(ROOT / "sweep.py"), "--no-such-flag"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert swept.returncode == 2 and len(swept.stderr.strip().splitlines()) == 1, swept.stderr
    assert list(tmp_path.iterdir()) == []


def free_port() -> int:
    """A port of localhost that nothing listens on (bound, then let go): a connection there is refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def files_under(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file()]


@pytest.mark.parametrize(
    "url, secret",
    [
        ("postgresql://sweeper:S3cr3t-pw@127.0.0.1:{port}/sweeps", "S3cr3t-pw"),
        ("postgresql://sweeper:p%40ss%2Fw0rd@127.0.0.1:{port}/sweeps", "p@ss/w0rd"),  # quoted, shown either way
        ("postgresql://127.0.0.1:{port}/sweeps?user=sweeper&password=Qu3ry-pw", "Qu3ry-pw"),
        ("sweeper:S3cr3t-pw@127.0.0.1/sweeps", "S3cr3t-pw"),  # not a URL: refused, and still masked
    ],
)
def test_a_refused_storage_url_never_shows_its_password(tmp_path, data_dir, capsys, url, secret):
    config = make_config(tmp_path, data_dir)
    url = url.format(port=free_port())
    with pytest.raises(SystemExit) as exit:
        sweep.main(["-c", str(config), "--grid", "optimizer.args.lr=[0.1]", "--storage", url])
    assert exit.value.code == 2
    out, err = capsys.readouterr()
    *warning, error = err.splitlines()  # a URL refused before it is read has no warning: it never ran
    assert warning in (
        [],
        [
            "warning: --storage holds a password, which other users of this machine can read in the "
            "process list (ps); leave it out of the URL and give it through PGPASSWORD or ~/.pgpass"
        ],
    )
    assert error.startswith("error: --storage ") and "***" in error, err
    raw = secret.replace("@", "%40").replace("/", "%2F")
    for shown in (out, err, *(p.read_text(errors="replace") for p in files_under(tmp_path))):
        assert secret not in shown and raw not in shown, shown
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]


def test_masked_url_hides_the_password_and_keeps_the_rest():
    from training.sweeps.storage import masked, masked_url

    assert masked_url("postgresql://u:pw@db-host:5432/sweeps") == "postgresql://u:***@db-host:5432/sweeps"
    assert masked_url("postgresql://u@db-host/sweeps") == "postgresql://u@db-host/sweeps"
    assert masked_url("sqlite:///sweeps.db") == "sqlite:///sweeps.db"
    assert masked_url("mysql+pymysql://u:a@b/c@h/db") == "mysql+pymysql://u:***@h/db"  # an unquoted '@': more hidden
    assert (
        masked_url("postgresql://h/db?sslmode=require&password=x") == "postgresql://h/db?sslmode=require&password=***"
    )
    assert masked("could not parse 'postgresql://u:pw@h/db' (pw)", "postgresql://u:pw@h/db") == (
        "could not parse 'postgresql://u:***@h/db' (***)"
    )


def journal_of(tmp_path: Path, study: str = "j") -> Path:
    """A real study's journal where `--study j` keeps it: Optuna's own lines (a study and a finished trial)."""
    folder = tmp_path / "saved" / "tiny" / f"sweep-{study}"
    folder.mkdir(parents=True)
    backend = optuna.storages.journal.JournalFileBackend(str(folder / "journal.log"))
    made = optuna.create_study(storage=optuna.storages.JournalStorage(backend), study_name=study)
    made.tell(made.ask({"x": optuna.distributions.FloatDistribution(0, 1)}), 1.0)
    return folder / "journal.log"


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda text: text.replace(b"\n", b"\nnot json at all\n", 1), "line 2 is not JSON"),
        (lambda text: text + b'{"op_code": 99, "worker_id": "w"}\n', "not one of Optuna's operations"),
        (lambda text: b'{"some": "other json"}\n' + text, "line 1 is JSON, but not one of Optuna's operations"),
        (lambda text: os.urandom(3000) + b"\n", "line 1 is not JSON"),
        (lambda text: os.urandom(3000).replace(b"\n", b""), "kB that are not a line of Optuna's journal (from byte 0"),
        (lambda text: text + b"\x00" * 100, "that are not a line of Optuna's journal"),
        (lambda text: text + b'{"op_code": 0, "worker_id": "w"}\n', "Optuna cannot replay it (KeyError"),
    ],
)
def test_a_corrupt_journal_is_refused_in_one_line_and_left_as_it_was(tmp_path, data_dir, capsys, damage, message):
    config = make_config(tmp_path, data_dir)
    journal = journal_of(tmp_path)
    journal.write_bytes(damaged := damage(journal.read_bytes()))
    with pytest.raises(SystemExit) as exit:
        sweep.main(["-c", str(config), "--grid", "optimizer.args.lr=[0.1]", "--study", "j"])
    assert exit.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {journal}: ") and message in err[0], err
    assert journal.read_bytes() == damaged and sorted(p.name for p in journal.parent.iterdir()) == ["journal.log"]


def test_an_oversized_journal_is_refused_by_its_bound_before_it_is_read(tmp_path, data_dir, capsys):
    config = make_config(tmp_path, data_dir)
    journal = journal_of(tmp_path)
    os.truncate(journal, 8 << 30)  # sparse: 8 GB that take no disk
    with pytest.raises(SystemExit) as exit:
        sweep.main(["-c", str(config), "--grid", "optimizer.args.lr=[0.1]", "--study", "j"])
    err = capsys.readouterr().err.splitlines()
    assert exit.value.code == 2 and len(err) == 1, err
    assert err[0] == f"error: {journal}: 8 GB, more than the 1 GB a sweep's journal may have"


def test_a_torn_last_line_is_cut_off_before_anything_is_appended(tmp_path):
    from training.sweeps.storage import check_journal

    journal = journal_of(tmp_path)
    whole = journal.read_bytes()
    lock = optuna.storages.journal.JournalFileOpenLock(str(journal))
    assert check_journal(journal, lock) is None and journal.read_bytes() == whole
    for torn in (b'{"op_', b'{"op_code":4,"worker_id":"a-1","study_id":0,"datetime_st'):
        journal.write_bytes(whole + torn)
        said = check_journal(journal, lock)
        assert said.startswith(f"{journal}: its last line was cut off ({len(torn)} bytes") and "\n" not in said
        assert journal.read_bytes() == whole and not Path(f"{journal}.lock").exists()
    journal.write_bytes(whole[: whole.index(b"\n") + 1 + 20])  # the second line cut: the study is still there
    check_journal(journal, lock)
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(journal)))
    assert [s.study_name for s in storage.get_all_studies()] == ["j"]


@pytest.mark.slow
def test_a_sweep_goes_on_after_its_journal_lost_the_end_of_its_last_line(tmp_path, data_dir):
    config = make_config(tmp_path, data_dir, trainer__epochs=1)
    args = ["-c", config, "--grid", "optimizer.args.lr=[0.003,0.01]", "--study", "torn", "--heartbeat", 1]
    first = run("sweep.py", *args, "--trials", 1)
    assert first.returncode == 0, first.stdout + first.stderr
    journal = tmp_path / "saved" / "tiny" / "sweep-torn" / "journal.log"
    text = journal.read_bytes()
    journal.write_bytes(text[: len(text) - 30])  # the last operation (the trial's end) torn
    second = run("sweep.py", *args, "--trials", 2)
    assert second.returncode == 0, second.stdout + second.stderr
    assert second.stderr.count("its last line was cut off") == 1, second.stderr
    with open(journal.parent / "results.csv") as f:
        assert [row["status"] for row in csv.DictReader(f)] == ["done", "done"]
    again = run("sweep.py", *args, "--trials", 2)  # the study reads whole from then on
    assert again.returncode == 0 and again.stderr == "", again.stderr


def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize(
    "link, kind",
    [
        ("saved/tiny", "folder"),
        ("saved/tiny/sweep-s", "folder"),
        ("saved/tiny/sweep-s/logs", "folder"),
        ("saved/tiny/sweep-s/best", "folder"),
        ("saved/tiny/sweep-s/trial-000", "folder"),
        ("saved/tiny/sweep-s/journal.log", "file"),
        ("saved/tiny/sweep-s/journal.log.lock", "file"),
        ("saved/tiny/sweep-s/results.csv", "file"),
        ("saved/tiny/sweep-s/curves.png", "file"),
        ("saved/tiny/sweep-s/best/config.json", "file"),
        ("saved/tiny/sweep-s/logs/trial-000.log", "file"),
    ],
)
def test_a_link_in_a_sweep_folder_is_refused_up_front_and_nothing_is_written_through_it(
    tmp_path, data_dir, capsys, link, kind
):
    config = make_config(tmp_path, data_dir)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    target = elsewhere if kind == "folder" else elsewhere / "file"
    if kind == "file":
        target.write_text("kept\n")
    (tmp_path / link).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / link).symlink_to(target)
    before = listing(tmp_path)
    with pytest.raises(SystemExit) as exit:
        sweep.main(["-c", str(config), "--grid", "optimizer.args.lr=[0.1]", "--study", "s"])
    assert exit.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {tmp_path / link}: a symbolic link (to {target})"), err
    assert listing(tmp_path) == before and listing(elsewhere) == ([] if kind == "folder" else ["file"])
    assert kind == "folder" or target.read_text() == "kept\n"


OPEN_AT = """
import sys, time
import sweep
args = sweep.parse_args(sys.argv[1:-1])
definition = sweep.define(args)
time.sleep(max(0.0, float(sys.argv[-1]) - time.time()))  # every process at the same moment
print(sweep.open_study(args, definition)[0].study_name)
"""


@pytest.mark.slow
def test_workers_started_at_once_on_a_new_sqlite_file_all_open_the_study(tmp_path, data_dir):
    config = make_config(tmp_path, data_dir)
    url = f"sqlite:///{tmp_path / 'sweeps.db'}"
    args = ["-c", config, "--grid", "optimizer.args.lr=[0.1]", "--storage", url, "--study", "barsweep"]
    at = time.time() + 8  # past every process's imports
    command = [sys.executable, "-c", OPEN_AT, *map(str, args)]
    workers = [subprocess.Popen([*command, str(at)], cwd=ROOT, **PIPES) for _ in range(6)]
    outputs = [w.communicate(timeout=120) for w in workers]
    assert [w.returncode for w in workers] == [0] * 6, outputs  # each creates the tables, or finds them made
    assert [out.strip() for out, _ in outputs] == ["barsweep"] * 6, outputs
    assert optuna.get_all_study_names(url) == ["barsweep"]  # the name given, as optuna.load_study finds it


PIPES = {
    "stdout": subprocess.PIPE,
    "stderr": subprocess.PIPE,
    "text": True,
    "env": {**os.environ, "JAX_PLATFORMS": "cpu"},
}


def test_a_study_stored_under_its_folder_name_by_an_earlier_sweep_is_continued(tmp_path, data_dir):
    config = make_config(tmp_path, data_dir)
    url = f"sqlite:///{tmp_path / 'sweeps.db'}"
    optuna.create_study(storage=url, study_name="sweep-old", direction="maximize")  # how sweep.py named it before
    for name, stored in (("old", "sweep-old"), ("new", "new")):
        args = sweep.parse_args(
            ["-c", str(config), "--grid", "optimizer.args.lr=[0.1]", "--storage", url, "--study", name]
        )
        study, _ = sweep.open_study(args, sweep.define(args))
        assert study.study_name == stored and study.user_attrs["definition"]["grid"] == ["optimizer.args.lr=[0.1]"]
    assert sorted(optuna.get_all_study_names(url)) == ["new", "sweep-old"]
    journal = journal_of(tmp_path, "sweep-kept")  # a journal file's study alike, in the folder --study kept uses
    journal.parent.rename(journal.parent.parent / "sweep-kept")
    args = sweep.parse_args(["-c", str(config), "--grid", "optimizer.args.lr=[0.1]", "--study", "kept"])
    assert sweep.open_study(args, sweep.define(args))[0].study_name == "sweep-kept"
