"""Train a model from a JSON config:  python train.py -c config.json [-r CHECKPOINT] [--set key.path=value ...]"""

from __future__ import annotations

if __name__ == "__main__":  # before anything imports JAX; may re-execute once (TRAIN_PLATFORM_DEFAULTS=0: off)
    import sys

    from training.devices import platform

    if sys.stdout is not None and sys.stderr is not None:  # a closed one is refused in one line by `command`
        platform.apply()

import json
import logging
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from files.writes import CONFIG, LATEST, METRICS
from signals import stops
from training.assembly import assemble
from training.buckets import store as buckets  # [feature: buckets]
from training.config.components import components_text
from training.config.file import ConfigError, config_hash
from training.config.validation import load_config
from training.devices import compilation_cache, mesh, platform
from training.processes import launch  # [feature: processes]
from training.run import debug_modes, lifecycle, location
from training.run.checkpoint import check_checkpoint_file
from training.run.cli import ArgumentParser, command, fail, setup_logging
from training.run.figures import plots
from training.run.folder import write_run_files
from training.tracking import config as tracking  # [feature: tracking]
from training.tracking.trackers import start_trackers  # [feature: tracking]

log = logging.getLogger("train")


def parse_args(argv=None):
    parser = ArgumentParser(description=__doc__, epilog="more: docs/runs.md (resuming, debug modes, several processes)")
    add = parser.add_argument
    add("-c", "--config", help="config file (default: the resumed run's config.json)")
    add(
        "-r",
        "--resume",
        help="checkpoint to continue from (e.g. saved/<name>/<run>/checkpoint-latest.params), or auto: the run named "
        "by --run-id if it has a checkpoint, else a new run of that name",
    )
    add("--weights", help="initialise params/state from this checkpoint, then train afresh (fine-tuning)")
    add("--exclude", action="append", default=[], metavar="KEY.PATH", help="with --weights: keep this prefix fresh")
    add(
        "--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE", help="override; VALUE is JSON"
    )
    add("--lr", type=float, help="alias of --set optimizer.args.lr=LR")
    add("--bs", type=int, help="alias of --set data_loader.train.args.batch_size=BS")
    add("--epochs", type=int, help="alias of --set trainer.epochs=N")
    add("--run-id", help="run folder name (default: a timestamp)")
    add(
        "--list",
        nargs="*",
        metavar="KIND",
        help="print the components a config may name, with their arguments, and exit: every kind, or those named "
        "(model, loss, metrics, optimizer, transforms, schedule, data_loader, augment, callbacks, layers)",
    )
    debug = parser.add_argument_group("debug modes").add_argument
    debug(
        "--fast-dev-run",
        action="store_true",
        help="one step of train, validation and test, a checkpoint written and read back, in a throw-away run "
        "folder: a config smoke test in seconds",
    )
    debug("--limit-batches", type=int, metavar="N", help="at most N batches per epoch of every split")
    debug(
        "--overfit-batches",
        type=int,
        metavar="N",
        help="train on the same first N batches every epoch and validate on them (the loss must fall to near zero, "
        "or the model, loss or data has a bug)",
    )
    debug("--detect-nans", action="store_true", help="stop at the first operation that makes a NaN, naming its line")
    debug("--no-jit", action="store_true", help="run every step op by op (jax.disable_jit) to debug inside it; slow")
    launch.add_arguments(parser)  # --coordinator, --num-processes, ... [feature: processes]
    return parser.parse_args(argv)


def main(argv=None) -> int:
    """Exit status: 0 trained, 1 the run stopped on an error (divergence, a failed write), 2 bad input (config,
    data, checkpoint, a run folder in use or not writable, a new run diverging before its first checkpoint: nothing
    was written, or it was removed again), 130/143/138 stopped by
    SIGINT/SIGTERM/SIGUSR1 after saving the position (continue with -r)."""
    with stops.noted_until_safe_points():
        try:
            return start_to_finish(parse_args(argv))
        except (Exception, KeyboardInterrupt, stops.Interrupted) as error:
            stop = stops.signal_in(error)
            if stop is None:
                raise
            signum = getattr(stop, "signum", signal.SIGINT)
            print(f"error: {stops.stopped_at_start_up(signum)}", file=sys.stderr)
            return 128 + signum


