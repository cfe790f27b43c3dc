"""What the loop reports to with no tracker library: ``History`` (every epoch's row in memory, what ``utils.fit``
returns to a notebook) and ``StepTrace`` (a profiler trace of a few steps). Trackers that send these values elsewhere
are an optional feature's folder, with their config sections.

A tracker is any object with ``log_step(step, values)`` (every ``trainer.log_every`` steps: step loss, learning
rate, gradient norm), ``log_epoch(epoch, row, best)`` (the epoch's row of ``metrics.jsonl``) and
``close(exit_code)``; ``Trainer(trackers=...)`` takes a list of them.
"""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger("train")


class History:
    """Keeps every epoch's row in memory: what ``utils.fit`` returns to a notebook."""

    def __init__(self):
        self.rows: list[dict] = []

    def log_step(self, step: int, values: dict) -> None:
        pass

    def log_epoch(self, epoch: int, row: dict, best) -> None:
        self.rows.append(dict(row))

    def close(self, exit_code: int = 0) -> None:
        pass


class StepTrace:
    """A `jax.profiler` trace of steps ``start_step`` .. ``start_step + num_steps - 1`` (1-based, as logged) in
    ``log_dir``: open it in TensorBoard's profile tab or drop ``perfetto_trace.json.gz`` on ui.perfetto.dev.
    With several steps per jitted call the trace covers the whole calls that hold those steps."""

    def __init__(self, log_dir: Path, start_step: int, num_steps: int):
        self.log_dir = Path(log_dir)
        self.first, self.last = start_step, start_step + num_steps - 1
        self.tracing = self.done = False

    def before(self, first_step: int, last_step: int) -> None:
        """Called before the call that runs steps first_step..last_step."""
        if not (self.tracing or self.done) and first_step <= self.last and last_step >= self.first:
            import jax

            try:
                jax.profiler.start_trace(str(self.log_dir), create_perfetto_trace=True)
                self.tracing = True
            except Exception as error:  # e.g. another trace already running in this process
                log.warning(f"profile: could not start a trace ({type(error).__name__}: {error})")
                self.done = True

    def after(self, last_step: int, outputs) -> None:
        if self.tracing and last_step >= self.last:
            self.stop(outputs)

    def stop(self, outputs=None) -> None:
        if not self.tracing:
            return
        import jax

        jax.block_until_ready(outputs)  # dispatch is asynchronous: the traced steps must finish inside the trace
        self.tracing, self.done = False, True
        try:
            jax.profiler.stop_trace()
        except Exception as error:
            log.warning(f"profile: could not write the trace ({type(error).__name__}: {error})")
            return
        log.info(f"profile of steps {self.first}..{self.last} written to {self.log_dir}")
