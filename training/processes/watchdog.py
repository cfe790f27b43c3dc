"""The watchdog: a process of the run that dies or hangs ends the others with one clear line and exit status 1,
instead of leaving them blocked in a collective."""

from __future__ import annotations

import os
import re
import sys
import threading
import time

from training.processes import store

# A dead process is noticed within this many seconds (its heartbeats stop); the others then end with an error.
HEARTBEAT_TIMEOUT_S = 60
# JAX's own heartbeat is the backstop for a watchdog that cannot run; it notices a dead process between half its
# timeout and its timeout after the death and then aborts the others with a C++ stack trace. Half of it stays this
# many seconds beyond the watchdog's timeout, so that the watchdog's one line comes first however loaded the machine.
WATCHDOG_MARGIN_S = 10
DONE = "done"  # a process's counter once it reached the end of the run


class Watchdog:
    """Every process bumps its own counter in the coordinator's key-value store each second; one that stays still
    for ``timeout`` seconds, or a coordinator that no longer answers (process 0 died), stops this one with exit
    status 1. The last checkpoint stays on disk (writes are atomic) to resume from. ``jax.distributed``'s own
    heartbeat (see WATCHDOG_MARGIN_S) remains the backstop; ``stop`` ends the watch at the end of the run."""

    current = None
    POLL_S = 1.0

    def __init__(self, process_id: int, num_processes: int, timeout: float):
        self.process_id, self.num_processes, self.timeout = process_id, num_processes, timeout
        self.stopped = False
        self.lock = threading.Lock()  # the counter is never bumped after stop() wrote DONE

    def start(self) -> None:
        Watchdog.current = self
        threading.Thread(target=self.watch, name="process-watchdog", daemon=True).start()
        previous = sys.excepthook

        def wait_then_report(kind, error, traceback):
            wait_for_watchdog(error)  # a dead process: the watchdog's one line, not this traceback
            previous(kind, error, traceback)

        sys.excepthook = wait_then_report

    def stop(self) -> None:
        """No more watching: this process reached the end and waits for the others, which must not take its
        silence for a death."""
        with self.lock:
            self.stopped = True
            store.client().key_value_set(f"train/alive/{self.process_id}", DONE, allow_overwrite=True)

    def watch(self) -> None:
        client, me = store.client(), self.process_id
        seen: dict = {}  # process -> (its counter, when it last changed)
        unreachable_since = None
        beat = 0
        while not self.stopped:
            now = time.monotonic()
            try:
                beat += 1
                with self.lock:
                    if self.stopped:
                        return
                    client.key_value_set(f"train/alive/{me}", str(beat), allow_overwrite=True)
                counters = dict(client.key_value_dir_get("train/alive/"))
                unreachable_since = None
            except Exception as error:  # noqa: BLE001 (any failure to reach the coordinator)
                unreachable_since = unreachable_since or now
                if now - unreachable_since >= min(self.timeout, 10) and not self.stopped:
                    first = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
                    self.abort(f"the coordinator (process 0) no longer answers: it died or was stopped ({first})")
                time.sleep(self.POLL_S)
                continue
            for process in range(self.num_processes):
                value = counters.get(f"train/alive/{process}")
                last = seen.get(process)
                if process == me or value == DONE:  # a process at the end waits for the others; not a death
                    continue
                if last is None or last[0] != value:
                    seen[process] = (value, now)
                elif now - last[1] >= self.timeout and not self.stopped:
                    self.abort(
                        f"process {process} of {self.num_processes} gave no sign of life for "
                        f"{self.timeout:g} s: it died or hangs"
                    )
            time.sleep(self.POLL_S)

    def abort(self, why: str) -> None:
        print(
            f"error: {why}; process {self.process_id} stops too (exit status 1). The last checkpoint "
            f"is kept: resume with -r",
            file=sys.stderr,
            flush=True,
        )
        os._exit(1)


def wait_for_watchdog(error: BaseException) -> None:
    """Before the traceback of an error no one caught: when a collective failed because another process died (gloo:
    "Connection closed by peer"), waits for the watchdog's one line and exit status 1 instead; returns (the
    traceback follows) when the runtime did not raise the error or every process stays alive. A dead process 0
    takes the coordinator with it: JAX's C++ agent then aborts this process within a second, which no Python code
    can stop (its missed-heartbeat hook fails with std::bad_cast when given a Python callable); the wait keeps the
    traceback out of that ending too."""
    watchdog = Watchdog.current
    if watchdog is None or watchdog.stopped or not runtime_error(error):
        return
    time.sleep(watchdog.timeout + WATCHDOG_MARGIN_S)


def runtime_error(error: BaseException | None) -> bool:
    """Whether XLA's runtime raised `error` or one behind it (a JaxRuntimeError, or another class carrying an absl
    status such as "UNKNOWN: Gloo AllGather failed"), not Python code."""
    import jax

    while error is not None:
        if isinstance(error, jax.errors.JaxRuntimeError) or re.match(r"[A-Z][A-Z_]{3,}: ", str(error)):
            return True
        error = error.__cause__ or error.__context__
    return False
