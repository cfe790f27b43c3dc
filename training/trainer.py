"""The training loop: epochs of jitted K-step calls, exact epoch metrics, early stopping, a stop at a step boundary.

It reads top to bottom: ``train`` runs the epochs; each runs ``train_epoch`` (the compiled K-step calls over the
loader's stacks, their logs read in groups and never the call just dispatched: ``OneCallLate``, ``Progress``), then
``end_epoch`` (evaluation, the row, the commit). One update, from train.py to its gradient: ``Trainer.train`` ->
``Trainer.train_epoch`` -> the compiled call of ``step.train_call`` -> ``step.train_step`` -> ``step.micro_step``
-> ``step.objective``.
What it builds on, each in its own module: the assembled run (``training/assembly.py``: model, loss, metrics, optimizer,
loaders, callbacks), its typed settings (``training/config/settings.py``), the state it starts from
(``training/startup.py``: fresh, resumed or fine-tuned, handed to ``Trainer.begin``), where arrays live
(``training/devices/placement.py``), the compiled calls (``training/compiled.py``), how many steps each call runs
(``training/steps_per_call.py``), when it stops or saves inside an epoch (``training/run/stops.py``), and what the run
keeps (``training/run/saving.py``: checkpoints, the best value, metrics rows).
"""

from __future__ import annotations

import logging
import math
import resource
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import jax
import numpy as np

from training import state
from training.callbacks import of_schedule
from training.compiled import Compiled
from training.config.settings import Settings
from training.devices import compilation_cache, memory, mesh, peaks, platform
from training.devices.placement import Placement
from training.metrics import metric_results
from training.precision import policy_of
from training.run.history import StepTrace
from training.run.saving import Checkpoints
from training.run.stops import Stops
from training.step import log_columns
from training.steps_per_call import StepsPerCall, key_of

log = logging.getLogger("train")


