"""train.py's debug modes: --fast-dev-run, --limit-batches and --overfit-batches cut the data; --fast-dev-run ends
with the test split and the checkpoint read back; --detect-nans reports where the first NaN was made."""

from __future__ import annotations

import copy
import logging
from pathlib import Path

from files.writes import LATEST
from training.devices import mesh

log = logging.getLogger("train")
ROOT = Path(__file__).resolve().parents[2]  # the project: the frames of its own code are the ones named


def limit_data(args, config: dict, loaders: dict) -> None:
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
    from training.run import checkpoint

    if "test" in loaders:
        trainer.placement.share(loaders["test"])
        results = trainer.evaluate(loaders["test"])
        log.info("test (1 batch): " + "  ".join(f"{k} {v:.4f}" for k, v in results.items() if isinstance(v, float)))
    if mesh.is_main():  # the writer; the others may run on other machines
        checkpoint.restore(run_dir / LATEST, trainer.abstract_state)
    log.info(
        f"fast dev run passed: config, data ({', '.join(loaders)}), model, a training step, evaluation and a "
        f"checkpoint written and read back (in {run_dir.parent.parent}, removed at the end)"
    )


def nan_report(error: FloatingPointError) -> str:
    """--detect-nans' finding in one message: JAX's (the operation) and the deepest line of this project's code on
    the way to it."""
    import traceback

    root = ROOT
    ours = [
        frame
        for frame in traceback.extract_tb(error.__traceback__)
        if Path(frame.filename).resolve().is_relative_to(root)
        and ".venv" not in Path(frame.filename).parts
        and "site-packages" not in frame.filename
    ]
    where = (
        f" at {Path(ours[-1].filename).resolve().relative_to(root)}:{ours[-1].lineno} ({ours[-1].line})" if ours else ""
    )
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return f"--detect-nans: {first}{where}; training stopped"
