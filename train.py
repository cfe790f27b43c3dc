"""Train a model from a JSON config:  python train.py -c config.json [-r CHECKPOINT] [--set key.path=value ...]"""
from __future__ import annotations

if __name__ == "__main__":  # before anything imports JAX; may re-execute once (TRAIN_PLATFORM_DEFAULTS=0: off)
    from training import platform

    platform.apply()

import argparse
import copy
import json
import logging
import shutil
import signal
import sys
import tempfile
from datetime import datetime
from pathlib import Path

from training import distributed
from training.trackers import new_run_id, start_trackers, wandb_on
from utils import (ConfigError, build, build_optimizer, config_hash, fail, load_config, monitor_of, read_json,
                   setup_logging)

log = logging.getLogger("train")


class Interrupted(BaseException):
    """A stop signal received during start-up, raised at the next safe point (a BaseException, like
    KeyboardInterrupt: nothing catches it by accident)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-c", "--config", help="config file (default: the resumed run's config.json)")
    parser.add_argument("-r", "--resume", help="checkpoint to continue from (e.g. saved/<name>/<run>/checkpoint-latest.params), "
                        "or auto: the run named by --run-id if it has a checkpoint, else a new run of that name")
    parser.add_argument("--weights", help="initialise params/state from this checkpoint, then train afresh (fine-tuning)")
    parser.add_argument("--exclude", action="append", default=[], metavar="KEY.PATH",
                        help="with --weights: keep these key-path prefixes fresh, e.g. --exclude params.head")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                        help="override a config value (JSON), e.g. --set optimizer.args.lr=0.01")
    parser.add_argument("--lr", type=float, help="alias of --set optimizer.args.lr=LR")
    parser.add_argument("--bs", type=int, help="alias of --set data_loader.train.args.batch_size=BS")
    parser.add_argument("--epochs", type=int, help="alias of --set trainer.epochs=N")
    parser.add_argument("--run-id", help="run folder name (default: a timestamp)")
    debug = parser.add_argument_group("debug modes")
    debug.add_argument("--fast-dev-run", action="store_true",
                       help="one step of train, validation and test, a checkpoint written and read back, in a "
                            "throw-away run folder: a config smoke test in seconds")
    debug.add_argument("--limit-batches", type=int, metavar="N", help="at most N batches per epoch of every split")
    debug.add_argument("--overfit-batches", type=int, metavar="N",
                       help="train on the same first N batches every epoch and validate on them (the loss must "
                            "fall to near zero, or the model, loss or data has a bug)")
    debug.add_argument("--detect-nans", action="store_true",
                       help="stop at the first operation that makes a NaN, naming it and its line (jax_debug_nans; "
                            "the step runs jitted but not ahead-of-time compiled, and is re-run op by op to find it)")
    debug.add_argument("--no-jit", action="store_true",
                       help="run every step op by op (jax.disable_jit): breakpoints and prints inside the model, "
                            "loss and step see real values; slow")
    several = parser.add_argument_group("several processes (jax.distributed; SLURM's srun is detected by itself)")
    several.add_argument("--coordinator", metavar="HOST:PORT",
                         help="process 0's address, the same for every process (e.g. node001:29500), or auto: "
                              "JAX's detection (Cloud TPU pod slices, GKE, Open MPI)")
    several.add_argument("--num-processes", type=int, metavar="N", help="how many processes train together")
    several.add_argument("--process-id", type=int, metavar="I", help="this process's index, 0 to N-1")
    several.add_argument("--heartbeat-timeout", type=int, default=60, metavar="SECONDS",
                         help="a process silent this long counts as dead and the others stop with an error "
                              "(default: 60)")
    return parser.parse_args(argv)


def resolve_config(args) -> tuple[dict, Path | None]:
    """The validated config (file, then --set and aliases) and the run folder to continue, if resuming."""
    resume_dir = None
    if args.fast_dev_run and args.resume:
        raise ConfigError("--fast-dev-run checks a config on a fresh run; it does not take -r")
    if args.resume == "auto":
        return resolve_auto(args)
    if args.resume:
        resume = Path(args.resume)
        if not resume.is_file():
            raise ConfigError(f"-r {resume}: no such checkpoint file")
        resume_dir = resume.parent
    config_path = args.config or (resume_dir / "config.json" if resume_dir else None)
    if config_path is None:
        raise ConfigError("give a config with -c config.json (or -r a checkpoint inside a run folder)")
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
            raise ConfigError(f"--{flag.replace('_', '-')}: expected a number of batches >= 1, got {getattr(args, flag)}")
    config = load_config(config_path, overrides, source=Path(config_path).name)
    if args.exclude and not args.weights:
        raise ConfigError("--exclude applies to --weights (fine-tuning from another run's checkpoint)")
    if args.lr is not None and "schedule" in config["optimizer"]:
        raise ConfigError("--lr: the learning rate comes from optimizer.schedule; set its args with --set "
                          "optimizer.schedule.args.<name>=VALUE")
    return config, resume_dir


def resolve_auto(args) -> tuple[dict, Path | None]:
    """``-r auto``: one command for a job that may be requeued. The run named by --run-id (or trainer.run_id)
    continues from its checkpoint-latest.params when it has one, and starts under exactly that name otherwise."""
    if not args.config:
        raise ConfigError("-r auto: give the config with -c (and the run's name with --run-id)")
    args.resume = None
    config, _ = resolve_config(args)
    if not config["trainer"]["run_id"]:
        raise ConfigError("-r auto: name the run with --run-id NAME (or trainer.run_id), so a requeued job finds it")
    run_dir = Path(config["trainer"]["save_dir"]) / config["name"] / config["trainer"]["run_id"]
    latest = run_dir / "checkpoint-latest.params"
    args.exact_run_dir = True
    if latest.is_file():
        args.resume = str(latest)
        return config, run_dir
    return config, None


def assign_wandb_id(config: dict, resume_dir: Path | None) -> None:
    """A resumed run keeps its wandb run (the id saved in its folder's config); a new one draws an id now, so the
    run folder can be named after it."""
    if not wandb_on(config) or config["wandb"]["id"]:
        return
    saved = read_json(resume_dir / "config.json").get("wandb", {}) if resume_dir else {}
    config["wandb"]["id"] = saved.get("id") or new_run_id()


def run_id_of(config: dict) -> str:
    """A new run's folder name: trainer.run_id, else the start time (and the wandb run id, so each finds the
    other)."""
    trainer = config["trainer"]
    if trainer["run_id"]:
        return trainer["run_id"]
    run_id = datetime.now().strftime("%Y%m%d_%H%M%S")
    return f"{run_id}_{config['wandb']['id']}" if wandb_on(config) else run_id


def main(argv=None) -> int:
    """Exit status: 0 trained, 1 the run stopped on an error (divergence, a failed write), 2 bad input (config,
    data, checkpoint, a run folder in use or not writable: nothing was written), 130/143/138 stopped by
    SIGINT/SIGTERM/SIGUSR1 after saving the position (continue with -r)."""
    RECEIVED.clear()
    previous = {signum: signal.signal(signum, stop_at_safe_point) for signum in STOP_SIGNALS}
    try:
        return run(parse_args(argv))
    except (Exception, KeyboardInterrupt, Interrupted) as error:
        stop = signal_in(error)
        if stop is None:
            distributed.await_watchdog(error)  # a dead process: the watchdog's one line, not this traceback
            raise
        signum = getattr(stop, "signum", signal.SIGINT)
        print(f"error: stopped by {signal.Signals(signum).name} before training started; nothing was written",
              file=sys.stderr)
        return 128 + signum
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


# SIGTERM: a cluster's stop or a preemption; SIGUSR1: SLURM's warning before the end of a job's time.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)


def signal_in(error: BaseException | None) -> BaseException | None:
    """The KeyboardInterrupt or Interrupted behind an error (an import interrupted by a signal surfaces as an
    ImportError caused by it)."""
    while error is not None:
        if isinstance(error, (KeyboardInterrupt, Interrupted)):
            return error
        error = error.__cause__ or error.__context__
    return None


RECEIVED: list[int] = []  # stop signals received during start-up


def stop_at_safe_point(signum, frame):
    """Before training: noted, and acted on between start-up phases (an exception raised inside an import of a
    native extension, or inside XLA, crashes the process instead of ending it); a second Ctrl-C stops at once."""
    if RECEIVED and signum == signal.SIGINT:
        raise KeyboardInterrupt
    RECEIVED.append(signum)


def safe_point() -> None:
    if RECEIVED:
        raise Interrupted(RECEIVED[0])


def stop_at_next_step(trainer):
    """While training: the loop saves at the next step boundary and stops; a second Ctrl-C stops at once (every
    finished epoch or saved step is kept either way)."""
    def handler(signum, frame):
        if signum == signal.SIGINT and trainer.stop_signal is not None:
            raise KeyboardInterrupt
        trainer.request_stop(signum)
    return handler


def run(args) -> int:
    setup_logging(None)  # the console until the run folder exists
    # 0. Several processes: jax.distributed starts before anything touches a device (one process: nothing to do).
    try:
        distributed.start(args.coordinator, args.num_processes, args.process_id, args.heartbeat_timeout)
    except distributed.DistributedError as error:
        fail(str(error))
    # 1. Config: read, override, validate, build. Nothing is loaded or compiled before this passes.
    try:
        config, resume_dir = resolve_config(args)
        source = Path(args.config).name if args.config else "config.json"
        model = build(config["model"], "model", f"{source}: model")
        loss_fn = build(config["loss"], "loss", f"{source}: loss")
        metrics = [build(m, "metrics", f"{source}: metrics.{i}") for i, m in enumerate(config["metrics"])]
        callbacks = [build(c, "callbacks", f"{source}: callbacks.{i}") for i, c in enumerate(config["callbacks"])]
        build_optimizer(config, steps_per_epoch=None, source=source)  # its hyperparameters' checks, before the data
        from data_loader.augment import from_config as augment_of

        augment = augment_of(config, source)  # None without a train "augment" list
        assign_wandb_id(config, resume_dir)
    except ConfigError as error:
        fail(str(error))
    if args.fast_dev_run:  # a throw-away folder, no trackers: nothing of the check outlives it
        config["trainer"]["save_dir"] = tempfile.mkdtemp(prefix="fast-dev-run-")
        config["wandb"]["enabled"] = config["tensorboard"]["enabled"] = False

    safe_point()
    # 2. Data: every shape and dtype the run compiles for comes from one real batch (the loader's spec).
    loaders = {}
    try:
        for split, spec in config["data_loader"].items():
            loaders[split] = build(spec, "data_loader", f"{source}: data_loader.{split}", seed=config["seed"])
            loaders[split].spec  # noqa: B018 (reads and checks the first batch now, not mid-run)
        # a step is trainer.accumulate_steps loader batches: schedules count steps
        steps_per_epoch = -(-len(loaders["train"]) // config["trainer"]["accumulate_steps"])
        optimizer, lr_fn = build_optimizer(config, steps_per_epoch=steps_per_epoch, source=source)
        debug_mode(args, config, loaders)
        for i, callback in enumerate(callbacks):
            try:
                callback.check(loaders["train"])
            except ValueError as error:
                raise ConfigError(f"{source}: callbacks.{i}: {callback.name}: {error}") from None
    except ConfigError as error:
        fail(str(error))
    except ValueError as error:  # a dataset whose batches the loop cannot take
        fail(f"{source}: data_loader: {error}")

    safe_point()
    import jax

    from training import run_folder
    from training.checkpoint import CheckpointError, remove_stale_temps, write_atomic
    from training.trainer import Stopped, Trainer, TrainingDiverged

    # 3. State: fresh, resumed, or initialised from another run's weights. A failure here leaves no run folder;
    # a resumed run's folder is held by this process from here on and changed only once its checkpoint loaded.
    monitor = monitor_of(config)
    try:
        if resume_dir and distributed.is_main():
            run_folder.hold(resume_dir)
        trainer = Trainer(config, resume_dir, model, loss_fn, metrics, optimizer, lr_fn, loaders["train"],
                          loaders.get("validation"), monitor=monitor, config_hash=config_hash(config), augment=augment,
                          execution="eager" if args.no_jit else "jit" if args.detect_nans else "aot",
                          callbacks=callbacks)
        if args.resume:
            trainer.restore(Path(args.resume))
        else:
            trainer.init_state()
            if args.weights:
                trainer.load_weights(Path(args.weights), exclude=tuple(args.exclude))
    except (CheckpointError, ValueError, run_folder.RunFolderError) as error:
        stop_all(str(error))

    safe_point()
    # 4. Run folder: resolved config, what a user of the weights needs (model code, preprocessing), logs.
    try:
        if not distributed.is_main():  # process 0 writes the folder; the others only learn where it is
            run_dir, repaired = Path(distributed.share_text("run_dir")), []
        elif resume_dir:
            run_dir = resume_dir
            repaired = run_folder.reconcile(run_dir, Path(args.resume), trainer.resumed_header,
                                            config["trainer"]["save_period"])
        else:
            run_dir = run_folder.create(Path(config["trainer"]["save_dir"]) / config["name"], run_id_of(config),
                                        exact=getattr(args, "exact_run_dir", False))
            run_folder.hold(run_dir)
            shutil.copytree(Path(__file__).parent / "model", run_dir / "model",
                            ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True)
            # -r auto reusing the folder of an attempt killed before its first checkpoint was on disk
            repaired = [f"removed an interrupted write: {p.name}" for p in remove_stale_temps(run_dir)]
        trainer.run_dir = run_dir
        if distributed.is_main():
            write_atomic(run_dir / "config.json", (json.dumps(config, indent=2) + "\n").encode())
            preprocessing = loaders["train"].preprocessing
            if augment is not None:  # its normalisation, folded into what predict.py computes
                preprocessing = augment.preprocessing(preprocessing, loaders["train"].spec)
            if preprocessing:
                write_atomic(run_dir / "preprocessing.json", (json.dumps(preprocessing, indent=2) + "\n").encode())
            setup_logging(run_dir)
            distributed.share_text("run_dir", str(run_dir))
        else:
            log.setLevel(logging.WARNING)  # process 0 reports the run; the others only their own errors
    except (run_folder.RunFolderError, distributed.DistributedError) as error:
        stop_all(str(error))
    except OSError as error:
        stop_all(f"cannot write in the run folder: {error.filename or ''}: {error.strerror or error}")
    logging.raiseExceptions = False  # a full disk must not print a traceback per log line; the next write fails
    from model.summary import summary

    log.info(f"run folder: {run_dir}")
    for line in repaired:
        log.info(f"resume: {line}")
    log.info(f"devices: {', '.join(str(d) for d in jax.devices())}; {distributed.describe()}, mesh "
             f"{dict(trainer.mesh.shape)}")
    log.info(f"batch: {describe_batch(trainer.batch_spec)}")
    log.info(f"state: {trainer.origin}")
    log.info(summary(model, trainer.ts["params"], trainer.ts["state"], trainer.model_input_spec))
    trackers = start_trackers(config, run_dir, monitor.name if monitor else None) if distributed.is_main() else []
    trainer.trackers = trackers

    # 5. Train. A stop signal from here on saves the position first.
    for signum in STOP_SIGNALS:
        signal.signal(signum, stop_at_next_step(trainer))
    if RECEIVED:  # while the run folder was being written
        trainer.request_stop(RECEIVED[0])
    status = 1
    try:
        jax.config.update("jax_debug_nans", args.detect_nans)
        with jax.disable_jit(args.no_jit):
            best = trainer.fit()
        if args.fast_dev_run:
            fast_dev_checks(trainer, loaders, run_dir)
        else:
            log.info(f"done: best {config['trainer']['monitor']} = {best}; checkpoints in {run_dir}")
        status = 0
    except (TrainingDiverged, run_folder.RunFolderError, CheckpointError) as error:
        log.error(str(error))
    except FloatingPointError as error:  # --detect-nans found the operation
        log.error(nan_report(error))
    except (Stopped, KeyboardInterrupt, Interrupted) as stop:
        status = 128 + getattr(stop, "signum", signal.SIGINT)
        saved = f" ({stop})" if isinstance(stop, Stopped) else " at once"
        latest = run_dir / "checkpoint-latest.params"
        follow = f"continue with: python train.py -r {latest}" if latest.is_file() else \
            "no checkpoint was written, so there is nothing to continue from"
        log.info(f"stopped by {signal.Signals(status - 128).name}{saved}; {follow}")
    finally:
        if distributed.is_main():
            finish(run_dir, trackers, status)
        if args.fast_dev_run:
            shutil.rmtree(config["trainer"]["save_dir"], ignore_errors=True)
    distributed.finish()  # several processes: each waits here until all are done
    return status


def stop_all(message: str) -> None:
    """fail() once the processes of a run started: process 0 first tells the others, which wait for its run
    folder, that there will be none (one process: just fail)."""
    if distributed.is_main():
        try:
            distributed.share_text("run_dir", "")
        except Exception:  # noqa: BLE001 (the message below is what matters)
            pass
    fail(message)


def debug_mode(args, config: dict, loaders: dict) -> None:
    """The debug modes' data, applied after the optimizer is built so its schedule stays the config's: every split
    cut to N batches per epoch (--fast-dev-run: 1, and one epoch); --overfit-batches also trains on the same batches
    in the same order every epoch and validates on exactly those."""
    if args.fast_dev_run:
        config["trainer"]["epochs"] = 1
    limit = 1 if args.fast_dev_run else args.limit_batches or args.overfit_batches
    if args.overfit_batches:
        loaders["train"].shuffle = False
        loaders["validation"] = copy.copy(loaders["train"])
    for loader in loaders.values():
        loader.limit = limit


def fast_dev_checks(trainer, loaders: dict, run_dir: Path) -> None:
    """--fast-dev-run's last steps: the test split evaluated and the checkpoint read back into the state's shapes."""
    from training import checkpoint

    if "test" in loaders:
        trainer.share_batches(loaders["test"])
        results = trainer.evaluate(loaders["test"])
        log.info("test (1 batch): " + "  ".join(f"{k} {v:.4f}" for k, v in results.items() if isinstance(v, float)))
    if distributed.is_main():  # the writer; the others may run on other machines
        checkpoint.restore(run_dir / "checkpoint-latest.params", trainer.state_template())
    log.info(f"fast dev run passed: config, data ({', '.join(loaders)}), model, a training step, evaluation and a "
             f"checkpoint written and read back (in {run_dir.parent.parent}, removed at the end)")


def nan_report(error: FloatingPointError) -> str:
    """--detect-nans' finding in one message: JAX's (the operation) and the deepest line of this project's code on
    the way to it."""
    import traceback

    root = Path(__file__).resolve().parent
    ours = [frame for frame in traceback.extract_tb(error.__traceback__)
            if Path(frame.filename).resolve().is_relative_to(root) and ".venv" not in Path(frame.filename).parts
            and "site-packages" not in frame.filename]
    where = f" at {Path(ours[-1].filename).resolve().relative_to(root)}:{ours[-1].lineno} ({ours[-1].line})" \
        if ours else ""
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return f"--detect-nans: {first}{where}; training stopped"


def describe_batch(spec: dict) -> str:
    """The batch's tree of shapes and dtypes in one line: input int32[12,64], target int32[12,64], ..."""
    import jax

    from model.modules.module import key_path_str

    leaves = jax.tree_util.tree_flatten_with_path(spec)[0]
    return ", ".join(f"{key_path_str(path)} {leaf.dtype}{list(leaf.shape)}" for path, leaf in leaves)


def finish(run_dir: Path, trackers: list, status: int) -> None:
    """curves.png from metrics.jsonl, then the trackers' last words; neither can change how the run ends."""
    if (run_dir / "metrics.jsonl").is_file():
        try:
            from training.plots import plot_run

            log.info(f"curves: {plot_run(run_dir)}")
        except Exception as error:
            log.warning(f"curves.png not drawn: {type(error).__name__}: {error}")
    for tracker in trackers:
        try:
            tracker.close(status)
        except Exception as error:
            log.warning(f"{type(tracker).__name__}.close: {type(error).__name__}: {error}")


if __name__ == "__main__":
    sys.exit(main())