def start_to_finish(args) -> int:
    """The run in order: config, data, state, run folder, training, exit status. Between phases a stop signal
    ends the start-up (``stops.safe_point``); nothing is loaded or compiled before the config passed."""
    if args.list is not None:
        return list_components(args.list or ["all"])
    setup_logging(None)  # the console until the run folder exists
    launch.start(args)  # jax.distributed, before anything touches a device [feature: processes]
    config, resume_dir, run = read_config(args)
    compilation_cache.use()  # the machine's, before anything compiles
    stops.safe_point()
    loaders = load_data(args, config, run)
    stops.safe_point()
    recorded = config  # what config.json and every checkpoint's header hold
    recorded = buckets.as_given(config)  # [feature: buckets] the bucket's URL as save_dir, not its staging folder
    with lifecycle.opened(
        config,
        Path(args.resume) if args.resume else None,
        resume_dir,
        load_state=lambda: load_state(args, config, run, resume_dir, recorded),
        write=lambda run_dir: write_run_files(run_dir, recorded, run, new=not resume_dir),
        exact=getattr(args, "exact_run_dir", False),
        here=buckets.here,  # [feature: buckets] each process stages its own copy of a bucket's run folder
    ) as (trainer, folder):
        buckets.attach(trainer.checkpoints, folder.path, folder.existed is not None)  # [feature: buckets] saves copied
        trackers = describe_run(args, config, run, trainer, folder)
        status = 1
        try:
            status = run_loop(args, config, loaders, trainer, folder)
        finally:
            if mesh.is_main():  # a --fast-dev-run's folder goes at the end: no curves to point into it
                finish(folder.path, trackers, status, trainer.lr_fn, curves=not args.fast_dev_run)
                buckets.finish(folder.path)  # [feature: buckets] the log's last lines, the figures
            if args.fast_dev_run:
                shutil.rmtree(config["trainer"]["save_dir"], ignore_errors=True)
    mesh.finish_processes()  # several processes: each waits here until all are done
    if folder.discarded:
        fail(folder.discarded)
    return status


def list_components(kinds: list[str]) -> int:
    try:
        print("\n".join([components_text(kind) for kind in kinds]))  # every kind checked before any is printed
    except ConfigError as error:
        fail(str(error))
    return 0


def read_config(args):
    """The config read, overridden, validated and built into the run's components (``assemble``: no data yet)."""
    try:
        config, resume_dir = resolve_config(args)
        if not resume_dir and not args.fast_dev_run:
            location.check_not_linked(config)
        run = assemble(config, source_of(args))  # every component, and the optimizer's checks
        tracking.assign_wandb_id(config, resume_dir)  # [feature: tracking] a new run folder is named after it
    except ConfigError as error:
        fail(str(error))
    if args.fast_dev_run:  # a throw-away folder, no trackers: nothing of the check outlives it
        config["trainer"]["save_dir"] = tempfile.mkdtemp(prefix="fast-dev-run-")
        tracking.switch_off(config)  # [feature: tracking]
    return config, resume_dir, run


def source_of(args) -> str:
    return Path(args.config).name if args.config else CONFIG


def load_data(args, config: dict, run) -> dict:
    """The loaders: every shape and dtype the run compiles for comes from one real batch (the loader's spec)."""
    source = source_of(args)
    try:
        loaders = run.load_data()  # schedules count the steps of this data (debug modes below cut it, not them)
        run.check_data()
        debug_modes.limit_data(args, config, loaders)
        for i, callback in enumerate(run.callbacks):
            try:
                callback.check(loaders["train"])
            except ValueError as error:
                raise ConfigError(f"{source}: callbacks.{i}: {callback.name}: {error}") from None
    except ConfigError as error:
        fail(str(error))
    except ValueError as error:  # a dataset whose batches the loop cannot take
        fail(f"{source}: data_loader: {error}")
    return loaders


def load_state(args, config: dict, run, resume_dir: Path | None, recorded: dict):
    """The trainer with its state: fresh, resumed, or initialised from another run's weights. ``recorded``: the
    config as the run folder records it."""
    from training import startup
    from training.trainer import Trainer

    trainer = Trainer(
        run,
        resume_dir,
        config_hash=config_hash(config),
        recorded=recorded,
        execution="eager" if args.no_jit else "jit" if args.detect_nans else "aot",
    )
    startup.check_memory(trainer)
    if args.resume:
        trainer.begin(startup.from_checkpoint(trainer, Path(args.resume)))
        check_position(trainer.start, Path(args.resume), config["trainer"]["epochs"])
        check_extension(trainer, Path(args.resume), config)
    elif args.weights:
        trainer.begin(startup.from_weights(trainer, Path(args.weights), exclude=tuple(args.exclude)))
    else:
        trainer.begin(startup.from_seed(trainer))
    startup.check_compiled_memory(trainer)  # the step compiled beside the state's loading: its figures, before a write
    return trainer


