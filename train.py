"""Train a model from a JSON config:  python train.py -c config.json [-r CHECKPOINT] [--set key.path=value ...]"""

from __future__ import annotations

if __name__ == "__main__":  # before anything imports JAX; may re-execute once (TRAIN_PLATFORM_DEFAULTS=0: off)
    from training.devices import platform

    platform.apply()

import json
import logging
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from training import processes
from training.devices import mesh, platform
from training.files.writes import CONFIG, LATEST, METRICS
from training.run import debug_modes, location, signals
from training.run.checkpoint import check_checkpoint_file
from training.run.cli import command
from training.tracking.trackers import start_trackers
from utils import (
    ArgumentParser,
    ConfigError,
    assemble,
    components_text,
    config_hash,
    fail,
    load_config,
    setup_logging,
    write_run_files,
)

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
        nargs="?",
        const="all",
        metavar="KIND",
        help="print the components a config may name, with their arguments, and exit: every kind, or one (model, "
        "loss, metrics, optimizer, transforms, schedule, data_loader, augment, callbacks), or the layers",
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
    processes.add_arguments(parser)  # several processes: --coordinator, --num-processes, ...
    return parser.parse_args(argv)


def main(argv=None) -> int:
    """Exit status: 0 trained, 1 the run stopped on an error (divergence, a failed write), 2 bad input (config,
    data, checkpoint, a run folder in use or not writable, a new run diverging before its first checkpoint: nothing
    was written, or it was removed again), 130/143/138 stopped by
    SIGINT/SIGTERM/SIGUSR1 after saving the position (continue with -r)."""
    with signals.noted_until_safe_points():
        try:
            return run(parse_args(argv))
        except (Exception, KeyboardInterrupt, signals.Interrupted) as error:
            stop = signals.signal_in(error)
            if stop is None:
                raise
            signum = getattr(stop, "signum", signal.SIGINT)
            print(f"error: {signals.stopped_at_start_up(signum)}", file=sys.stderr)
            return 128 + signum


