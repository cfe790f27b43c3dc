"""The training loop: epochs of jitted K-step calls, exact epoch metrics, early stopping, a stop at a step boundary.

It reads top to bottom: ``fit`` runs ``train_epochs``; each epoch runs ``train_epoch`` (the compiled K-step calls
over the loader's stacks, checking each call's losses while the next runs), then evaluation, then the commit.
What it builds on, each in its own module: the assembled run (``utils.assemble``: model, loss, metrics, optimizer,
loaders, callbacks), its typed settings (``training/config/settings.py``), the state on the devices and the compiled
steps (``training/compiled.py``), and what the run keeps (``training/run/saving.py``: checkpoints, the best value,
metrics rows).
"""

from __future__ import annotations

import logging
import math
import resource
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import jax
import numpy as np

from training.callbacks import of_schedule
from training.compiled import CompiledSteps
from training.config.components import schedule_length_note
from training.config.settings import Settings
from training.devices import distributed, peaks, platform
from training.metrics import metric_results
from training.run.saving import Checkpoints
from training.tracking.trackers import StepTrace

log = logging.getLogger("train")


class TrainingDiverged(Exception):
    pass


class Stopped(Exception):
    """A stop asked for by a signal, honoured at a step boundary after the position was saved."""

    def __init__(self, signum: int, message: str):
        super().__init__(message)
        self.signum = signum


def format_results(prefix: str, results: dict) -> str:
    return "  ".join(f"{prefix}/{k} {v:.4f}" for k, v in results.items() if isinstance(v, float))


