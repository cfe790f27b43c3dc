"""Hyperparameter sweep on Optuna: a study that any number of workers pull trials from, each trial a train.py run.

    python sweep.py -c config.json --grid optimizer.args.weight_decay=[0,0.05] \\
        --sample optimizer.schedule.args.peak_value=loguniform:1e-4:1e-2 --trials 20 [--parallel N] [--prune median]

Trials run in saved/<name>/sweep-<study>/trial-NNN/ (`train.py -r auto`); the study lives in journal.log there, or in
--storage (postgresql://..., sqlite:///...). Run the same command again, here or on another machine that sees the
folder, and it works on the same study until it has --trials finished trials. The folder also gets logs/,
results.csv, the plots and best/config.json (train.py -c on it reproduces the best trial). More: docs/sweeps.md.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import time
import warnings
from argparse import SUPPRESS
from collections import namedtuple
from functools import partial
from importlib.util import find_spec
from pathlib import Path

import optuna
from optuna.storages import JournalStorage, RDBStorage, fail_stale_trials
from optuna.storages._heartbeat import BaseHeartbeat
from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock

from files.writes import LOCK_NAME, METRICS, open_nofollow, try_lock, unlock, write_atomic
from training.config.file import ConfigError, is_index, read_config_file
from training.config.validation import load_config
from training.devices.memory import host_available, show_bytes
from training.run.cli import ArgumentParser, command, fail
from training.sweeps.folder import JOURNAL, LinkedFolder, check_folder
from training.sweeps.results import FAIL, PRUNED, RUNNING, WAITING, attempts, best_of, curve_of, ended, report, run_of
from training.sweeps.space import SweepError, check_key, overrides, parse, probes
from training.sweeps.storage import (
    DATABASE_WAIT_SECONDS,
    GOES_ON,
    REFUSED,
    DatabaseLost,
    JournalRefused,
    check_journal,
    error_text,
    masked_url,
    secrets_of,
    wait_for_database,
)

TRAIN = Path(__file__).resolve().parent / "train.py"
POLL_SECONDS = 0.25
# what a worker and its trial's train.py take of the host's memory at least (a tiny MLP's train.py peaks at 400 MB,
# JAX and its compiler alone; a sweep worker with Optuna 150 MB): --parallel is bounded by it
WORKER_BYTES = 1 << 30
SAMPLERS = {"grid": "GridSampler", "random": "RandomSampler", "tpe": "TPESampler", "cmaes": "CmaEsSampler"}
SAMPLERS |= {"gp": "GPSampler", "qmc": "QMCSampler"}
NEEDS = {"cmaes": "cmaes", "gp": "torch"}  # the samplers whose package Optuna does not install
# every Optuna sampler seeds numpy's RandomState (directly, or through the RandomSampler it falls back on), which
# takes 0 .. 2**32 - 1; worker k of --parallel adds SEED_STEP * k, so the last worker's seed must fit too
MAX_SEED, SEED_STEP = 2**32 - 1, 1000
PRUNERS = "median[:WARMUP[:MIN_TRIALS]], percentile:P[:WARMUP[:MIN_TRIALS]], successive-halving, hyperband or off"


def parse_args(argv=None):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("-c", "--config", required=True, help="the config every trial starts from")
    add("--set", dest="fixed", action="append", default=[], metavar="KEY.PATH=VALUE", help="a value every trial takes")
    add("--grid", action="append", default=[], metavar="KEY.PATH=[v1,v2,...]", help="values to try (JSON list)")
    add("--sample", action="append", default=[], metavar="KEY.PATH=DIST", help="(log)uniform|int:LOW:HIGH|choice:[]")
    add("--trials", type=int, help="finished trials the study needs (default: the grid's size; with --sample, 10)")
    add("--sampler", help=f"{', '.join(SAMPLERS)} (default: grid for a grid alone, else tpe)")
    add("--prune", default="off", help=PRUNERS + " (default)")
    add("--seed", type=int, help="the sampler's seed (default: fresh draws in every worker)")
    add("--parallel", type=int, default=1, help="worker processes on this machine (default 1)")
    add("--storage", help="a database URL (default: journal.log in the sweep folder)")
    add(
        "--study", help="the study's name in the storage, and the folder's sweep-<study> (default: a hash of the sweep)"
    )
    add("--heartbeat", type=int, default=10, help="seconds between a worker's heartbeats; 3 missed fail its trial")
    add(
        "--database-wait",
        type=int,
        default=DATABASE_WAIT_SECONDS,
        help=f"seconds a worker waits for --storage's database to answer again (default {DATABASE_WAIT_SECONDS})",
    )
    add("--retry-failed", action="store_true", help="run the trials that failed for their values again")
    add("--worker", type=int, default=0, help=SUPPRESS)  # which of --parallel's processes: its seed
    return parser.parse_args(argv)


# what define() checked: the config and --set, the swept Params, how many trials, where, ranked how, and what
# defines the study (a worker with other settings is refused)
Sweep = namedtuple("Sweep", "config_path fixed params trials folder mode metric epochs definition")


def define(args) -> Sweep:
    """Checks every argument, and every swept key path and value against the config, before anything is written."""
    for flag in ("parallel", "heartbeat", "trials"):
        if (value := getattr(args, flag)) is not None and value < 1:
            raise SweepError(f"--{flag} {value}: expected at least 1")
    if args.parallel > 1 and args.parallel > (most := parallel_limit())[0]:
        raise SweepError(
            f"--parallel {args.parallel}: {most[1]}; run the same command on another machine to add workers"
        )
    params = [parse("--grid", text) for text in args.grid] + [parse("--sample", text) for text in args.sample]
    if not params:
        raise SweepError("nothing to sweep: give --grid KEY.PATH=[...] and/or --sample KEY.PATH=DISTRIBUTION")
    source, given, where = Path(args.config).name, {t.partition("=")[0].strip(): "--set" for t in args.fixed}, ""
    try:
        config = load_config(args.config, args.fixed, source=source)
        for param in params:
            check_key(config, param, given, source)
        for param, value, values in probes(params):  # every value swept, each with the others at their first
            where = f"{param.flag} {param.key}={json.dumps(value)}: "
            load_config(args.config, args.fixed + overrides(values), source=source)
    except ConfigError as error:
        raise SweepError(f"{where}{error}") from None
    monitor, epochs = config["trainer"]["monitor"], config["trainer"]["epochs"]
    gridded = all(p.flag == "--grid" for p in params)
    grid_size = math.prod(len(p.candidates) for p in params if p.flag == "--grid")
    sampler = args.sampler or ("grid" if gridded else "tpe")
    trials = args.trials or (grid_size if gridded else 10)
    definition = {"config": read_config_file(args.config), "set": args.fixed, "grid": args.grid, "sample": args.sample}
    definition |= {"sampler": sampler, "prune": args.prune}
    top_seed = MAX_SEED - SEED_STEP * max(args.parallel - 1, args.worker)
    name = args.study or hashlib.sha256(json.dumps(definition, sort_keys=True).encode()).hexdigest()[:8]
    for wrong, message in (
        (
            monitor == "off",
            f"{source}: trainer.monitor is off; a sweep ranks trials by it (--set 'trainer.monitor=max val/accuracy')",
        ),
        (
            args.seed is not None and not 0 <= args.seed <= top_seed,
            f"--seed {args.seed}: expected 0 to {top_seed}"
            + (f" (worker k of --parallel {args.parallel} adds {SEED_STEP} k)" if args.parallel > 1 else ""),
        ),
        (not 0 <= args.database_wait <= 86_400, f"--database-wait {args.database_wait}: expected 0 to 86400 seconds"),
        (sampler not in SAMPLERS, f"--sampler {sampler}: expected one of {', '.join(SAMPLERS)}"),
        (
            sampler == "grid" and not gridded,
            "--sampler grid: every swept value must be a --grid (or choose random, tpe, ...)",
        ),
        (
            sampler == "grid" and trials > grid_size,
            f"--trials {trials}: the grid has {grid_size} point{'s' * (grid_size > 1)}; add --sample to draw more",
        ),
        (
            not name.replace("-", "").replace("_", "").isalnum() or len(name) > 64,
            f"--study {name!r}: expected letters, digits, '-' or '_'",
        ),
        (
            args.storage and "://" not in args.storage,
            f"--storage {masked_url(args.storage or '')}: expected a database URL (postgresql://user@host/db, "
            "sqlite:///sweeps.db)",
        ),
        (
            not find_spec(NEEDS.get(sampler, "optuna")),
            f"--sampler {sampler}: needs the {NEEDS.get(sampler)} package (pip install {NEEDS.get(sampler)})",
        ),
    ):
        if wrong:
            raise SweepError(message)
    parse_prune(args.prune, epochs)
    folder = Path(config["trainer"]["save_dir"]) / config["name"] / f"sweep-{name}"
    return Sweep(args.config, args.fixed, params, trials, folder, *monitor.split(" ", 1), epochs, definition)


def parallel_limit() -> tuple[int, str]:
    """The most workers this machine runs at once, and why: a worker per core this process may use (a trial's
    train.py keeps one busy at least), and WORKER_BYTES of the memory it can still take (its cgroup's, in a SLURM
    job) per worker."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    free = host_available()
    by_memory = cores if free is None else free[0] // WORKER_BYTES
    most = max(1, min(cores, by_memory))
    memory = "" if free is None else f"; {show_bytes(free[0])} of memory free, {show_bytes(WORKER_BYTES)} a worker"
    return most, f"this machine runs at most {most} (a worker a core: {cores}{memory})"


