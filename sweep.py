"""Hyperparameter sweep: every trial is a train.py run, recorded in a ledger, so a stopped sweep continues.

    python sweep.py -c config.json --grid optimizer.args.weight_decay=[0,0.05] \\
        --sample optimizer.schedule.args.peak_value=loguniform:1e-4:1e-2 --trials 20 [--parallel N] [--prune median]

Trials run in saved/<name>/sweep-<id>/trial-NNN/. The id is a hash of what defines the sweep (the config, --set,
--grid, --sample, --seed, --sampler, --prune), so the same command continues the same sweep: finished trials are kept,
a trial that was running resumes from its checkpoint, and the same trials are drawn. The folder also gets
ledger.jsonl, logs/, results.csv, the plots and best/config.json (train.py -c on it reproduces the best trial).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

from training.files import METRICS, write_atomic
from training.sweep_processes import Running, error_line, parent_death_signal
from training.sweep_results import plot, ranked, table, write_csv
from training.sweep_samplers import OptunaSampler, RandomSampler
from training.sweep_space import check_key, check_space, overrides, parse_grid, parse_sample, probes
from training.sweeps import (
    FINISHED,
    Ledger,
    SweepError,
    Trial,
    best_of,
    curve_of,
    hold,
    parse_prune,
    read_rows,
    trials_of,
)
from utils import ArgumentParser, ConfigError, fail, load_config, read_json

TRAIN = Path(__file__).resolve().parent / "train.py"
POLL_SECONDS = 0.25


def parse_args(argv=None):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-c", "--config", required=True, help="the config every trial starts from")
    parser.add_argument(
        "--set",
        dest="fixed",
        action="append",
        default=[],
        metavar="KEY.PATH=VALUE",
        help="a value every trial takes (JSON), e.g. --set trainer.epochs=1",
    )
    parser.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="KEY.PATH=[v1,v2,...]",
        help="values to try in turn; several --grid make their product",
    )
    parser.add_argument(
        "--sample",
        action="append",
        default=[],
        metavar="KEY.PATH=DIST",
        help="values to draw: uniform:LOW:HIGH, loguniform:LOW:HIGH, int:LOW:HIGH, choice:[...]",
    )
    parser.add_argument("--trials", type=int, help="how many trials (default: the grid's size; with --sample, 10)")
    parser.add_argument("--seed", type=int, default=0, help="the sweep's seed: which values are drawn (default 0)")
    parser.add_argument("--parallel", type=int, default=1, help="trials run at once (default 1)")
    parser.add_argument("--prune", default="off", help="median[:WARMUP_EPOCHS[:MIN_TRIALS]] or off (default)")
    parser.add_argument(
        "--sampler",
        default="random",
        help="random (default: grid in order, draws from the seed) or optuna:tpe (needs optuna)",
    )
    parser.add_argument("--id", help="the sweep folder's id (default: a hash of the sweep's definition)")
    parser.add_argument(
        "--retry-failed",
        action="store_true",
        help="run the trials recorded as failed again (once what failed them is fixed)",
    )
    return parser.parse_args(argv)


class Sweep(NamedTuple):
    config_path: str
    config: dict  # resolved, with --set
    fixed: list[str]
    params: list  # Param
    trials: int
    folder: Path
    mode: str
    metric: str
    sampler: object
    pruner: object
    parallel: int


def define(args) -> tuple[Sweep, dict]:
    """Checks every argument, and every swept key path and value against the config, before any trial starts."""
    if args.parallel < 1:
        raise SweepError(f"--parallel {args.parallel}: expected at least 1")
    params = [parse_grid(text) for text in args.grid] + [parse_sample(text) for text in args.sample]
    if not params:
        raise SweepError("nothing to sweep: give --grid KEY.PATH=[...] and/or --sample KEY.PATH=DISTRIBUTION")
    check_space(params, args.fixed)
    pruner = parse_prune(args.prune)
    source = Path(args.config).name
    try:
        config = load_config(args.config, args.fixed, source=source)
    except ConfigError as error:
        raise SweepError(str(error)) from None
    for param in params:
        check_key(config, param.key, source)
    for param, value, values in probes(params):
        try:
            load_config(args.config, args.fixed + overrides(values), source=source)
        except ConfigError as error:
            flag = "--grid" if param.kind == "grid" else "--sample"
            raise SweepError(f"{flag} {param.key}={json.dumps(value)}: {error}") from None
    if config["trainer"]["monitor"] == "off":
        raise SweepError(
            f"{source}: trainer.monitor is off; a sweep ranks trials by it (--set 'trainer.monitor=max val/accuracy')"
        )
    mode, metric = config["trainer"]["monitor"].split(" ", 1)

    grid_size = 1
    for param in params:
        grid_size *= len(param.values) if param.kind == "grid" else 1
    sampled = any(p.kind != "grid" for p in params)
    trials = args.trials if args.trials is not None else (10 if sampled else grid_size)
    if trials < 1:
        raise SweepError(f"--trials {trials}: expected at least 1")
    if not sampled and trials > grid_size and args.sampler == "random":
        raise SweepError(
            f"--trials {trials}: the grid has {grid_size} point{'s' * (grid_size > 1)}; add --sample to draw more"
        )
    kind, _, algorithm = args.sampler.partition(":")
    if kind == "optuna":
        sampler = OptunaSampler(algorithm or "tpe", params, args.seed, mode)
    elif args.sampler == "random":
        sampler = RandomSampler(params, args.seed)
    else:
        raise SweepError(f"--sampler {args.sampler}: expected random or optuna:tpe")

    definition = {
        "config": read_json(args.config),
        "set": args.fixed,
        "grid": args.grid,
        "sample": args.sample,
        "seed": args.seed,
        "sampler": args.sampler,
        "prune": args.prune,
    }
    sweep_id = args.id or hashlib.sha256(json.dumps(definition, sort_keys=True).encode()).hexdigest()[:8]
    if not sweep_id.replace("-", "").replace("_", "").isalnum() or len(sweep_id) > 64:
        raise SweepError(f"--id {sweep_id!r}: expected letters, digits, '-' or '_'")
    folder = Path(config["trainer"]["save_dir"]) / config["name"] / f"sweep-{sweep_id}"
    sweep = Sweep(args.config, config, args.fixed, params, trials, folder, mode, metric, sampler, pruner, args.parallel)
    return sweep, definition


class Runner:
    """Starts trials, watches their metrics.jsonl for pruning, records how each ended."""

    def __init__(self, sweep: Sweep, ledger: Ledger, trials: dict[int, Trial]):
        self.sweep, self.ledger, self.trials = sweep, ledger, trials
        self.running: dict[int, Running] = {}
        self.curves = {i: list(t.curve) for i, t in trials.items()}
        self.checked: dict[int, int] = {}  # the last epoch the pruner looked at, per running trial
        self.pruned: dict[int, dict] = {}  # trials told to stop, with the pruner's reason
        self.stop_signal = None
        self.preexec = parent_death_signal()
        (sweep.folder / "logs").mkdir(exist_ok=True)

    def run_dir(self, trial: Trial) -> Path:
        return self.sweep.folder / trial.run

    def start(self, index: int) -> None:
        sweep = self.sweep
        before = self.trials.get(index)
        params = before.params if before else sweep.sampler.params(index)
        run = f"trial-{index:03d}"
        self.ledger.append(
            {
                "event": "start",
                "trial": index,
                "params": params,
                "run": run,
                "resume": before is not None,
                "time": time.time(),
            }
        )
        self.trials[index] = trial = Trial(index, params, run, "running", seconds=before.seconds if before else 0.0)
        self.curves.setdefault(index, [])
        try:  # a combination the probes did not try: no process needed to learn it is refused
            load_config(sweep.config_path, sweep.fixed + overrides(params), source=Path(sweep.config_path).name)
        except ConfigError as error:
            self.end(index, "failed", error=f"error: {error}", exit=2)
            return
        command = [sys.executable, str(TRAIN), "-r", "auto", "-c", sweep.config_path, "--run-id", run]
        # last, so that the trial's folder is saved/<name>/sweep-<id>/trial-NNN whatever --set said
        for text in (
            sweep.fixed
            + overrides(params)
            + [f"name={json.dumps(sweep.folder.name)}", f"trainer.save_dir={json.dumps(str(sweep.folder.parent))}"]
        ):
            command += ["--set", text]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if sweep.parallel > 1:  # several trials on one accelerator: each takes memory as it needs it
            env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        log = sweep.folder / "logs" / f"{run}.log"
        with open(log, "ab") as out:
            out.write(f"$ {' '.join(command)}\n".encode())
            out.flush()
            log_start = out.tell()
            try:
                process = subprocess.Popen(
                    command,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    start_new_session=True,
                    preexec_fn=self.preexec,
                )
            except OSError as error:
                self.end(index, "failed", error=f"cannot start train.py: {error.strerror or error}")
                return
        self.running[index] = Running(process, time.monotonic(), log, log_start, self.run_dir(trial))
        self.checked[index] = 0
        if self.stop_signal is not None:  # it came while the process was being started
            process.send_signal(self.stop_signal)
        print(
            f"trial {index}: {'resumed' if before else 'started'}  "
            + "  ".join(f"{k}={json.dumps(v)}" for k, v in params.items()),
            flush=True,
        )

    def end(self, index: int, status: str, seconds: float = 0.0, **extra) -> None:
        curve = self.curves.get(index, [])
        value, epoch = best_of(curve, self.sweep.mode)
        if status == "pruned":
            value, epoch = curve[extra["epoch"] - 1], extra["epoch"]
        record = {
            "event": "end",
            "trial": index,
            "status": status,
            "value": value,
            "epoch": epoch,
            "epochs": len(curve),
            "seconds": round(seconds, 2),
            "curve": curve,
            **extra,
            "time": time.time(),
        }
        self.ledger.append(record)
        self.trials[index] = trial = self.trials[index]._replace(
            status=status,
            value=value,
            epoch=epoch,
            epochs=len(curve),
            seconds=self.trials[index].seconds + seconds,
            error=extra.get("error", ""),
            curve=tuple(curve),
        )
        self.sweep.sampler.tell(index, trial.params, status, value)
        shown = "" if value is None else f"  {self.sweep.metric} {value:.4f} (epoch {epoch})"
        why = f"  {extra['error']}" if extra.get("error") else ""
        if status == "pruned":
            why = (
                f"  below the median {extra['median']:.4f} of earlier trials at epoch {extra['epoch']}"
                if self.sweep.mode == "max"
                else f"  above the median {extra['median']:.4f} of earlier trials at epoch {extra['epoch']}"
            )
        print(f"trial {index}: {status}{shown}{why}", flush=True)

    def watch(self) -> None:
        """Reads each running trial's new epochs, prunes, and records the trials that exited."""
        for index, running in list(self.running.items()):
            code = running.process.poll()
            rows = read_rows(running.run_dir / METRICS)
            self.curves[index] = curve_of(rows, self.sweep.metric)
            if code is None:
                self.prune(index)
                continue
            del self.running[index]
            seconds = time.monotonic() - running.started
            reason = self.pruned.pop(index, None)
            if reason is not None and code in (130, 143):
                self.end(index, "pruned", seconds, **reason)
            elif code == 0:  # a pruned trial may have ended on its own before the signal came
                value, _ = best_of(self.curves[index], self.sweep.mode)
                if value is None:
                    self.end(index, "failed", seconds, exit=0, error=f"no {self.sweep.metric} in metrics.jsonl")
                else:
                    self.end(index, "done", seconds)
            elif code in (130, 143) and self.stop_signal is not None:
                self.ledger.append(
                    {"event": "stopped", "trial": index, "seconds": round(seconds, 2), "time": time.time()}
                )
                self.trials[index] = self.trials[index]._replace(seconds=self.trials[index].seconds + seconds)
            else:
                self.end(index, "failed", seconds, exit=code, error=error_line(running))

    def prune(self, index: int) -> None:
        pruner, curve = self.sweep.pruner, self.curves[index]
        if pruner is None or index in self.pruned:
            return
        for epoch in range(self.checked[index] + 1, len(curve) + 1):
            self.checked[index] = epoch
            earlier = [
                self.curves[j][epoch - 1]
                for j, t in self.trials.items()
                if j < index
                and t.status in ("done", "running")
                and j not in self.pruned
                and len(self.curves.get(j, [])) >= epoch
                and self.curves[j][epoch - 1] is not None
            ]
            median = pruner.check(epoch, curve[epoch - 1], earlier, self.sweep.mode)
            if median is not None:
                self.pruned[index] = {"epoch": epoch, "median": median}
                self.running[index].process.send_signal(signal.SIGTERM)  # train.py saves and exits 143
                return

    def stop(self, signum: int) -> None:
        """First signal: every trial saves and exits (resumable); a second Ctrl-C stops them at once."""
        again = self.stop_signal is not None
        self.stop_signal = self.stop_signal or signum
        for running in self.running.values():
            if running.process.poll() is None:
                running.process.send_signal(signal.SIGINT if again else signum)