def run(args) -> int:
    if args.list:
        try:
            print(components_text(args.list))
        except ConfigError as error:
            fail(str(error))
        return 0
    setup_logging(None)  # the console until the run folder exists
    processes.start(args)  # several processes: jax.distributed starts before anything touches a device
    # 1. Config: read, override, validate, build. Nothing is loaded or compiled before this passes.
    try:
        config, resume_dir = resolve_config(args)
        if not resume_dir and not args.fast_dev_run:
            location.check_not_linked(config)
        source = Path(args.config).name if args.config else CONFIG
        run = assemble(config, source)  # every component, and the optimizer's checks; no data yet
        location.assign_wandb_id(config, resume_dir)
    except ConfigError as error:
        fail(str(error))
    if args.fast_dev_run:  # a throw-away folder, no trackers: nothing of the check outlives it
        config["trainer"]["save_dir"] = tempfile.mkdtemp(prefix="fast-dev-run-")
        config["wandb"]["enabled"] = config["tensorboard"]["enabled"] = False

    signals.safe_point()
    # 2. Data: every shape and dtype the run compiles for comes from one real batch (the loader's spec).
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

    signals.safe_point()
    import jax

    from training.run import folder as run_folder
    from training.run.checkpoint import CheckpointError, remove_stale_temps
    from training.trainer import Stopped, Trainer, TrainingDiverged

    # 3. State: fresh, resumed, or initialised from another run's weights. A failure here leaves no run folder;
    # a resumed run's folder is held by this process from here on and changed only once its checkpoint loaded.
    try:
        lock = run_folder.hold(resume_dir, mark=False) if resume_dir and mesh.is_main() else None
        trainer = Trainer(
            run,
            resume_dir,
            config_hash=config_hash(config),
            execution="eager" if args.no_jit else "jit" if args.detect_nans else "aot",
        )
        trainer.state.check_memory()
        if args.resume:
            trainer.restore(Path(args.resume))
            check_position(trainer, Path(args.resume), config["trainer"]["epochs"])
        else:
            trainer.init_state()
            if args.weights:
                trainer.load_weights(Path(args.weights), exclude=tuple(args.exclude))
    except (CheckpointError, ValueError, run_folder.RunFolderError) as error:
        stop_all(str(error))

    signals.safe_point()
    # 4. Run folder: resolved config, what a user of the weights needs (model code, preprocessing), logs.
    existed = None  # a run folder this process made: the deepest part of its path that existed before (remove_new)
    try:
        if not mesh.is_main():  # process 0 writes the folder; the others only learn where it is
            run_dir, repaired = Path(mesh.share_text("run_dir")), []
        elif resume_dir:
            run_dir = resume_dir
            if lock is None:  # a folder without a lock file: made now that its checkpoint loaded
                run_folder.hold(run_dir)
            else:
                run_folder.mark_holder(lock)
            repaired = run_folder.reconcile(
                run_dir, Path(args.resume), trainer.resumed_header, config["trainer"]["save_period"]
            )
        else:
            parent, run_id = Path(config["trainer"]["save_dir"]) / config["name"], location.run_id_of(config)
            existed = run_folder.first_existing(parent / run_id)  # what a failed start leaves as it was
            run_dir = run_folder.create(parent, run_id, exact=getattr(args, "exact_run_dir", False))
            if existed == run_dir:  # -r auto reusing the folder of an attempt that ended before its first checkpoint
                existed = None
            run_folder.hold(run_dir)
            # -r auto reusing the folder of an attempt killed before its first checkpoint was on disk
            repaired = [f"removed an interrupted write: {p.name}" for p in remove_stale_temps(run_dir)]
        trainer.run_dir = run_dir
        if mesh.is_main():
            write_run_files(run_dir, config, run, new=not resume_dir)  # config, preprocessing, a new run's model/
            setup_logging(run_dir)
            mesh.share_text("run_dir", str(run_dir))
        else:
            log.setLevel(logging.WARNING)  # process 0 reports the run; the others only their own errors
    except (run_folder.RunFolderError, mesh.DistributedError) as error:
        stop_all(str(error))
    except OSError as error:  # a full or read-only disk: a new run's folder goes again, nothing half-made stays
        removed = (
            "; the run folder was removed again"
            if existed is not None and run_folder.remove_new(run_dir, existed)
            else ""
        )
        stop_all(f"cannot write in the run folder: {run_folder.os_error_text(error)}{removed}")
    logging.raiseExceptions = False  # a full disk must not print a traceback per log line; the next write fails
    from model.summary import describe_batch, summary

    log.info(f"run folder: {run_dir}" + (" (a temporary one, removed at the end)" if args.fast_dev_run else ""))
    for line in repaired + trainer.resume_notes:
        log.info(f"resume: {line}")
    log.info(
        f"devices: {', '.join(str(d) for d in jax.devices())}; {mesh.describe_processes()}, mesh "
        f"{dict(trainer.state.mesh.shape)}"
    )
    ignored = platform.unused_accelerator({d.platform for d in jax.devices()})
    if ignored:
        log.warning(ignored)
    log.info(f"batch: {describe_batch(trainer.state.batch_spec)}")
    log.info(f"state: {trainer.origin}")
    for spec, callback in zip(config["callbacks"], run.callbacks):
        if callback.evaluated:  # what is evaluated and saved is not what the optimizer updates: said once, here
            log.info(
                f"weights: evaluation, model_best, test.py and the export use {callback.name}'s parameters "
                f"(callbacks: {json.dumps(spec)}), not the trained ones"
            )
    trainable = trainer.state.optimizer.trainable  # None unless optimizer.frozen names some parameters
    params, spec = trainer.ts["params"], trainer.state.model_input_spec
    log.info(summary(run.model, params, trainer.ts["state"], spec, trainable and trainable(params)))
    monitored = run.monitor.name if run.monitor else None
    trackers = start_trackers(config, run_dir, monitored) if mesh.is_main() else []
    trainer.trackers = trackers

    # 5. Train. A stop signal from here on saves the position first.
    signals.stop_at_next_step(trainer)
    status, discarded = 1, None
    try:
        jax.config.update("jax_debug_nans", args.detect_nans)
        with jax.disable_jit(args.no_jit):
            best = trainer.fit()
        if args.fast_dev_run:
            debug_modes.fast_dev_checks(trainer, loaders, run_dir)
        else:
            log.info(done_line(config["trainer"]["monitor"], best, run_dir, args))
        status = 0
    except TrainingDiverged as error:
        if existed is not None and not (run_dir / LATEST).exists():  # kept nothing: undone
            status = 2
            discarded = (
                f"{error}; the run folder {run_dir} was removed, as it held nothing to continue from (is the "
                f"learning rate, {float(trainer.state.lr_fn(0)):g} at the first step, too high?)"
            )
        else:
            log.error(str(error))
    except (run_folder.RunFolderError, CheckpointError) as error:
        log.error(str(error))
    except FloatingPointError as error:  # --detect-nans found the operation
        log.error(debug_modes.nan_report(error))
    except (Stopped, KeyboardInterrupt, signals.Interrupted) as stop:
        status = 128 + getattr(stop, "signum", signal.SIGINT)
        saved = f" ({stop})" if isinstance(stop, Stopped) else " at once"
        latest = run_dir / LATEST
        follow = (
            f"continue with: python train.py -r {latest}"
            if latest.is_file()
            else "no checkpoint was written, so there is nothing to continue from"
        )
        log.info(f"stopped by {signal.Signals(status - 128).name}{saved}; {follow}")
    finally:
        if mesh.is_main():  # a --fast-dev-run's folder goes at the end: no curves to point into it
            finish(run_dir, trackers, status, trainer.state.lr_fn, curves=not args.fast_dev_run)
            if discarded:
                run_folder.remove_new(run_dir, existed)
        if args.fast_dev_run:
            shutil.rmtree(config["trainer"]["save_dir"], ignore_errors=True)
    mesh.finish_processes()  # several processes: each waits here until all are done
    if discarded:
        fail(discarded)
    return status