def describe_run(args, config: dict, run, trainer, folder) -> list:
    """The run's first log lines, and its trackers (process 0's)."""
    import jax

    from training import startup

    temporary = " (a temporary one, removed at the end)" if args.fast_dev_run else ""
    log.info(f"run folder: {folder.path}{temporary}")
    for line in folder.repaired + trainer.start.notes:
        log.info(f"resume: {line}")
    ignored = platform.unused_accelerator({d.platform for d in jax.devices()})
    if ignored:
        log.warning(ignored)
    for line in startup.describe(trainer):
        log.info(line)
    monitored = run.monitor.name if run.monitor else None
    trackers: list = []  # the optional feature's trackers, on process 0 only
    trackers += start_trackers(config, folder.path, monitored) if mesh.is_main() else []  # [feature: tracking]
    trainer.trackers = trackers
    return trackers


def run_loop(args, config: dict, loaders: dict, trainer, folder) -> int:
    """Runs the training loop and turns how it ended into the exit status (``main``); a stop signal from here on
    saves the position first."""
    import jax

    from training.run.checkpoint import CheckpointError
    from training.run.folder import RunFolderError
    from training.trainer import Stopped, TrainingDiverged

    stops.stop_at_next_step(trainer.stops)
    try:
        jax.config.update("jax_debug_nans", args.detect_nans)
        with jax.disable_jit(args.no_jit):
            best = trainer.train()
        if args.fast_dev_run:
            debug_modes.fast_dev_checks(trainer, loaders, folder.path)
        else:
            log.info(done_line(config["trainer"]["monitor"], best, folder.path, args))
        return 0
    except TrainingDiverged as error:
        if not folder.kept_nothing():
            log.error(str(error))
            return 1
        folder.discard(
            f"{error}; the run folder {folder.path} was removed, as it held nothing to continue from (is the "
            f"learning rate, {float(trainer.lr_fn(0)):g} at the first step, too high?)"
        )
        return 2
    except (RunFolderError, CheckpointError) as error:
        log.error(str(error))
    except FloatingPointError as error:  # --detect-nans found the operation
        log.error(debug_modes.nan_report(error))
    except (Stopped, KeyboardInterrupt, stops.Interrupted) as stop:
        status = 128 + getattr(stop, "signum", signal.SIGINT)
        saved = f" ({stop})" if isinstance(stop, Stopped) else " at once"
        latest = folder.path / LATEST
        follow = (
            f"continue with: python train.py -r {latest}"
            if latest.is_file()
            else "no checkpoint was written, so there is nothing to continue from"
        )
        log.info(f"stopped by {signal.Signals(status - 128).name}{saved}; {follow}")
        return status
    return 1


