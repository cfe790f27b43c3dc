"""What a run keeps of its progress: checkpoints (at epoch ends, and mid-epoch when ``trainer.checkpoint_every`` says
so), the best value of the monitored metric with its early-stopping count, and the rows of ``metrics.jsonl``.

An epoch ends in an order a kill cannot make inconsistent: ``checkpoint-latest.params`` first (the commit point: its
header holds the row and the best epoch), then the files that derive from it, then the row;
``run_folder.reconcile`` redoes whatever a kill left undone when the run resumes.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from training import checkpoint, distributed, run_folder
from training.files import BEST, LATEST, METRICS, epoch_checkpoint, step_checkpoint
from training.settings import Settings


class Checkpoints:
    def __init__(self, run_dir: Path | None, settings: Settings, monitor, config_hash: str | None, evaluated=None):
        """``monitor``: the run's parsed ``trainer.monitor`` (None when "off"); ``evaluated``: the callback whose
        parameters are evaluated instead of the trained ones, named in every header."""
        self.run_dir = run_dir  # set before the first save; a new run's folder is made once its state is ready
        self.settings, self.monitor, self.config_hash, self.evaluated = settings, monitor, config_hash, evaluated
        self.best, self.best_epoch, self.bad_epochs = None, None, 0
        self.last_save = (0, time.monotonic())  # (step, time) of the last checkpoint, for checkpoint_every
        self.writer = run_folder.Writer(background=settings.async_checkpoints)

    def resume(self, header: dict) -> None:
        """Continues the best value and early-stopping count of the checkpoint a run resumes from."""
        self.best, self.best_epoch = header.get("best"), header.get("best_epoch")
        self.bad_epochs = header.get("bad_epochs", 0)
        self.last_save = (header["step"], time.monotonic())

    def header(self, epoch: int, step: int, min_loss: float) -> dict:
        """What a checkpoint records besides the state: enough to resume the loop exactly."""
        return {
            "epoch": epoch,
            "step": step,
            "best": self.best,
            "best_epoch": self.best_epoch,
            "bad_epochs": self.bad_epochs,
            "monitor": self.settings.monitor,
            "config_hash": self.config_hash,
            "data_seed": self.settings.seed,
            "min_loss": min_loss if math.isfinite(min_loss) else None,
            **({"eval_params": f"callbacks.{self.evaluated.name}.params"} if self.evaluated else {}),
        }

    def update_best(self, row: dict, epoch: int) -> bool:
        """Whether the epoch's `row` improved the monitored value (then it is the new best)."""
        if self.monitor is None:
            return False
        value = row.get(self.monitor.name)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            raise ValueError(f"trainer.monitor: {self.monitor.name!r} was not computed this epoch")
        if self.best is None or self.monitor.better(value, self.best):
            self.best, self.best_epoch, self.bad_epochs = value, epoch, 0
            return True
        self.bad_epochs += 1
        return False

    def early_stop_due(self) -> bool:
        patience = self.settings.early_stop
        return bool(patience) and self.bad_epochs >= patience

    def commit_epoch(self, ts: dict, header: dict, improved: bool, row: dict) -> tuple[list[str], float]:
        """The end of an epoch: latest, best when improved, numbered every ``save_period`` epochs, then the row.
        Returns the files written and the pause the loop paid."""
        epoch = header["epoch"]
        names = [LATEST] + ([BEST] if improved else [])
        if epoch % self.settings.save_period == 0:
            names.append(epoch_checkpoint(epoch))
        return names, self.save(ts, {**header, "row": row}, names, row=row)

    def save_position(self, ts: dict, totals, header: dict) -> tuple[list[str], float]:
        """checkpoint-latest.params in the middle of an epoch: the state, the position in the epoch's order (in the
        header) and the statistics gathered so far, so the resumed run goes on with the next batch and ends
        bit-identical. With checkpoint_every.keep = N also checkpoint-step_S.params, the last N of them kept."""
        keep = self.settings.checkpoint_every.keep
        names = [LATEST] + ([step_checkpoint(header["step"])] if keep else [])
        return names, self.save({**ts, "epoch_totals": totals}, header, names, rotate=keep)

    def save(self, tree, header: dict, names: list[str], row: dict | None = None, rotate: int = 0) -> float:
        """Writes `tree` and `header` to the run folder's files `names`, in order, then the metrics `row`, once the
        previous save has finished. The state is copied to host memory here, at the step boundary; encoding and
        writing run on a background thread (trainer.async_checkpoints) while training goes on. ``rotate`` > 0: also
        keep only the last `rotate` numbered step checkpoints. Returns the pause the loop paid, in seconds."""
        started = time.perf_counter()
        self.writer.wait()
        # copies (the device buffers go to the next step), gathered from every device: all processes take part
        host = distributed.to_host(tree)
        run_dir = self.run_dir

        def write():
            payload = checkpoint.encode(host, header)
            path = run_dir / names[0]
            try:
                for name in names:
                    path = run_dir / name
                    checkpoint.write_atomic(path, payload)
                if row is not None:
                    path = run_dir / METRICS
                    run_folder.append_row(run_dir, row)
                if rotate:
                    numbered = sorted(run_dir.glob(step_checkpoint("*")), key=lambda p: int(p.stem.rsplit("_", 1)[1]))
                    for old in numbered[:-rotate]:
                        old.unlink()
            except OSError as error:
                kept = "nothing was changed" if path.name == names[0] else f"{names[0]} holds step {header['step']}"
                raise run_folder.RunFolderError(f"cannot write {path}: {error.strerror or error}; {kept}") from None

        if distributed.is_main():  # written once, by process 0; every process reads it on resume
            self.writer.submit(write)
        self.last_save = (header["step"], time.monotonic())
        return time.perf_counter() - started

    def save_due(self, step: int) -> bool:
        """trainer.checkpoint_every: every N steps and/or M minutes since the last checkpoint."""
        every = self.settings.checkpoint_every
        last_step, last_time = self.last_save
        return (every.steps is not None and step // every.steps > last_step // every.steps) or (
            every.minutes is not None and time.monotonic() - last_time >= 60 * every.minutes
        )

    def wait(self) -> None:
        """Until the last checkpoint handed to the writer is on disk (raises what writing it raised)."""
        self.writer.wait()

    def kept(self) -> str:
        """What a stopped run leaves to continue from, for its last message."""
        try:
            self.writer.wait()
        except run_folder.RunFolderError:
            pass  # reported by the loop; what is on disk is what counts here
        latest = self.run_dir / LATEST
        written = run_folder.written_at(latest)
        if written is None:
            return "no checkpoint was written yet (no epoch ended)"
        return f"{latest} (epoch {written[0]}) is kept"
