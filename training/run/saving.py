"""What a run keeps of its progress: checkpoints (at epoch ends, and mid-epoch when ``trainer.checkpoint_every`` says
so), the best value of the monitored metric with its early-stopping count, and the rows of ``metrics.jsonl``.

An epoch ends in an order a kill cannot make inconsistent: ``checkpoint-latest.params`` first (the commit point: its
header holds the row and the best epoch), then the files that derive from it, then the row;
``run_folder.reconcile`` redoes whatever a kill left undone when the run resumes.
"""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path

import jax

from files.writes import BEST, LATEST, METRICS, epoch_checkpoint, step_checkpoint
from training.config.settings import Settings
from training.devices import mesh
from training.run import checkpoint, shards
from training.run import folder as run_folder

# What a position inside an epoch (loader batches of that epoch's order) means depends on these: the training data,
# its batching and order (data_loader.train, the seed) and the batches per optimizer step. Resuming mid-epoch under
# other values would reinterpret the position, so it is refused; at an epoch's end they may change.
POSITION_KEYS = ("data_loader.train", "seed", "trainer.accumulate_steps")


def key_paths(tree, prefix: str = "") -> dict[str, object]:
    """A config's leaves by key path (``trainer.epochs``, ``metrics.0.name``); an empty object or list is a leaf."""
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, list) else None
    if not items:
        return {prefix: tree}
    leaves = {}
    for key, value in items:
        leaves.update(key_paths(value, f"{prefix}.{key}" if prefix else str(key)))
    return leaves


MISSING = object()


def show_value(value) -> str:
    text = json.dumps(value) if value is not MISSING else "(absent)"
    return text if len(text) <= 40 else text[:37] + "..."


def config_changes(old: dict, new: dict) -> dict[str, tuple]:
    """Key path -> (old value, new value) for every leaf that differs (MISSING where a side has none)."""
    before, after = key_paths(old), key_paths(new)
    return {
        key: (before.get(key, MISSING), after.get(key, MISSING))
        for key in sorted(before.keys() | after.keys())
        if before.get(key, MISSING) != after.get(key, MISSING)
    }


def resume_problem(header: dict, config: dict, batches: int, accumulate: int, state_step: int) -> str | None:
    """Why the run cannot go on from a checkpoint's `header` under `config` (batches per epoch and per step of its
    loader; the step counter of its restored state), or None. The header's own fields are checked when it is read
    (``checkpoint.header_problem``); these checks need the run it resumes into."""
    if header["step"] != state_step:
        return f"its header says step {header['step']} but its state's step counter is {state_step}"
    position = header.get("position", 0)
    if not position:
        return None
    where = f"saved {position} batch(es) into epoch {header['epoch'] + 1}"
    remedy = "resume with the checkpoint's value, or from a checkpoint saved at an epoch's end"
    changes = config_changes(header.get("config") or {}, config) if "config" in header else {}
    for key, (old, new) in changes.items():
        if any(key == k or key.startswith(k + ".") for k in POSITION_KEYS):
            return (
                f"{where} with {key} {show_value(old)}; this config has {show_value(new)}, which changes what "
                f"that position means: {remedy}"
            )
    recorded = header.get("batches")
    if recorded is not None and recorded != batches:
        return (
            f"{where} of {recorded}; the training data now has {batches} batches per epoch (another data set, "
            f"or --limit-batches): {remedy}"
        )
    if position >= batches or position % accumulate:
        return (
            f"its position {position} is not a step boundary inside an epoch of {batches} batches "
            f"(trainer.accumulate_steps {accumulate})"
        )
    return None