def report(sweep: Sweep, trials: dict[int, Trial]) -> Trial | None:
    """The table (printed), results.csv, the plots and best/config.json; returns the best trial."""
    keys = [p.key for p in sweep.params]
    order = ranked(list(trials.values()), sweep.mode)
    print(f"\n{sweep.folder}: {len(trials)} of {sweep.trials} trials, {sweep.mode} {sweep.metric}, best first")
    print(table(order, keys, sweep.metric))
    write_csv(sweep.folder / "results.csv", order, keys, sweep.metric)
    best = next((t for t in order if t.status == "done"), None)
    try:
        written = plot(sweep.folder, order, sweep.params, sweep.metric, sweep.mode)
        print(f"plots: {', '.join(str(p) for p in written)}")
    except Exception as error:  # a figure must never hide the results
        print(f"plots not drawn: {type(error).__name__}: {error}", file=sys.stderr)
    if best is not None:
        # what the trial ran, under the config's own name and save_dir (the sweep gave the trial its folder)
        config = load_config(
            sweep.config_path, sweep.fixed + overrides(best.params), source=Path(sweep.config_path).name
        )
        write_atomic(sweep.folder / "best" / "config.json", (json.dumps(config, indent=2) + "\n").encode())
        print(
            f"best: trial {best.index}, {sweep.metric} {best.value:.4f}; reproduce it with "
            f"python train.py -c {sweep.folder / 'best' / 'config.json'}"
        )
    return best


