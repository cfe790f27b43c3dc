"""Train a model from a JSON config:  python train.py -c config.json [-r CHECKPOINT] [--set key.path=value ...]"""
from __future__ import annotations

if __name__ == "__main__":  # before anything imports JAX; may re-execute once (TRAIN_PLATFORM_DEFAULTS=0: off)
    from training import platform

    platform.apply()

import argparse
import json
import logging
import shutil
import sys
from datetime import datetime
from pathlib import Path

from training.trackers import new_run_id, start_trackers, wandb_on
from utils import (ConfigError, build, build_optimizer, config_hash, fail, load_config, monitor_of, read_json,
                   setup_logging)

log = logging.getLogger("train")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-c", "--config", help="config file (default: the resumed run's config.json)")
    parser.add_argument("-r", "--resume", help="checkpoint to continue from (e.g. saved/<name>/<run>/checkpoint-latest.params)")
    parser.add_argument("--weights", help="initialise params/state from this checkpoint, then train afresh (fine-tuning)")
    parser.add_argument("--exclude", action="append", default=[], metavar="KEY.PATH",
                        help="with --weights: keep these key-path prefixes fresh, e.g. --exclude params.head")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                        help="override a config value (JSON), e.g. --set optimizer.args.lr=0.01")
    parser.add_argument("--lr", type=float, help="alias of --set optimizer.args.lr=LR")
    parser.add_argument("--bs", type=int, help="alias of --set data_loader.train.args.batch_size=BS")
    parser.add_argument("--epochs", type=int, help="alias of --set trainer.epochs=N")
    parser.add_argument("--run-id", help="run folder name (default: a timestamp)")
    return parser.parse_args(argv)


def resolve_config(args) -> tuple[dict, Path | None]:
    """The validated config (file, then --set and aliases) and the run folder to continue, if resuming."""
    resume_dir = None
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
    config = load_config(config_path, overrides, source=Path(config_path).name)
    if args.exclude and not args.weights:
        raise ConfigError("--exclude applies to --weights (fine-tuning from another run's checkpoint)")
    if args.lr is not None and "schedule" in config["optimizer"]:
        raise ConfigError("--lr: the learning rate comes from optimizer.schedule; set its args with --set "
                          "optimizer.schedule.args.<name>=VALUE")
    return config, resume_dir


def assign_wandb_id(config: dict, resume_dir: Path | None) -> None:
    """A resumed run keeps its wandb run (the id saved in its folder's config); a new one draws an id now, so the
    run folder can be named after it."""
    if not wandb_on(config) or config["wandb"]["id"]:
        return
    saved = read_json(resume_dir / "config.json").get("wandb", {}) if resume_dir else {}
    config["wandb"]["id"] = saved.get("id") or new_run_id()


def new_run_dir(config: dict) -> Path:
    """The folder for a new run (created once the run's state is ready)."""
    trainer = config["trainer"]
    run_id = trainer["run_id"] or datetime.now().strftime("%Y%m%d_%H%M%S")
    if not trainer["run_id"] and wandb_on(config):  # the folder and the wandb run are found from each other
        run_id += f"_{config['wandb']['id']}"
    run_dir = Path(trainer["save_dir"]) / config["name"] / run_id
    suffix = 1
    while run_dir.exists():  # two runs started in the same second never share a folder
        run_dir = run_dir.with_name(f"{run_id}_{suffix}")
        suffix += 1
    return run_dir


def main(argv=None) -> int:
    args = parse_args(argv)
    setup_logging(None)  # the console until the run folder exists
    # 1. Config: read, override, validate. Nothing is loaded or compiled before this passes.
    try:
        config, resume_dir = resolve_config(args)
        model = build(config["model"], "model", "config.json: model")
        loss_fn = build(config["loss"], "loss", "config.json: loss")
        metrics = [build(m, "metrics", f"config.json: metrics.{i}") for i, m in enumerate(config["metrics"])]
        assign_wandb_id(config, resume_dir)
    except ConfigError as error:
        fail(str(error))

    # 2. Data: every shape and dtype the run compiles for comes from one real batch (the loader's spec).
    loaders = {}
    try:
        for split, spec in config["data_loader"].items():
            loaders[split] = build(spec, "data_loader", f"config.json: data_loader.{split}", seed=config["seed"])
            loaders[split].spec  # noqa: B018 (reads and checks the first batch now, not mid-run)
        optimizer, lr_fn = build_optimizer(config, steps_per_epoch=len(loaders["train"]))
    except ConfigError as error:
        fail(str(error))
    except ValueError as error:  # a dataset whose batches the loop cannot take
        fail(f"config.json: data_loader: {error}")

    import jax

    from training.checkpoint import CheckpointError
    from training.trainer import Trainer, TrainingDiverged

    # 3. State: fresh, resumed, or initialised from another run's weights. A failure here leaves no run folder.
    run_dir = resume_dir or new_run_dir(config)
    monitor = monitor_of(config)
    try:
        trainer = Trainer(config, run_dir, model, loss_fn, metrics, optimizer, lr_fn, loaders["train"],
                          loaders.get("validation"), monitor=monitor, config_hash=config_hash(config))
        if args.resume:
            trainer.restore(Path(args.resume))
        else:
            trainer.init_state()
            if args.weights:
                trainer.load_weights(Path(args.weights), exclude=tuple(args.exclude))
    except (CheckpointError, ValueError) as error:
        fail(str(error))

    # 4. Run folder: resolved config, what a user of the weights needs (model code, preprocessing), logs.
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    preprocessing = loaders["train"].preprocessing
    if preprocessing:
        (run_dir / "preprocessing.json").write_text(json.dumps(preprocessing, indent=2) + "\n")
    if not resume_dir:
        shutil.copytree(Path(__file__).parent / "model", run_dir / "model",
                        ignore=shutil.ignore_patterns("__pycache__"))
    setup_logging(run_dir)
    from model.summary import summary

    log.info(f"run folder: {run_dir}")
    log.info(f"devices: {', '.join(str(d) for d in jax.devices())}")
    log.info(f"batch: {describe_batch(trainer.batch_spec)}")
    log.info(f"state: {trainer.origin}")
    log.info(summary(model, trainer.ts["params"], trainer.ts["state"], trainer.input_spec))
    trainer.trackers = trackers = start_trackers(config, run_dir, monitor.name if monitor else None)

    # 5. Train.
    status = 1
    try:
        best = trainer.fit()
        log.info(f"done: best {config['trainer']['monitor']} = {best}; checkpoints in {run_dir}")
        status = 0
    except TrainingDiverged as error:
        log.error(str(error))
    except KeyboardInterrupt:
        log.info(f"interrupted; continue with: python train.py -r {run_dir / 'checkpoint-latest.params'}")
        status = 130
    finally:
        finish(run_dir, trackers, status)
    return status


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