def resolve_config(args) -> tuple[dict, Path | None]:
    """The validated config (file, then --set and aliases) and the run folder to continue, if resuming."""
    resume_dir = None
    if args.fast_dev_run and args.resume:
        raise ConfigError("--fast-dev-run checks a config on a fresh run; it does not take -r")
    if args.resume == "auto":
        return resolve_auto(args)
    args.resume, args.weights = buckets.fetched(args.resume), buckets.fetched(args.weights)  # [feature: buckets]
    if args.resume:
        resume = Path(args.resume)
        check_checkpoint_file(resume, "-r")
        resume_dir = location.run_folder_of(resume)  # None: continued in a new run folder under save_dir
    if args.weights:
        check_checkpoint_file(Path(args.weights), "--weights")
    config_path = args.config or (resume_dir / CONFIG if resume_dir else None)
    if config_path is None:
        raise ConfigError(location.no_config(args.resume))
    overrides = list(args.overrides)
    if args.lr is not None:
        overrides.append(f"optimizer.args.lr={args.lr}")
    if args.bs is not None:
        overrides.append(f"data_loader.train.args.batch_size={args.bs}")
    if args.epochs is not None:
        overrides.append(f"trainer.epochs={args.epochs}")
    if args.run_id is not None:
        overrides.append(f"trainer.run_id={json.dumps(args.run_id)}")
    for flag in ("limit_batches", "overfit_batches"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            value = getattr(args, flag)
            raise ConfigError(f"--{flag.replace('_', '-')}: expected a number of batches >= 1, got {value}")
    config = load_config(config_path, overrides, source=Path(config_path).name)
    buckets.stage(config)  # [feature: buckets] an s3:// or gs:// save_dir checked, and staged in a local folder
    if resume_dir and not args.config:  # the run folder's own config: where it may write is checked
        location.check_config_writes(config, resume_dir)
    if args.exclude and not args.weights:
        raise ConfigError("--exclude applies to --weights (fine-tuning from another run's checkpoint)")
    if args.lr is not None and "schedule" in config["optimizer"]:
        raise ConfigError(
            "--lr: the learning rate comes from optimizer.schedule; set its args with --set "
            "optimizer.schedule.args.<name>=VALUE"
        )
    return config, resume_dir


def resolve_auto(args) -> tuple[dict, Path | None]:
    """``-r auto``: one command for a job that may be requeued. The run named by --run-id (or trainer.run_id)
    continues from its checkpoint-latest.params when it has one, and starts under exactly that name otherwise."""
    if not args.config:
        raise ConfigError("-r auto: give the config with -c (and the run's name with --run-id)")
    args.resume = None
    config, _ = resolve_config(args)
    buckets.fetch_named(config)  # [feature: buckets] the run in the bucket, if it is there
    run_dir = location.named_run(config)
    args.exact_run_dir = True
    if (run_dir / LATEST).is_file():
        args.resume = str(run_dir / LATEST)
        return config, run_dir
    return config, None


def check_position(start, path: Path, epochs: int) -> None:
    """A checkpoint past the configured end (a later epoch, or inside one) would train and write epochs the config
    never asked for; one at the end itself has nothing left to train and ends at once. `start`: the run's
    (``training.startup.Start``)."""
    from training.run.checkpoint import CheckpointError

    if start.epoch + bool(start.position) > epochs:
        where = (
            f"{start.position} step(s) into epoch {start.epoch + 1}"
            if start.position
            else f"the end of epoch {start.epoch}"
        )
        raise CheckpointError(
            f"{path}: saved at {where}, past trainer.epochs {epochs}: nothing to train; continue "
            f"it with --epochs N, N > {start.epoch}"
        )


def check_extension(trainer, path: Path, config: dict) -> None:
    """A finished run extended past the length its schedules count (``--epochs``) trains its extra epochs where
    the schedule ended: refused where that is a learning rate of 0, which would train nothing."""
    from training.config.components import run_length_arguments
    from training.run.checkpoint import CheckpointError

    epochs, length = config["trainer"]["epochs"], trainer.run.epochs
    places = run_length_arguments(config)
    if not places or epochs <= length:
        return
    if trainer.applied_lr(length * trainer.run.steps_per_epoch) == 0.0:  # the first step past the schedule's end
        raise CheckpointError(
            f"{path}: its {epochs - length} extra epoch(s) would train at learning rate 0, where the schedule "
            f"ended ({', '.join(places)} count the {length} epochs the run started with); stretch it over the "
            f"{epochs} epochs in steps (--set {places[0]}=N), give it an end value above 0, or start a new run from "
            f"these weights (--weights)"
        )


def done_line(monitor: str, best, run_dir: Path, args) -> str:
    """The run's last line: the best monitored value to six significant digits (a float32's noise left out), and
    where the checkpoints are, or that none were written (an lr_finder run that stopped after its range test)."""
    said = [] if best is None or monitor == "off" else [f"best {monitor} = {float(best):.6g}"]
    if any(run_dir.glob("*.params")):
        said.append(f"checkpoints in {run_dir}")
    else:
        said.append(f"no checkpoint written (the run's files are in {run_dir})")
    if args.overfit_batches:  # a check, not a model to keep: its folder stays for its curves, like any run's
        said.append("an --overfit-batches check: remove the folder when done")
    return "done: " + "; ".join(said)


def finish(run_dir: Path, trackers: list, status: int, lr_fn=None, curves: bool = True) -> None:
    """curves.png from metrics.jsonl (``lr_fn``: the learning rate of every step), then the trackers' last words;
    neither can change how the run ends. ``curves`` False: none (a --fast-dev-run's folder is removed at the end)."""
    figures = plots()
    if curves and figures is not None and (run_dir / METRICS).is_file():
        try:
            log.info(f"curves: {figures.plot_run(run_dir, lr_fn=lr_fn)}")
        except Exception as error:
            log.warning(f"curves.png not drawn: {type(error).__name__}: {error}")
    for tracker in trackers:
        try:
            tracker.close(status)
        except Exception as error:
            log.warning(f"{type(tracker).__name__}.close: {type(error).__name__}: {error}")


if __name__ == "__main__":
    sys.exit(command(main))