class Checkpoints:
    def __init__(
        self,
        run_dir: Path | None,
        settings: Settings,
        monitor,
        config_hash: str | None,
        evaluated=None,
        config: dict | None = None,
        batches: int = 0,
    ):
        """``monitor``: the run's parsed ``trainer.monitor`` (None when "off"); ``evaluated``: the callback whose
        parameters are evaluated instead of the trained ones, named in every header; ``config``: the run's, recorded
        in every header so that a resume can tell what changed since; ``batches``: the training loader's per epoch, what
        a position saved inside an epoch counts in."""
        self.run_dir = run_dir  # set before the first save; a new run's folder is made once its state is ready
        self.settings, self.monitor, self.config_hash, self.evaluated = settings, monitor, config_hash, evaluated
        self.config, self.batches = config, batches
        self.best, self.best_epoch, self.bad_epochs = None, None, 0
        self.last_save = (0, time.monotonic())  # (step, time) of the last checkpoint, for checkpoint_every
        self.writer = run_folder.Writer(background=settings.async_checkpoints)
        self.saves = 0  # this process's saves so far: several processes count alike, naming each save's shared tag
        # a copy of the run folder elsewhere (a bucket's objects, where save_dir is one): ``publish(path)``, each
        # shard file this process wrote, before it is reported; ``committed(run_dir, names)``, process 0 once a save
        # is committed in the run folder (its index first)
        self.publish, self.committed = None, None

    def resume(self, header: dict, path: Path, state_step: int) -> list[str]:
        """Continues the best value and early-stopping count of the checkpoint `path` a run resumes from (its
        `header`; `state_step`, its state's step counter); returns what changed since it was saved, one line each
        for the log. A CheckpointError when it cannot be continued (``resume_problem``). A changed
        ``trainer.monitor`` starts the best value afresh (the old best was of another metric or direction)."""
        problem = resume_problem(header, self.config or {}, self.batches, self.settings.accumulate_steps, state_step)
        if problem:
            raise checkpoint.CheckpointError(f"{path}: {problem}")
        self.best, self.best_epoch = header.get("best"), header.get("best_epoch")
        self.bad_epochs = header.get("bad_epochs", 0)
        self.last_save = (header["step"], time.monotonic())
        notes = []
        if "config" in header:
            changes = config_changes(header["config"], self.config or {})
            if changes:
                shown = ", ".join(f"{k} {show_value(a)} -> {show_value(b)}" for k, (a, b) in changes.items())
                notes.append(f"config changed since the checkpoint: {shown}")
        elif header.get("config_hash") != self.config_hash:
            notes.append("the config's model/loss/optimizer/seed differ from the checkpoint's run")
        old = header.get("monitor")
        if old is not None and old != self.settings.monitor:
            best = "none" if self.best is None else f"{self.best:g}"
            self.best, self.best_epoch, self.bad_epochs = None, None, 0
            notes.append(
                f"trainer.monitor changed from {old!r} to {self.settings.monitor!r}: its best value ({best}) and "
                f"early-stopping count start afresh"
            )
        return notes

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
            **({"config": self.config} if self.config is not None else {}),
            **({"batches": self.batches} if self.batches else {}),
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

    def commit_epoch(self, train_state: dict, header: dict, improved: bool, row: dict) -> tuple[list[str], float]:
        """The end of an epoch: latest, best when improved, numbered every ``save_period`` epochs, then the row.
        Returns the files written and the pause the loop paid."""
        epoch = header["epoch"]
        names = [LATEST] + ([BEST] if improved else [])
        if epoch % self.settings.save_period == 0:
            names.append(epoch_checkpoint(epoch))
        return names, self.save(train_state, {**header, "row": row}, names, row=row)

    def save_position(self, train_state: dict, totals, header: dict) -> tuple[list[str], float]:
        """checkpoint-latest.params in the middle of an epoch: the state, the position in the epoch's order (in the
        header) and the statistics gathered so far, so the resumed run goes on with the next batch and ends
        bit-identical. With checkpoint_every.keep = N also checkpoint-step_S.params, the last N of them kept."""
        keep = self.settings.checkpoint_every.keep
        names = [LATEST] + ([step_checkpoint(header["step"])] if keep else [])
        return names, self.save({**train_state, "epoch_totals": totals}, header, names, rotate=keep)

    def save(self, tree, header: dict, names: list[str], row: dict | None = None, rotate: int = 0) -> float:
        """Writes `tree` and `header` to the run folder's files `names`, in order, then the metrics `row`, once the
        previous save has finished. The state is copied to host memory here, at the step boundary; encoding and
        writing run on a background thread (trainer.async_checkpoints) while training goes on. ``rotate`` > 0: also
        keep only the last `rotate` numbered step checkpoints. Returns the pause the loop paid, in seconds. One
        process writes one file; several write a sharded checkpoint, each its shards and process 0 the index that
        commits them (training/run/shards.py)."""
        started = time.perf_counter()
        self.writer.wait()
        run_dir = self.run_dir
        self.saves += 1
        if jax.process_count() > 1:
            # every process copies the distinct shards it holds and writes them (training/run/shards.py): nothing
            # is gathered to one host; process 0 commits the index once all have written
            tag, part = shards.new_tag(header["step"], self.saves), shards.take(tree)
            encode = lambda: shards.write(run_dir, tag, part, header, self.publish)  # noqa: E731
        else:
            host = mesh.to_host(tree)  # copies: the device buffers go on to the next step
            encode = lambda: checkpoint.encode(host, header)  # noqa: E731

        def write():
            path = run_dir / names[0]
            try:
                payload = encode()
            except OSError as error:
                raise run_folder.RunFolderError(
                    f"cannot write a checkpoint in {run_dir}: {error.strerror or error}; nothing was changed"
                ) from None
            if payload is None:  # a process other than 0 wrote its shards; process 0 commits them
                return
            try:
                for name in names:
                    path = run_dir / name
                    checkpoint.write_atomic(path, payload)
                if row is not None:
                    path = run_dir / METRICS
                    run_folder.append_row(run_dir, row)
                if rotate:
                    # only the files this rotation names: a copy kept by hand (checkpoint-step_good.params) stays
                    step_of = lambda p: p.stem.rsplit("_", 1)[1]  # noqa: E731
                    numbered = [p for p in run_dir.glob(step_checkpoint("*")) if re.fullmatch("[0-9]+", step_of(p))]
                    numbered.sort(key=lambda p: int(step_of(p)))
                    for old in numbered[:-rotate]:
                        old.unlink()
                shards.remove_unreferenced(run_dir)  # the shard files the replaced indexes named, if any
            except OSError as error:
                kept = "nothing was changed" if path.name == names[0] else f"{names[0]} holds step {header['step']}"
                raise run_folder.RunFolderError(f"cannot write {path}: {error.strerror or error}; {kept}") from None
            if self.committed is not None:
                self.committed(run_dir, names)

        if mesh.is_main() or jax.process_count() > 1:  # one file: written by process 0 alone
            self.writer.submit(write)
        self.last_save = (header["step"], time.monotonic())
        return time.perf_counter() - started

    def save_due(self, step: int, clock: bool = True) -> bool:
        """trainer.checkpoint_every: every N steps and/or M minutes since the last checkpoint (``clock`` False: the
        steps only, which every process of a run counts alike)."""
        every = self.settings.checkpoint_every
        last_step, last_time = self.last_save
        return (every.steps is not None and step // every.steps > last_step // every.steps) or (
            clock and every.minutes is not None and time.monotonic() - last_time >= 60 * every.minutes
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