def config_of(sweep: Sweep, values: dict) -> dict:
    """A trial's config: the config file, --set, then the trial's values."""
    return load_config(sweep.config_path, sweep.fixed + overrides(values), source=Path(sweep.config_path).name)


def parse_prune(text: str, epochs: int):
    p = optuna.pruners
    name, *n = text.split(":")
    if not all(is_index(x) for x in n):
        n = [-1]
    n = [int(x) for x in n]
    percentile = n.pop(0) if name == "percentile" and n and 0 < n[0] < 100 else 50 if name == "median" else None
    if percentile is not None and len(n) <= 2 and n[1:] != [0] and -1 not in n:
        # WARMUP epochs are never pruned: Optuna prunes from step n_warmup_steps on, and a step is an epoch (1, 2...)
        return p.PercentilePruner(percentile, n_startup_trials=(n + [0, 2])[1], n_warmup_steps=(n + [0])[0] + 1)
    pruners = {"successive-halving": p.SuccessiveHalvingPruner, "hyperband": lambda: p.HyperbandPruner(1, epochs)}
    if n or name not in (*pruners, "off"):
        raise SweepError(f"--prune {text}: expected {PRUNERS}")
    return pruners.get(name, p.NopPruner)()


def requeue(study, trial) -> None:
    """A trial stopped or lost through no fault of its values: queued again with them, for the same folder, where
    train.py -r auto resumes it from its last checkpoint."""
    kept = {k: v for k, v in trial.system_attrs.items() if k in ("grid_id", "search_space")}  # its grid point
    attrs = {**kept, "failed_trial": int(run_of(trial).split("-")[1])}
    study.add_trial(
        optuna.create_trial(state=WAITING, params=trial.params, distributions=trial.distributions, system_attrs=attrs)
    )