def peak_rss_mb() -> float:
    """The process's peak resident memory (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (2**20 if sys.platform == "darwin" else 2**10)


class Trainer:
    def __init__(
        self,
        run,
        run_dir: Path | None,
        trackers: Sequence = (),
        config_hash: str | None = None,
        execution: str = "aot",
        settings: Settings | None = None,
    ):
        """``run``: the assembled run (``utils.assemble``) with its data loaded: its config, components, loaders and
        optimizer are the only source of what is trained and how; ``settings``: its config's, unless given.
        ``execution``: see ``CompiledSteps``."""
        self.run = run
        self.settings = settings or Settings.of(run.config)
        self.state = CompiledSteps(run, self.settings, execution)
        self.train_loader, self.valid_loader = run.loaders["train"], run.loaders.get("validation")
        self.checkpoints = Checkpoints(
            run_dir, self.settings, run.monitor, config_hash, self.state.evaluated, run.config, len(self.train_loader)
        )
        self.callbacks, self.trackers = list(run.callbacks) + of_schedule(self.state.lr_fn), list(trackers)
        self.ts = None  # the training state: made by init_state(), restore() or load_weights()
        self.origin = None  # where the state came from, for the log
        self.epoch = 0  # epochs completed
        self.position, self.resumed_totals = 0, None  # loader batches of the epoch under way done before a resume
        self.resumed_header = None
        self.resume_notes = []  # what changed since the checkpoint a run resumed from, for the log
        self.min_loss = math.inf  # the lowest step loss so far, for trainer.divergence_factor
        self.stop_training = None  # a reason set by a callback: the run ends before its next epoch
        self.stop_signal = None  # set by request_stop (a signal handler); honoured at the next step boundary
        self.first_call_logged, self.first_call_seconds = False, None
        self.data_wait, self.trace = 0.0, None
        self.lr_scale = 1.0  # reduce_on_plateau's factor of the lr, kept on the host (callbacks.ReduceOnPlateau)

    @property
    def run_dir(self) -> Path | None:
        return self.checkpoints.run_dir

    @run_dir.setter
    def run_dir(self, path: Path) -> None:
        self.checkpoints.run_dir = path

    # ------------------------------------------------------------------------------------ where the state comes from
    def init_state(self) -> dict:
        """A fresh state from the config's seed."""
        self.ts = self.state.init()
        self.origin = f"fresh state from seed {self.settings.seed}"
        return self.ts

    def restore(self, path: Path) -> None:
        """Continues from a checkpoint (``Checkpoints.resume``: what it refuses): state, epoch, position, best value."""
        self.ts, header, self.resumed_totals = self.state.restore(path)
        self.resume_notes = self.checkpoints.resume(header, path, int(self.ts["step"]))
        self.epoch, self.position = header["epoch"], header.get("position", 0)
        self.min_loss = header.get("min_loss") if isinstance(header.get("min_loss"), float) else math.inf
        self.resumed_header = header
        self.origin = f"resumed from {path}: epoch {self.epoch}, step {header['step']}" + (
            f" ({self.position} step(s) into epoch {self.epoch + 1})" if self.position else ""
        )
        self.origin += schedule_length_note(self.run.config, header.get("schedule_length"), self.settings.epochs)

    def load_weights(self, path: Path, exclude: Sequence[str] = ()) -> None:
        """Fine-tuning: params and model state from another checkpoint; optimizer and counters start fresh."""
        self.ts = self.state.load_weights(self.ts, path, exclude)
        kept = f" (kept fresh: {', '.join(exclude)})" if exclude else ""
        self.origin = f"params and model state from {path}{kept}, optimizer fresh"

    def applied_lr(self, step: int) -> float:
        return float(self.state.lr_fn(step)) * self.lr_scale

    # ------------------------------------------------------------------------------------------------------ the loop
    def fit(self) -> dict | None:
        """Trains to ``trainer.epochs`` (or an early stop); returns the best value of the monitored metric."""
        profile = self.settings.profile
        self.trace = StepTrace(self.run_dir / "profile", **profile) if profile else None
        self.state.compile(self.ts)
        try:
            for callback in self.callbacks:
                callback.on_train_start(self)
            if self.stop_training:
                log.info(self.stop_training)
                return self.checkpoints.best
            self.train_epochs()
            for callback in self.callbacks:
                callback.on_train_end(self)
        finally:
            self.checkpoints.wait()  # the last checkpoint is on disk before the run reports how it ended
        if self.trace:
            self.trace.stop(self.ts)
        return self.checkpoints.best

    def train_epochs(self) -> None:
        epochs, best = self.settings.epochs, self.checkpoints
        while self.epoch < epochs:
            epoch = self.epoch + 1
            start = time.perf_counter()
            ran = 1 - self.position / len(self.train_loader)  # the share of the epoch this process trains
            totals = self.train_epoch(epoch, self.position, self.resumed_totals)
            self.position, self.resumed_totals = 0, None
            train = metric_results(self.run.metrics, totals)  # waits for the epoch's last step
            seconds = time.perf_counter() - start
            row = {"epoch": epoch, "step": int(self.ts["step"]), **{f"train/{k}": v for k, v in train.items()}}
            if self.valid_loader is not None:
                row.update({f"val/{k}": v for k, v in self.evaluate(self.valid_loader, epoch).items()})
            row.update(
                {
                    "time/epoch_s": seconds,
                    "time/examples_per_s": ran * self.train_loader.num_examples / seconds,
                    "time/data_wait_s": self.data_wait,
                    "time/peak_rss_mb": peak_rss_mb(),
                    "lr": self.applied_lr(int(self.ts["step"]) - 1),
                }
            )
            row["time/model_flops_per_s"], row["time/mfu"] = peaks.of_run(self.state, row["time/examples_per_s"])
            for callback in self.callbacks:
                callback.on_epoch_end(self, epoch, row)
            self.epoch = epoch
            improved = best.update_best(row, epoch)
            log.info(
                f"epoch {epoch}/{epochs}  {format_results('train', train)}  "
                + format_results("val", {k[4:]: v for k, v in row.items() if k.startswith("val/")})
                + f"  {seconds:.1f}s  {row['time/examples_per_s']:.0f} ex/s"
                + (f"  MFU {row['time/mfu']:.1%}" if isinstance(row["time/mfu"], float) else "")
                + ("  *" if improved else "")
            )
            names, pause = best.commit_epoch(self.ts, self.header(), improved, row)
            log.debug(f"epoch {epoch} committed; the loop paused {1000 * pause:.0f} ms")
            for callback in self.callbacks:
                callback.on_checkpoint(self, names)
            for tracker in self.trackers:
                tracker.log_epoch(epoch, row, best.best)
            if self.agreed_stop() is not None and self.epoch < epochs:
                raise Stopped(self.stop_signal, f"saved at the end of epoch {epoch}")
            if best.early_stop_due():
                log.info(
                    f"early stop: {best.monitor.name} has not improved for {best.bad_epochs} epochs "
                    f"(best {best.best:.4f})"
                )
                break

    def train_epoch(self, epoch: int, start: int = 0, totals=None) -> dict:
        """One epoch's training steps from loader batch `start` of its order on (a resumed position, with the
        statistics `totals` it had gathered); saves the position when checkpoint_every says so or a stop was asked
        for. Positions count loader batches; steps count optimizer updates (trainer.accumulate_steps batches)."""
        from tqdm import tqdm

        state, loader, n = self.state, self.train_loader, self.state.accumulate
        batches = len(loader)
        interactive = sys.stderr.isatty()
        bar = tqdm(
            total=state.steps_per_epoch,
            initial=start // n,
            desc=f"epoch {epoch}",
            unit="step",
            leave=False,
            disable=not interactive,
        )
        totals = state.empty_stats() if totals is None else jax.device_put(totals, state.replicated)
        pending = None  # the previous call's per-step logs, read while the next call runs
        first_step = int(self.ts["step"])
        done, steps_done = 0, 0  # loader batches and steps run by this call of train_epoch
        self.skipped = start // n
        started = time.perf_counter()
        self.data_wait = 0.0
        chunks = state.calls(loader, epoch, start)  # at the steps per call measured for "auto"
        try:
            while True:
                waited = time.perf_counter()
                item = next(chunks, None)
                self.data_wait += time.perf_counter() - waited
                if item is None:
                    break
                real, stack = item
                real_steps = -(-real // n)
                if self.trace:
                    self.trace.before(first_step + steps_done + 1, first_step + steps_done + real_steps)
                self.ts, totals, logs = state.compiled_chunk(self.ts, totals, stack)
                if self.trace:
                    self.trace.after(first_step + steps_done + real_steps, self.ts)
                if pending is not None:
                    self.check_logs(epoch, *pending, bar)
                pending = (logs, steps_done, real_steps, first_step, started)
                done += real
                steps_done += real_steps
                if start + done < batches and self.position_save_due(first_step + steps_done):
                    self.check_logs(epoch, *pending, bar)  # a diverged state is never saved
                    pending = None
                    self.save_position(start + done, totals)
                    if self.stop_signal is not None:
                        raise Stopped(
                            self.stop_signal,
                            f"saved at step {first_step + steps_done} ({start + done} of {batches} into epoch {epoch})",
                        )
            if pending is not None:
                self.check_logs(epoch, *pending, bar)
        finally:
            # an error or a signal ends the epoch: the prefetch thread is joined and the dispatched steps finish,
            # so the process never exits with work in flight (which aborts it instead of returning its status)
            chunks.close()
            settle(self.ts)
            bar.close()
        return totals

    def log_first_call(self, steps: int) -> None:
        """Start-up cost: from the command's start (``platform.STARTED_AT``) to the first call's steps done."""
        self.first_call_logged = True
        self.first_call_seconds = time.time() - platform.STARTED_AT
        log.info(
            f"first {steps} training step(s) done {self.first_call_seconds:.1f}s after start "
            f"(compiling the step took {self.state.compile_seconds:.1f}s)"
        )

    def check_logs(self, epoch: int, logs: dict, done: int, real: int, first_step: int, started: float, bar) -> None:
        # read once the next call is dispatched; every value shown comes from `logs`, the learning rate included
        logs = jax.device_get(logs)
        if not self.first_call_logged:
            self.log_first_call(real)
        losses = logs["loss"][:real]
        # float16's loss scaling skips a step whose gradients overflowed (and lowers the scale): not a divergence
        skipped = logs["skipped"][:real] if "skipped" in logs else np.zeros(real, bool)
        if skipped.any():
            log.debug(f"{int(skipped.sum())} step(s) skipped by float16 loss scaling (gradients overflowed)")
        bad = np.flatnonzero(~np.isfinite(losses) & ~skipped)
        if bad.size:
            step = first_step + done + int(bad[0]) + 1
            raise TrainingDiverged(
                f"non-finite loss ({losses[bad[0]]}) at epoch {epoch}, step {step}; training stopped; "
                f"{self.checkpoints.kept()}"
            )
        factor = self.settings.divergence_factor
        for i, loss in enumerate(losses):
            if skipped[i]:
                continue
            if factor and 0 < self.min_loss and loss > factor * self.min_loss:
                step = first_step + done + i + 1
                raise TrainingDiverged(
                    f"diverging: loss {loss:.4g} at epoch {epoch}, step {step} is above "
                    f"trainer.divergence_factor {factor:g} x the lowest step loss "
                    f"{self.min_loss:.4g}; training stopped; {self.checkpoints.kept()}"
                )
            self.min_loss = min(self.min_loss, float(loss))
        every = self.settings.log_every
        rate = (done + real) / max(time.perf_counter() - started, 1e-9)  # steps/s this epoch, up to these steps
        examples_per_s = rate * self.train_loader.batch_size * self.settings.accumulate_steps
        eta = (self.state.steps_per_epoch - self.skipped - done - real) / rate
        for i in range(real):
            step = first_step + done + i + 1
            if step % every == 0:
                values = {
                    "train/step_loss": float(losses[i]),
                    "train/lr": float(logs["lr"][i]) * self.lr_scale,
                    "train/grad_norm": float(logs["grad_norm"][i]),
                }
                # with a live progress bar the console shows the bar; step lines still reach train.log
                level = logging.INFO if bar.disable else logging.DEBUG
                log.log(
                    level,
                    f"epoch {epoch} step {step}: loss {values['train/step_loss']:.6f}  "
                    f"lr {values['train/lr']:.3g}  grad_norm {values['train/grad_norm']:.3f}  "
                    f"{examples_per_s:.0f} ex/s  eta {int(eta) // 60}:{int(eta) % 60:02d}",
                )
                for tracker in self.trackers:
                    tracker.log_step(step, values)
                for callback in self.callbacks:
                    callback.on_step(self, step, values)
        if not bar.disable:  # tqdm shows the ETA itself
            lr = float(logs["lr"][real - 1]) * self.lr_scale
            bar.set_postfix(
                {"loss": f"{losses[-1]:.4f}", "lr": f"{lr:.3g}", "ex/s": f"{examples_per_s:.0f}"}, refresh=False
            )
            bar.update(real)

    def evaluate(self, loader, epoch: int = 0) -> dict:
        """The loss and metrics of `loader`'s batches under the evaluated parameters."""
        return metric_results(self.run.metrics, self.state.evaluate(self.ts, loader, epoch))

    # ------------------------------------------------------------------------------------ stopping and saving midway
    def header(self) -> dict:
        header = self.checkpoints.header(self.epoch, int(self.ts["step"]), self.min_loss)
        return {**header, "schedule_length": {"epochs": self.run.epochs, "steps_per_epoch": self.run.steps_per_epoch}}

    def request_stop(self, signum: int) -> None:
        """Called from a signal handler: the loop saves and stops at the next step boundary."""
        self.stop_signal = signum

    def position_save_due(self, step: int) -> bool:
        """Whether to save the position now (a stop was asked for, or checkpoint_every says so), agreed by every
        process: a signal or a clock seen by some processes only must not make them save (a collective) or stop
        alone. A stop asked of any process becomes every process's."""
        due = self.checkpoints.save_due(step)
        signum, due = distributed.max_over_processes(self.stop_signal or 0, int(due))
        self.stop_signal = self.stop_signal or signum or None
        return bool(signum or due)

    def agreed_stop(self) -> int | None:
        """The stop signal any process received (every process then stops at the same boundary), or None."""
        (signum,) = distributed.max_over_processes(self.stop_signal or 0)
        self.stop_signal = self.stop_signal or signum or None
        return self.stop_signal

    def save_position(self, position: int, totals) -> None:
        """A checkpoint in the middle of an epoch (``Checkpoints.save_position``)."""
        header = {**self.header(), "position": position}
        names, pause = self.checkpoints.save_position(self.ts, totals, header)
        log.info(
            f"checkpoint at step {header['step']} ({position} of {len(self.train_loader)} into epoch "
            f"{self.epoch + 1}); the loop paused {1000 * pause:.0f} ms"
        )
        for callback in self.callbacks:
            callback.on_checkpoint(self, names)


def settle(tree) -> None:
    """Waits for the computations that produce `tree` (some may have been donated: those are skipped)."""
    for leaf in jax.tree.leaves(tree):
        try:
            leaf.block_until_ready()
        except (RuntimeError, AttributeError):
            pass
