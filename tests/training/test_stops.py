"""training/run/stops.py: when the loop saves inside an epoch and stops, alone and agreed among processes."""

from __future__ import annotations

import logging
import signal
from types import SimpleNamespace

import jax

from training.devices import mesh
from training.run.stops import AGREE_EVERY_STEPS, Stops


class Checkpoints:
    """checkpoint_every due at the steps `due_at` (counted alike by every process); the clock never due."""

    def __init__(self, due_at=()):
        self.due_at, self.saved = set(due_at), []

    def save_due(self, step: int, clock: bool = True) -> bool:
        return step in self.due_at

    def save_position(self, train_state, totals, header):
        self.saved.append(header)
        return ["checkpoint-latest.params"], 0.002


def test_alone_a_save_is_due_where_checkpoint_every_says_or_a_stop_was_asked():
    stops = Stops(Checkpoints(due_at={4}), SimpleNamespace(k=2))
    assert [stops.due(step, calls) for calls, step in enumerate((2, 4, 6), 1)] == [False, True, False]
    assert stops.agreed_stop() is None
    stops.request_stop(signal.SIGTERM)
    assert stops.due(6, 3) and stops.agreed_stop() == signal.SIGTERM


def test_processes_agree_every_agree_every_steps_worth_of_calls_and_share_a_stop(monkeypatch):
    """Two processes: between agreements no collective is made (a signal seen here waits for the next one); at a
    save checkpoint_every's steps make due, or every AGREE_EVERY_STEPS steps' worth of calls, they agree, and the
    other process's stop becomes this one's."""
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    collectives = []

    def other_process_stopped(*values):  # the other process received SIGUSR1 and has no save due
        collectives.append(values)
        return (max(values[0], signal.SIGUSR1), *values[1:])

    monkeypatch.setattr(mesh, "max_over_processes", other_process_stopped)
    k = 4
    every = AGREE_EVERY_STEPS // k
    stops = Stops(Checkpoints(due_at={8}), SimpleNamespace(k=k))
    assert not stops.due(4, 1) and collectives == []
    assert stops.due(8, 2) and collectives == [(0, 1)]  # checkpoint_every's steps: agreed, and the stop learnt
    assert stops.signal == signal.SIGUSR1
    stops.signal = None
    assert not stops.due(12, 3) and len(collectives) == 1
    assert stops.due(4 * every, every) and collectives[-1] == (0, 0)
    assert stops.agreed_stop() == signal.SIGUSR1


def test_a_save_logs_where_it_is_and_returns_its_files(caplog):
    checkpoints = Checkpoints()
    stops = Stops(checkpoints, SimpleNamespace(k=1))
    with caplog.at_level(logging.INFO, logger="train"):
        names = stops.save({}, {}, {"epoch": 1, "step": 9, "position": 8}, 9)
    assert names == ["checkpoint-latest.params"] and checkpoints.saved == [{"epoch": 1, "step": 9, "position": 8}]
    assert "checkpoint at step 9 (8 of 9 into epoch 2); the loop paused 2 ms" in caplog.text