def main(argv=None) -> int:
    """Exit status: 0 every trial ended (some may have failed or been pruned), 1 none finished, 2 bad arguments,
    130/143 stopped by SIGINT/SIGTERM (the same command continues)."""
    args = parse_args(argv)
    try:
        sweep, definition = define(args)
        sweep.folder.mkdir(parents=True, exist_ok=True)
        hold(sweep.folder)
        ledger = Ledger(sweep.folder / "ledger.jsonl")
        records = ledger.records()
        if not records:
            ledger.append({"event": "sweep", "definition": definition, "time": time.time()})
        elif records[0].get("definition") != definition:
            changed = sorted(k for k in definition if records[0].get("definition", {}).get(k) != definition[k])
            raise SweepError(
                f"{sweep.folder}: this sweep was started with other settings ({', '.join(changed)} "
                f"differ); use another --id, or the same arguments to continue it"
            )
    except SweepError as error:
        fail(str(error))
    except OSError as error:
        fail(f"cannot write the sweep folder: {error.filename or ''}: {error.strerror or error}")
    trials = trials_of(records)
    for trial in trials.values():
        if trial.status in FINISHED:
            sweep.sampler.tell(trial.index, trial.params, trial.status, trial.value)
    sweep.sampler.resume(len(trials))
    runner = Runner(sweep, ledger, trials)
    done = sum(t.status in FINISHED for t in trials.values())
    failed = sum(t.status == "failed" for t in trials.values())
    retry = f"; {failed} failed, --retry-failed reruns them" if failed and not args.retry_failed else ""
    print(
        f"sweep: {sweep.folder} ({done} of {sweep.trials} trials already ended{retry}; rerun the same command to "
        f"continue after a stop)",
        flush=True,
    )

    previous = {s: signal.signal(s, lambda signum, frame: runner.stop(signum)) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        again = ("running", "failed") if args.retry_failed else ("running",)
        pending = [i for i in range(sweep.trials) if trials.get(i) is None or trials[i].status in again]
        while (pending or runner.running) and not (runner.stop_signal and not runner.running):
            while pending and len(runner.running) < args.parallel and runner.stop_signal is None:
                runner.start(pending.pop(0))
            time.sleep(POLL_SECONDS)
            runner.watch()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    for index, trial in runner.trials.items():  # a trial stopped with the sweep shows how far it got
        if trial.status == "running" and runner.curves.get(index):
            value, epoch = best_of(runner.curves[index], sweep.mode)
            runner.trials[index] = trial._replace(value=value, epoch=epoch, curve=tuple(runner.curves[index]))
    best = report(sweep, runner.trials)
    if runner.stop_signal is not None:
        left = sum(runner.trials.get(i) is None or runner.trials[i].status == "running" for i in range(sweep.trials))
        print(
            f"stopped by {signal.Signals(runner.stop_signal).name}: {left} trials to go; the same command continues",
            file=sys.stderr,
        )
        return 128 + runner.stop_signal
    return 0 if best is not None else 1


if __name__ == "__main__":
    sys.exit(main())