def connect(make, storage: str | None, tries: int = 5):
    """Workers started at once create the database's tables and the study at once: the losers try again. A race
    lost is a duplicate row (IntegrityError), or a table another worker created between this one's look and its
    CREATE TABLE (SQLite's OperationalError, PostgreSQL's ProgrammingError: "... already exists")."""
    for attempt in range(tries):
        try:
            return make()
        except Exception as error:  # a bad URL, a missing driver, a server that does not answer, a race
            kind = type(error).__name__
            race = kind == "IntegrityError" or (
                kind in ("OperationalError", "ProgrammingError") and "already exists" in str(error)
            )
            if attempt == tries - 1 or not race:
                raise SweepError(f"--storage {masked_url(storage)}: {error_text(error, storage)}") from None
            time.sleep(0.5 + attempt)


def stored_name(storage, name: str) -> str:
    """The study's name in the storage: the one --study gave (or the definition's hash), so that optuna.load_study
    and optuna-dashboard find it by it; a study stored under the folder's name, sweep-NAME, by an earlier sweep.py
    is continued under that name."""
    names = {study.study_name for study in storage.get_all_studies()}
    return f"sweep-{name}" if f"sweep-{name}" in names and name not in names else name


def open_study(args, sweep: Sweep):
    """The study and its storage, created by the first worker and loaded by the others. A trial whose worker
    missed three heartbeats is failed by the next worker to look, and queued again (`requeue`)."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # a worker reports in its own words
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", "Heartbeat of storage")  # Optuna's heartbeat, without its optimize()
    beat = args.heartbeat
    try:
        check_folder(sweep.folder)  # before anything is written there, a database's study included
    except LinkedFolder as error:
        raise SweepError(str(error)) from None

    class Journal(JournalStorage, BaseHeartbeat):
        """The journal file with heartbeats (Optuna has them for RDB storages only), kept as trial attributes."""

        get_heartbeat_interval, get_heartbeat_stale_trial_callback = (lambda self: beat), (lambda self: requeue)
        record_heartbeat = lambda self, trial_id: self.set_trial_system_attr(trial_id, "heartbeat", time.time())

        def _get_stale_trial_ids(self, study_id):
            running = self.get_all_trials(study_id, deepcopy=False, states=(RUNNING,))
            seen = {t._trial_id: t.system_attrs.get("heartbeat", t.datetime_start.timestamp()) for t in running}
            return [i for i, last in seen.items() if time.time() - last > 3 * beat]

    if args.storage:
        url = args.storage.replace("postgresql://", "postgresql+psycopg://", 1)  # requirements-sweeps-postgres.txt
        rdb = partial(RDBStorage, url, heartbeat_interval=beat, grace_period=3 * beat)
        rdb = partial(rdb, engine_kwargs={"pool_pre_ping": True})  # a connection the server dropped: replaced
        storage = connect(partial(rdb, heartbeat_stale_trial_callback=requeue), args.storage)
        # from now on; a URL that never answered is refused at once
        wait_for_database(storage.engine, args.storage, args.database_wait)
    else:
        path = sweep.folder / JOURNAL
        lock = JournalFileOpenLock(str(path))
        try:
            repaired = check_journal(path, lock)
            sweep.folder.mkdir(parents=True, exist_ok=True)
            storage = Journal(JournalFileBackend(str(path), lock_obj=lock))
        except JournalRefused as error:
            raise SweepError(str(error)) from None
        except OSError:
            raise
        except Exception as error:  # lines of Optuna's operations that it cannot replay (a field missing, ...)
            raise SweepError(f"{path}: Optuna cannot replay it ({type(error).__name__}: {error}); {REFUSED}") from None
        if repaired:
            print(f"warning: {repaired}", file=sys.stderr, flush=True)
    kind, seed = sweep.definition["sampler"], None if args.seed is None else args.seed + SEED_STEP * args.worker
    if kind == "grid":  # its after_trial's study.stop() is for study.optimize; a worker stops at --trials itself
        Grid = type("Grid", (optuna.samplers.GridSampler,), {"after_trial": lambda *_: None})
        # every worker shuffles the grid alike (trial i takes point i), so they share one seed
        sampler = Grid({p.key: p.distribution.choices for p in sweep.params}, seed=args.seed or 0)
    else:
        sampler = getattr(optuna.samplers, SAMPLERS[kind])(seed=seed)
    where = args.storage or str(sweep.folder / JOURNAL)
    name = connect(partial(stored_name, storage, sweep.folder.name.removeprefix("sweep-")), where)
    pruner = parse_prune(args.prune, sweep.epochs)
    make = partial(optuna.create_study, storage=storage, study_name=name, sampler=sampler, pruner=pruner)
    make = partial(make, direction="maximize" if sweep.mode == "max" else "minimize", load_if_exists=True)
    study = connect(make, where)
    before = study.user_attrs.get("definition")
    if before is None:
        study.set_user_attr("definition", sweep.definition)
    elif before != sweep.definition:
        changed = sorted(k for k in sweep.definition if before.get(k) != sweep.definition[k])
        raise SweepError(
            f"study {name}: started with other settings ({', '.join(changed)} differ); use another --study, "
            "or the same arguments to continue it"
        )
    return study, storage


def parent_death_signal():
    """A preexec_fn: the trial gets SIGTERM (saves, exits) when its worker dies, even by SIGKILL. Linux only."""
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec():
        prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the worker died before the line above
            os._exit(1)

    return preexec


def wait_free(run_dir: Path, seconds: float = 60) -> None:
    """A trial taken up from a killed worker: its train.py (on this machine) is still saving; -r auto waits for it."""
    deadline, lock = time.monotonic() + seconds, run_dir / LOCK_NAME
    while lock.is_file() and time.monotonic() < deadline:
        try:
            fd, _ = try_lock(lock)
        except OSError:  # a link or a pipe planted at the lock: train.py refuses it in one line, the trial's error
            return
        if fd is not None:
            return unlock(lock, fd)
        time.sleep(POLL_SECONDS)


def error_line(log: Path, start: int, run_dir: Path, code: int) -> str:
    """Why a trial failed: train.py's `error:` line, else the last error in its train.log, else how it ended."""
    with open(log, "rb") as f:
        f.seek(start)
        lines = [line.strip() for line in f.read().decode(errors="replace").splitlines() if line.strip()]
    train_log = run_dir / "train.log"
    logged = train_log.read_text(errors="replace").splitlines() if train_log.is_file() else []
    errors = [line for line in lines if line.startswith("error:")]
    errors = errors or [line.split(" ERROR ", 1)[1].split(": ", 1)[-1] for line in logged if " ERROR " in line]
    ended = [f"killed by {signal.Signals(-code).name}" if code < 0 else lines[-1] if lines else f"exit {code}"]
    return (errors or ended)[-1][:500]