def resolve_config(args) -> tuple[dict, Path | None]:
    """The validated config (file, then --set and aliases) and the run folder to continue, if resuming."""
    resume_dir = None
    if args.fast_dev_run and args.resume:
        raise ConfigError("--fast-dev-run checks a config on a fresh run; it does not take -r")
    if args.resume == "auto":
        return resolve_auto(args)
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
    run_dir = location.named_run(config)
    args.exact_run_dir = True
    if (run_dir / LATEST).is_file():
        args.resume = str(run_dir / LATEST)
        return config, run_dir
    return config, None


def check_position(trainer, path: Path, epochs: int) -> None:
    """A checkpoint past the configured end (a later epoch, or inside one) would train and write epochs the config
    never asked for; one at the end itself has nothing left to train and ends at once."""
    from training.run.checkpoint import CheckpointError

    if trainer.epoch + bool(trainer.position) > epochs:
        where = (
            f"{trainer.position} step(s) into epoch {trainer.epoch + 1}"
            if trainer.position
            else f"the end of epoch {trainer.epoch}"
        )
        raise CheckpointError(
            f"{path}: saved at {where}, past trainer.epochs {epochs}: nothing to train; continue "
            f"it with --epochs N, N > {trainer.epoch}"
        )


def stop_all(message: str) -> None:
    """fail() once the processes of a run started: process 0 first tells the others, which wait for its run
    folder, that there will be none (one process: just fail)."""
    if mesh.is_main():
        try:
            mesh.share_text("run_dir", "")
        except Exception:  # noqa: BLE001 (the message below is what matters)
            pass
    fail(message)


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
    if curves and (run_dir / METRICS).is_file():
        try:
            from training.plots.figures import plot_run

            log.info(f"curves: {plot_run(run_dir, lr_fn=lr_fn)}")
        except Exception as error:
            log.warning(f"curves.png not drawn: {type(error).__name__}: {error}")
    for tracker in trackers:
        try:
            tracker.close(status)
        except Exception as error:
            log.warning(f"{type(tracker).__name__}.close: {type(error).__name__}: {error}")


if __name__ == "__main__":
    sys.exit(command(main))