# The loop reads the calls' logs (the divergence check, the step lines, trackers and callbacks, the live bar) every
# READ_EVERY_S or READ_EVERY_STEPS steps, whichever comes first, whatever trainer.log_every, and takes every call
# since the last read together: a read costs the host a fixed part (numpy over the group, a log record, the bar) that
# is more than a small step's own dispatch, so quick steps are read in large groups (benchmarks/README.md, "The loop's
# own cost"). Step lines of quick steps so arrive in bursts ten times a second, and a diverged step is found within
# READ_EVERY_S (a diverged state is never saved: the logs are read before every checkpoint); READ_EVERY_STEPS bounds
# the calls held unread when steps are very quick.
READ_EVERY_S = 0.1
READ_EVERY_STEPS = 1024


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
        count_flops: bool | None = None,
        recorded: dict | None = None,
    ):
        """``run``: the assembled run (``training.assembly.assemble``) with its data loaded: its config, components,
        loaders and optimizer are the only source of what is trained and how; ``settings``: its config's, unless
        given. ``execution`` and ``count_flops``: see ``Compiled``. ``recorded``: the config as every checkpoint's
        header records it, as the run folder's config.json does (run.config unless given). The state comes next
        (``begin``)."""
        self.run = run
        recorded = recorded or run.config
        self.settings = settings = settings or Settings.of(run.config)
        self.execution, self.count_flops = execution, count_flops
        self.train_loader, self.valid_loader = run.loaders["train"], run.loaders.get("validation")
        self.accumulate = settings.accumulate_steps
        self.steps_per_epoch = -(-len(self.train_loader) // self.accumulate)
        self.precision = policy_of(settings.precision)
        self.placement = Placement(run.config.get("mesh"), self.train_loader.spec)
        self.placement.check_batch_size(self.train_loader.batch_size)
        self.placement.share(self.train_loader, self.valid_loader)
        self.steps_per_call = StepsPerCall(
            settings.steps_per_call,
            self.steps_per_epoch,
            self.accumulate * memory.nbytes(self.train_loader.spec),
            settings.epochs * self.steps_per_epoch,
        )
        aot = execution == "aot"  # "auto" starts at a choice remembered beside the compilation cache, else measures
        key = key_of(run.config, self.train_loader.spec)
        self.steps_per_call.start(key, compilation_cache.folder() if aot else None, measure=aot)
        self.build_calls()
        self.compiled.check_step(self.abstract_state)
        self.checkpoints = Checkpoints(
            run_dir, settings, run.monitor, config_hash, self.compiled.evaluated, recorded, len(self.train_loader)
        )
        self.stops = Stops(self.checkpoints, self.steps_per_call)
        self.callbacks, self.trackers = list(run.callbacks) + of_schedule(self.lr_fn), list(trackers)
        self.start = self.train_state = None  # where training starts (``begin``), and the training state
        self.epoch = 0  # epochs completed
        self.min_loss = math.inf  # the lowest step loss so far, for trainer.divergence_factor
        self.stop_training = None  # a reason set by a callback: the run ends before its next epoch
        self.first_call_seconds = None  # from the command's start to the first call's steps done, once logged
        self.data_wait, self.trace = 0.0, None
        self.lr_scale = 1.0  # reduce_on_plateau's factor of the lr, kept on the host (callbacks.ReduceOnPlateau)

    def build_calls(self) -> None:
        """The optimizer (``Run.optimizer``: its schedule counts the run's steps) and the compiled calls made with it;
        again after a resume, whose checkpoint's schedule length the run keeps (``startup.from_checkpoint``)."""
        self.optimizer, self.lr_fn = self.run.optimizer()  # the one learning rate: the step's and the logged
        # the state's abstract value (read-only), traced once per optimizer: start-up asks for it several times
        self.abstract_state = state.template(self.run, self.optimizer, self.precision)
        sharding = self.placement.state_sharding(self.abstract_state)
        parts = (self.placement, self.optimizer, self.lr_fn, sharding, self.execution, self.count_flops)
        self.compiled = Compiled(self.run, self.settings, *parts)

    def place_stacks(self, host_arrays: bool) -> None:
        """Stacks as the host's arrays, or packed onto the devices (``Placement``); rebuilds the compiled calls."""
        self.placement = Placement(self.run.config.get("mesh"), self.train_loader.spec, host_arrays)
        self.build_calls()
        if self.train_state is not None:
            self.compiled.start_compiling(self.steps_per_call.k, mesh.spec_of(self.train_state))

    def begin(self, start) -> None:
        """Takes the state training starts from (a ``training.startup.Start``: fresh, resumed or fine-tuned)."""
        self.start, self.train_state, self.epoch, self.min_loss = start, start.train_state, start.epoch, start.min_loss

    @property
    def run_dir(self) -> Path | None:
        return self.checkpoints.run_dir

    @run_dir.setter
    def run_dir(self, path: Path) -> None:
        self.checkpoints.run_dir = path

    def applied_lr(self, step: int) -> float:
        """The learning rate at `step`: the schedule's (``lr_fn``), times reduce_on_plateau's scale."""
        return float(self.lr_fn(step)) * self.lr_scale

    # ------------------------------------------------------------------------------------------------------ the loop
    def train(self) -> dict | None:
        """Trains to ``trainer.epochs`` (or an early stop); returns the best value of the monitored metric."""
        profile = self.settings.profile
        self.trace = StepTrace(self.run_dir / "profile", **profile) if profile else None
        self.log_compile()
        try:
            for callback in self.callbacks:
                callback.on_train_start(self)
            if self.stop_training:
                log.info(self.stop_training)
                return self.checkpoints.best
            # the first epoch goes on from a resumed position, with the statistics gathered before it
            position, gathered = (
                (self.start.position, self.start.totals) if self.epoch == self.start.epoch else (0, None)
            )
            while self.epoch < self.settings.epochs:
                started = time.perf_counter()
                ran = 1 - position / len(self.train_loader)  # the share of the epoch this process trains
                totals = self.train_epoch(self.epoch + 1, position, gathered)
                position, gathered = 0, None
                if self.end_epoch(totals, started, ran):
                    break
            for callback in self.callbacks:
                callback.on_train_end(self)
        finally:
            self.checkpoints.wait()  # the last checkpoint is on disk before the run reports how it ended
        if self.trace:
            self.trace.stop(self.train_state)
        return self.checkpoints.best

    def train_epoch(self, epoch: int, position: int = 0, totals=None) -> dict:
        """One epoch's training steps from loader batch `position` of its order on (a resumed position, with the
        statistics `totals` it had gathered); saves the position when ``stops`` says so. Positions count loader
        batches; steps count optimizer updates (trainer.accumulate_steps batches). The calls run
        ``steps_per_call.k`` steps each; where "auto" chooses another K mid-epoch, the epoch goes on at it."""
        n, batches = self.accumulate, len(self.train_loader)
        totals = self.compiled.empty_stats() if totals is None else jax.device_put(totals, self.placement.replicated)
        progress = self.progress(epoch, skipped=position // n)
        logs = OneCallLate(progress.check, progress.due)
        done, calls = position, 0  # loader batches of the epoch done; calls made by this train_epoch
        try:
            while done < batches:
                k = self.switch_steps_per_call()
                call = self.compiled.train_call(k)  # the compiled call of k steps: fixed until "auto" switches
                stacks = self.train_loader.stacks(epoch, k * n, self.placement.put_stack, done)
                try:
                    for real, stack in progress.waiting_for_data(stacks):
                        real_steps = -(-real // n)
                        progress.before_call(real_steps)
                        self.train_state, totals, call_logs = call(self.train_state, totals, stack)
                        logs.add(call_logs, *progress.after_call(real_steps, call_logs, self.train_state))
                        done, calls = done + real, calls + 1
                        if done < batches and self.stops.due(progress.step, calls):
                            logs.flush()  # a diverged state is never saved
                            self.min_loss = progress.min_loss
                            self.save_position(done, totals)
                        if self.switch_steps_per_call() != k:
                            break
                finally:  # the prefetch thread joined, the steps dispatched done: a process exiting with work in
                    stacks.close()  # flight aborts instead of returning its status
            logs.flush()
        finally:
            settle(self.train_state)
            progress.close()
            self.min_loss, self.data_wait = progress.min_loss, progress.data_wait
            self.first_call_seconds = progress.first_call_seconds
        return totals

    def save_position(self, position: int, totals) -> None:
        """A checkpoint `position` loader batches into the epoch under way (``Stops.save``); then the stop asked
        for, if one was."""
        header = {**self.header(), "position": position}
        names = self.stops.save(self.train_state, totals, header, len(self.train_loader))
        for callback in self.callbacks:
            callback.on_checkpoint(self, names)
        if self.stops.signal is not None:
            where = f"{position} of {len(self.train_loader)} into epoch {self.epoch + 1}"
            raise Stopped(self.stops.signal, f"saved at step {header['step']} ({where})")

    def progress(self, epoch: int, skipped: int) -> Progress:
        """The epoch's ``Progress``, given everything it reads and reports to."""
        return Progress(
            epoch,
            first_step=int(self.train_state["step"]),
            skipped=skipped,
            steps_per_epoch=self.steps_per_epoch,
            examples_per_step=self.train_loader.batch_size * self.accumulate,
            settings=self.settings,
            steps_per_call=self.steps_per_call,
            trace=self.trace,
            trackers=self.trackers,
            on_step=self.on_step if self.callbacks else None,
            kept=self.checkpoints.kept,
            lr_scale=self.lr_scale,  # reduce_on_plateau changes it at an epoch's end only
            group_lrs=getattr(self.lr_fn, "groups", {}),
            min_loss=self.min_loss,
            first_call_seconds=self.first_call_seconds,
            compile_seconds=self.compiled.seconds.get(self.steps_per_call.k, 0.0),
        )

    def switch_steps_per_call(self) -> int:
        """The steps per call to run from here: "auto"'s choice once its call has compiled in the background, else the
        calls' until now: the loop never waits for it (several processes do, so that they all switch at one call)."""
        per_call = self.steps_per_call
        if per_call.chosen != per_call.k:
            self.compiled.start_compiling(per_call.chosen, mesh.spec_of(self.train_state))
            if jax.process_count() > 1 or self.compiled.ready(per_call.chosen):
                self.compiled.train_call(per_call.chosen)
                seconds, where = (
                    self.compiled.seconds.get(per_call.chosen, 0.0),
                    self.compiled.origins.get(per_call.chosen),
                )
                log.info(
                    f"compiled the training step ({per_call.chosen} step(s) per call) in {seconds:.1f}s{where or ''}"
                )
                per_call.k = per_call.chosen
        return per_call.k

    def log_compile(self) -> None:
        """Waits for the training call the run starts with, and logs its compilation (``Compiled.report``)."""
        self.compiled.report(self.steps_per_call.k, self.train_loader.batch_size, self.steps_per_call.note)

    def end_epoch(self, totals: dict, started: float, ran: float) -> bool:
        """An epoch's end: its metrics (and validation's), its row logged and committed, the callbacks and trackers
        told; a stop asked for raises ``Stopped``. Returns whether the run stops early (trainer.early_stop)."""
        epoch, epochs, checkpoints = self.epoch + 1, self.settings.epochs, self.checkpoints
        train = metric_results(self.run.metrics, totals)  # waits for the epoch's last step
        seconds = time.perf_counter() - started
        row = {"epoch": epoch, "step": int(self.train_state["step"]), **{f"train/{k}": v for k, v in train.items()}}
        if self.valid_loader is not None:
            row.update({f"val/{k}": v for k, v in self.evaluate(self.valid_loader, epoch).items()})
        row.update(
            {
                "time/epoch_s": seconds,
                "time/examples_per_s": ran * self.train_loader.num_examples / seconds,
                "time/data_wait_s": self.data_wait,
                "time/peak_rss_mb": peak_rss_mb(),
                "lr": self.applied_lr(int(self.train_state["step"]) - 1),
            }
        )
        for name, lr_fn in getattr(self.lr_fn, "groups", {}).items():  # optimizer.groups: each group's rate too
            row[f"lr/{name}"] = float(lr_fn(int(self.train_state["step"]) - 1))
        peak = peaks.peak_flops(self.placement.mesh.devices.flat[0].device_kind, self.precision.compute)
        flops, mfu = peaks.utilization(
            self.compiled.flops_per_example, row["time/examples_per_s"], peak, self.placement.mesh.size
        )
        row["time/model_flops_per_s"], row["time/mfu"] = flops, mfu
        for callback in self.callbacks:
            callback.on_epoch_end(self, epoch, row)
        self.epoch = epoch
        improved = checkpoints.update_best(row, epoch)
        log.info(
            f"epoch {epoch}/{epochs}  {format_results('train', train)}  "
            + format_results("val", {k[4:]: v for k, v in row.items() if k.startswith("val/")})
            + f"  {seconds:.1f}s  {row['time/examples_per_s']:.0f} ex/s"
            + (f"  MFU {row['time/mfu']:.1%}" if isinstance(row["time/mfu"], float) else "")
            + ("  *" if improved else "")
        )
        names, pause = checkpoints.commit_epoch(self.train_state, self.header(), improved, row)
        log.debug(f"epoch {epoch} committed; the loop paused {1000 * pause:.0f} ms")
        for callback in self.callbacks:
            callback.on_checkpoint(self, names)
        for tracker in self.trackers:
            tracker.log_epoch(epoch, row, checkpoints.best)
        if self.stops.agreed_stop() is not None and self.epoch < epochs:  # every process agrees, then compares
            raise Stopped(self.stops.signal, f"saved at the end of epoch {epoch}")
        if checkpoints.early_stop_due():
            monitor, bad, best = checkpoints.monitor.name, checkpoints.bad_epochs, checkpoints.best
            log.info(f"early stop: {monitor} has not improved for {bad} epochs (best {best:.4f})")
            return True
        return False

    def on_step(self, step: int, values: dict) -> None:
        for callback in self.callbacks:
            callback.on_step(self, step, values)

    def evaluate(self, loader, epoch: int = 0) -> dict:
        """The loss and metrics of `loader`'s batches under the evaluated parameters."""
        return metric_results(self.run.metrics, self.compiled.evaluate(self.train_state, loader, epoch))

    def header(self) -> dict:
        """What a checkpoint records besides the state (``Checkpoints.header``), with the length the schedules count."""
        header = self.checkpoints.header(self.epoch, int(self.train_state["step"]), self.min_loss)
        return {**header, "schedule_length": {"epochs": self.run.epochs, "steps_per_epoch": self.run.steps_per_epoch}}


class OneCallLate:
    """The calls' logs stay on the device until the loop wants them: ``add`` takes the logs of the call just
    dispatched and, when ``due`` says so, reads the earlier calls' together (never the call just dispatched: the host
    does not wait for the step it just started); ``flush`` reads them all (before a save, and at the epoch's end).
    Each call's logs are one array (``step.LOGS``), so a read costs one transfer per call and one check in all."""

    def __init__(self, read, due):
        self.read, self.due, self.pending = read, due, []

    def add(self, logs, before: int, real: int) -> None:
        """`logs` of the call that runs the epoch's `real` steps after its first `before`."""
        self.pending.append((logs, before, real))
        if len(self.pending) > 1 and self.due(before):
            earlier, self.pending = self.pending[:-1], self.pending[-1:]
            self.read(earlier)

    def flush(self) -> None:
        pending, self.pending = self.pending, []
        if pending:
            self.read(pending)


class Progress:
    """An epoch under way as the loop sees it: the step reached, the time spent waiting for data (``data_wait``), the
    profile's trace around each call, and each call's logs read (``check``): divergence against the lowest step loss
    so far (``min_loss``), the first call's start-up line (``first_call_seconds``), the step lines, the trackers and
    ``on_step``, the progress bar (a live one where stderr is a terminal). It holds what it is given and reaches into
    nothing; the loop reads those three back."""

    def __init__(
        self,
        epoch: int,
        *,
        first_step: int,
        skipped: int,
        steps_per_epoch: int,
        examples_per_step: int,
        settings: Settings,
        steps_per_call: StepsPerCall,
        trace: StepTrace | None,
        trackers: Sequence,
        on_step: Callable[[int, dict], None] | None,
        kept: Callable[[], str],
        lr_scale: float,
        group_lrs: dict[str, Callable],
        min_loss: float,
        first_call_seconds: float | None,
        compile_seconds: float,
    ):
        from tqdm import tqdm

        self.epoch, self.first_step, self.skipped, self.steps_per_epoch = epoch, first_step, skipped, steps_per_epoch
        self.examples_per_step, self.settings = examples_per_step, settings
        self.steps_per_call, self.trace = steps_per_call, trace
        self.trackers, self.on_step, self.kept, self.lr_scale = trackers, on_step, kept, lr_scale
        self.group_lrs = group_lrs  # optimizer.groups: each group's rate, logged beside "lr" (the first group's)
        self.min_loss, self.first_call_seconds, self.compile_seconds = min_loss, first_call_seconds, compile_seconds
        self.data_wait = 0.0
        self.steps_done = 0  # steps run by this epoch's calls so far
        self.read_to = 0  # steps of this epoch whose logs have been read
        self.started = self.read_at = time.perf_counter()
        self.bar = tqdm(
            total=steps_per_epoch,
            initial=skipped,
            desc=f"epoch {epoch}",
            unit="step",
            leave=False,
            disable=not sys.stderr.isatty(),
        )

    @property
    def step(self) -> int:
        """The training state's step once the calls dispatched so far are done."""
        return self.first_step + self.steps_done

    def waiting_for_data(self, stacks):
        """The loader's stacks, the time spent waiting for each counted in ``data_wait``."""
        while True:
            waited = time.perf_counter()
            item = next(stacks, None)
            self.data_wait += time.perf_counter() - waited
            if item is None:
                return
            yield item

    def before_call(self, real_steps: int) -> None:
        if self.trace:
            self.trace.before(self.step + 1, self.step + real_steps)
        if self.steps_per_call.measuring:
            self.steps_per_call.before_call()

    def after_call(self, real_steps: int, call_logs, train_state: dict) -> tuple[int, int]:
        """The call's place, for ``check``: (steps of the epoch before it, its real steps). While "auto" measures,
        the call is timed (waited for)."""
        if self.steps_per_call.measuring:
            self.steps_per_call.after_call(call_logs, self.step + real_steps, self.compile_seconds)
        before, self.steps_done = self.steps_done, self.steps_done + real_steps
        if self.trace:
            self.trace.after(self.step, train_state)
        return before, real_steps

    def due(self, done: int) -> bool:
        """Whether to read the logs of the epoch's first `done` steps now: the first call's (the start-up line), then
        after READ_EVERY_S or READ_EVERY_STEPS steps."""
        return (
            self.first_call_seconds is None
            or done - self.read_to >= READ_EVERY_STEPS
            or time.perf_counter() - self.read_at >= READ_EVERY_S
        )

    def check(self, calls: list) -> None:
        """The logs of consecutive calls ((logs, steps of the epoch before the call, its real steps) each), read from
        the device: every value shown comes from them, the learning rate included."""
        logs = log_columns(np.concatenate([np.asarray(logs)[:real] for logs, _, real in calls]))
        before, real = calls[0][1], len(logs["loss"])
        self.read_to, self.read_at = before + real, time.perf_counter()
        if self.first_call_seconds is None:
            self.log_first_call(real)
        # float16's loss scaling skips a step whose gradients overflowed (and lowers the scale): not a divergence
        skipped = logs["skipped"] > 0
        if skipped.any():
            log.debug(f"{int(skipped.sum())} step(s) skipped by float16 loss scaling (gradients overflowed)")
        first = self.first_step + before
        self.check_losses(logs["loss"], skipped, first)
        rate = (before + real) / max(time.perf_counter() - self.started, 1e-9)  # steps/s this epoch, so far
        examples_per_s = rate * self.examples_per_step
        eta = (self.steps_per_epoch - self.skipped - before - real) / rate
        self.log_steps(logs, first, examples_per_s, eta, console=self.bar.disable)
        self.show(logs, examples_per_s)

    def log_first_call(self, steps: int) -> None:
        """Start-up cost: from the command's start (``platform.STARTED_AT``) to the first call's steps done."""
        self.first_call_seconds = time.time() - platform.STARTED_AT
        log.info(
            f"first {steps} training step(s) done {self.first_call_seconds:.1f}s after start "
            f"(compiling the step took {self.compile_seconds:.1f}s)"
        )

    def check_losses(self, losses: np.ndarray, skipped: np.ndarray, first: int) -> None:
        """Raises TrainingDiverged at a non-finite step loss, or one above trainer.divergence_factor x the lowest so
        far (`first`: the step before these losses'); steps that float16's loss scaling skipped do not count."""
        bad = np.flatnonzero(~np.isfinite(losses) & ~skipped)
        if bad.size:
            raise TrainingDiverged(
                f"non-finite loss ({losses[bad[0]]}) at epoch {self.epoch}, step {first + int(bad[0]) + 1}; training "
                f"stopped; {self.kept()}"
            )
        factor = self.settings.divergence_factor
        # lowest[i]: the lowest loss before step i (skipped steps not counted); lowest[-1]: after them all
        lowest = np.minimum.accumulate(np.concatenate([[self.min_loss], np.where(skipped, np.inf, losses)]))
        over = np.flatnonzero(~skipped & (lowest[:-1] > 0) & (losses > factor * lowest[:-1])) if factor else []
        if len(over):
            i = over[0]
            raise TrainingDiverged(
                f"diverging: loss {losses[i]:.4g} at epoch {self.epoch}, step {first + i + 1} is above "
                f"trainer.divergence_factor {factor:g} x the lowest step loss "
                f"{lowest[i]:.4g}; training stopped; {self.kept()}"
            )
        self.min_loss = float(lowest[-1])

    def log_steps(self, logs: dict, first: int, examples_per_s: float, eta: float, console: bool) -> None:
        """Every trainer.log_every-th step of `logs` (the steps after step `first`): the trackers, the callbacks and
        a log line (``console``: at INFO, else the progress bar shows the console and the line reaches train.log
        only); the lines of one read in one log record (each a line of train.log, ``run.cli.EachLine``)."""
        index = np.flatnonzero((first + 1 + np.arange(len(logs["loss"]))) % self.settings.log_every == 0)
        if not index.size:
            return
        # whole columns to Python floats at once (a read at log_every 1 holds up to READ_EVERY_STEPS lines)
        numbers = (first + 1 + index).tolist()  # the steps' numbers
        loss, grad_norm = logs["loss"][index].tolist(), logs["grad_norm"][index].tolist()
        lr = (logs["lr"][index].astype(np.float64) * self.lr_scale).tolist()
        # a schedule is a function of the step: each group's rates at these steps in one call of it
        steps = np.asarray(numbers) - 1
        groups = {
            name: (np.broadcast_to(np.asarray(lr_fn(steps), np.float64), steps.shape) * self.lr_scale).tolist()
            for name, lr_fn in self.group_lrs.items()
        }
        rates = [
            "  ".join(f"lr/{name} {rate[i]:.3g}" for name, rate in groups.items()) or f"lr {lr[i]:.3g}"
            for i in range(len(numbers))
        ]
        tail = f"  {examples_per_s:.0f} ex/s  eta {int(eta) // 60}:{int(eta) % 60:02d}"
        lines = [
            f"epoch {self.epoch} step {s}: loss {a:.6f}  {r}  grad_norm {c:.3f}{tail}"
            for s, a, r, c in zip(numbers, loss, rates, grad_norm)
        ]
        log.log(logging.INFO if console else logging.DEBUG, "\n".join(lines))
        if self.trackers or self.on_step:
            for i, (step, *values) in enumerate(zip(numbers, loss, lr, grad_norm)):
                values = dict(zip(("train/step_loss", "train/lr", "train/grad_norm"), values))
                values.update({f"train/lr/{name}": rate[i] for name, rate in groups.items()})
                for tracker in self.trackers:
                    tracker.log_step(step, values)
                if self.on_step:
                    self.on_step(step, values)

    def show(self, logs: dict, examples_per_s: float) -> None:
        """The progress bar's figures (it shows the ETA itself)."""
        if self.bar.disable:
            return
        lr = float(logs["lr"][-1]) * self.lr_scale
        self.bar.set_postfix(
            {"loss": f"{logs['loss'][-1]:.4f}", "lr": f"{lr:.3g}", "ex/s": f"{examples_per_s:.0f}"}, refresh=False
        )
        self.bar.update(len(logs["loss"]))

    def close(self) -> None:
        self.bar.close()


def settle(tree) -> None:
    """Waits for the computations that produce `tree` (some may have been donated: those are skipped)."""
    for leaf in jax.tree.leaves(tree):
        try:
            leaf.block_until_ready()
        except (RuntimeError, AttributeError):
            pass