class Worker:
    """Asks the study for trials and runs each as a train.py process until the study has enough finished ones."""

    def __init__(self, sweep: Sweep, study, storage, args):
        self.sweep, self.study, self.storage, self.args = sweep, study, storage, args
        self.process: subprocess.Popen | None = None
        self.stop_signal = None
        self.preexec = parent_death_signal()
        self.space = {p.key: p.distribution for p in sweep.params}
        (sweep.folder / "logs").mkdir(parents=True, exist_ok=True)

    def stop(self, signum: int) -> None:
        """First signal: the trial saves and exits (resumable); a second Ctrl-C stops it at once."""
        again = self.stop_signal is not None
        self.stop_signal = self.stop_signal or signum
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT if again else signum)

    def run(self) -> None:
        sweep, study = self.sweep, self.study
        if self.args.retry_failed:
            for trial in attempts(study.get_trials(deepcopy=False), sweep.trials).values():
                if trial.state == FAIL and "error" in trial.user_attrs:
                    requeue(study, trial)
        while self.stop_signal is None:
            fail_stale_trials(study)
            slots = attempts(study.get_trials(deepcopy=False), sweep.trials)
            if sum(ended(t) for t in slots.values()) >= sweep.trials:
                return
            lost = [t for t in slots.values() if t.state == FAIL and not ended(t)]  # and not queued again: its
            for t in lost:  # worker died between failing it and queueing it
                if time.time() - t.datetime_complete.timestamp() > 3 * self.args.heartbeat:
                    requeue(study, t)
            if len(slots) >= sweep.trials and not any(t.state == WAITING for t in slots.values()):
                time.sleep(self.args.heartbeat)  # the last trials run elsewhere; one whose worker dies comes back
                continue
            trial = study.ask(self.space)
            trials = study.get_trials(deepcopy=False)
            current = attempts(trials, sweep.trials).get(run_of(trials[trial.number]))
            if current is None or current.number != trial.number:
                trial.set_user_attr("surplus", True)  # beyond --trials, or a retry queued twice: not run
                study.tell(trial, state=FAIL)
                continue
            self.run_trial(trial, trials[trial.number])

    def run_trial(self, trial, frozen) -> None:
        sweep, run = self.sweep, run_of(frozen)
        values = {p.key: p.decode(trial.params[p.key]) for p in sweep.params}
        resumed = "failed_trial" in frozen.system_attrs
        shown = "  ".join(f"{k}={json.dumps(v)}" for k, v in values.items())
        print(f"{run}: {'resumed' if resumed else 'started'}  {shown}", flush=True)
        try:  # a combination the probes did not try: no process needed to learn it is refused
            config_of(sweep, values)
        except ConfigError as error:
            return self.failed(trial, run, f"error: {error}", 2)
        command = [sys.executable, str(TRAIN), "-r", "auto", "-c", sweep.config_path, "--run-id", run]
        place = {"name": sweep.folder.name, "trainer.save_dir": str(sweep.folder.parent)}  # last, whatever --set said
        command += [part for text in sweep.fixed + overrides(values | place) for part in ("--set", text)]
        run_dir, log = sweep.folder / run, sweep.folder / "logs" / f"{run}.log"
        wait_free(run_dir)
        with os.fdopen(open_nofollow(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "ab") as out:
            out.write(f"$ {' '.join(command)}\n".encode())
            out.flush()
            start = out.tell()
            try:
                io = dict(stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=self.preexec)
                env = {**os.environ, "PYTHONUNBUFFERED": "1"}
                self.process = subprocess.Popen(command, **io, env=env, start_new_session=True)
            except OSError as error:
                return self.failed(trial, run, f"cannot start train.py: {error.strerror or error}", None)
        if self.stop_signal is not None:  # it came while the process was being started
            self.process.send_signal(self.stop_signal)
        reported, pruned, beat, lost, curve = 0, None, 0.0, False, []
        while True:
            code = self.process.poll()
            curve = curve_of(run_dir / METRICS, sweep.metric) or curve  # the last whole read, not a half-written line
            try:
                if time.monotonic() - beat >= self.args.heartbeat:
                    self.storage.record_heartbeat(trial._trial_id)
                    beat = time.monotonic()
                for epoch in range(reported + 1, len(curve) + 1 if pruned is None else 0):
                    reported = epoch
                    if curve[epoch - 1] is not None:
                        trial.report(curve[epoch - 1], epoch)
                    if pruned is None and code is None and trial.should_prune():
                        pruned = epoch
                        self.process.send_signal(signal.SIGTERM)  # train.py saves and exits 143
                        break
            except DatabaseLost:
                raise
            except Exception as error:  # failed by another worker (this one missed its heartbeats): it runs there
                if not lost:
                    print(f"{run}: given up here ({type(error).__name__}); another worker runs it", flush=True)
                    self.process.send_signal(signal.SIGTERM)
                lost = True
            if code is not None:
                break
            time.sleep(POLL_SECONDS)
        self.process = None
        value, epoch = best_of(curve, sweep.mode)
        if lost:
            return
        if pruned is not None and code in (0, 130, 143):
            print(f"{run}: pruned  {sweep.metric} {curve[pruned - 1]:.4f} at epoch {pruned}", flush=True)
            self.study.tell(trial, state=PRUNED)
        elif code == 0 and value is not None:
            print(f"{run}: done  {sweep.metric} {value:.4f} (epoch {epoch})", flush=True)
            self.study.tell(trial, value)
        elif code == 0:
            self.failed(trial, run, f"no {sweep.metric} in {METRICS}", 0)
        elif self.stop_signal is not None:  # saved and stopped (130/143), or killed before train.py could save
            print(f"{run}: stopped at epoch {len(curve)}; it resumes from its checkpoint", flush=True)
            self.study.tell(trial, state=FAIL)
            requeue(self.study, self.study.get_trials(deepcopy=False)[trial.number])
        else:
            self.failed(trial, run, error_line(log, start, run_dir, code), code)

    def failed(self, trial, run: str, error: str, code: int | None) -> None:
        print(f"{run}: failed  {error}", flush=True)
        trial.set_user_attr("error", error)
        trial.set_user_attr("exit", code)
        self.study.tell(trial, state=FAIL)


def workers(argv: list[str], parallel: int) -> list[subprocess.Popen]:
    """--parallel N: N-1 more workers, this command again in processes tied to this one (signals reach them from
    it alone). Several trials on one accelerator: each takes memory as it needs it."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    command = [sys.executable, str(Path(__file__).resolve()), *argv, "--parallel", "1", "--worker"]
    preexec = parent_death_signal()
    return [
        subprocess.Popen([*command, str(i)], preexec_fn=preexec, start_new_session=True) for i in range(1, parallel)
    ]


def main(argv=None) -> int:
    """Exit status: 0 the study has its trials (some may have failed or been pruned), 1 none finished, 2 bad
    arguments or a database that did not answer for --database-wait seconds, 130/143 stopped by SIGINT/SIGTERM (the
    same command continues)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.storage and secrets_of(args.storage) and args.worker == 0:
        print(
            "warning: --storage holds a password, which other users of this machine can read in the process list "
            "(ps); leave it out of the URL and give it through PGPASSWORD or ~/.pgpass",
            file=sys.stderr,
        )
    try:
        sweep = define(args)
        study, storage = open_study(args, sweep)
        worker = Worker(sweep, study, storage, args)
    except SweepError as error:
        fail(str(error))
    except OSError as error:
        fail(f"cannot write the sweep folder: {error.filename or ''}: {error.strerror or error}")
    if args.worker == 0:
        print(f"sweep: {sweep.folder} (study {study.study_name}, {sweep.trials} trials; the same command,", end=" ")
        print("here or elsewhere, adds a worker or continues it)", flush=True)
    children = workers(argv, args.parallel) if args.parallel > 1 else []

    def on_signal(signum, frame):
        worker.stop(signum)
        for child in children:
            child.send_signal(signum)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        worker.run()
        for child in children:
            child.wait()
    except DatabaseLost as error:
        fail(str(error))
    except optuna.exceptions.StorageInternalError as error:  # the server went away in the middle of a call
        fail(f"--storage {masked_url(args.storage)}: {error_text(error.__cause__ or error, args.storage)}; {GOES_ON}")
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if args.worker:
        return 128 + worker.stop_signal if worker.stop_signal else 0
    try:  # a link planted in the folder while the sweep ran: refused, in one line
        best = report(sweep, study)
        if best is not None:  # what the trial ran, under the config's own name and save_dir (the sweep gave its folder)
            text = json.dumps(config_of(sweep, best["params"]), indent=2) + "\n"
            write_atomic(path := sweep.folder / "best" / "config.json", text.encode())
    except DatabaseLost as error:
        fail(str(error))
    except OSError as error:
        fail(f"cannot write the sweep's results: {error.filename or ''}: {error.strerror or error}")
    if best is not None:
        print(
            f"best: trial {best['trial']}, {sweep.metric} {best[sweep.metric]:.4f}; reproduce it with "
            f"python train.py -c {path}"
        )
    if worker.stop_signal is not None:
        print(f"stopped by {signal.Signals(worker.stop_signal).name}; the same command continues", file=sys.stderr)
        return 128 + worker.stop_signal
    return 0 if best is not None else 1


if __name__ == "__main__":
    sys.exit(command(main))
