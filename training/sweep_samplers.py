"""Which values each trial of a sweep takes: the default sampler (the grid in order, draws from a generator per
trial, so a restarted or longer sweep repeats them exactly) and Optuna's samplers (`--sampler optuna:tpe`).
"""

from __future__ import annotations

import itertools
import json
import random

from training.sweep_space import Param
from training.sweeps import SweepError


class RandomSampler:
    """Trial i takes the grid's point i % size (in the order of the product) and draws the rest from its own
    generator, seeded by (seed, i): the same trial gets the same values in any run, restart or longer sweep."""

    def __init__(self, params: list[Param], seed: int):
        self.grid = [p for p in params if p.kind == "grid"]
        self.sampled = [p for p in params if p.kind != "grid"]
        self.points = list(itertools.product(*(p.values for p in self.grid)))
        self.seed = seed

    def params(self, trial: int) -> dict:
        rng = random.Random(f"{self.seed}:{trial}")
        point = self.points[trial % len(self.points)]
        return {**{p.key: v for p, v in zip(self.grid, point)}, **{p.key: p.draw(rng) for p in self.sampled}}

    def resume(self, recorded: int) -> None:
        pass

    def tell(self, trial: int, params: dict, status: str, value: float | None) -> None:
        pass


class OptunaSampler:
    """`--sampler optuna:tpe` (or another Optuna sampler): a grid's values become a categorical choice. Trials the
    ledger holds are told to the study before it is asked for more, so a restarted sweep keeps every recorded trial
    and asks Optuna only for the rest."""

    SAMPLERS = {
        "tpe": "TPESampler",
        "random": "RandomSampler",
        "cmaes": "CmaEsSampler",
        "qmc": "QMCSampler",
        "gp": "GPSampler",
    }

    def __init__(self, algorithm: str, params: list[Param], seed: int, mode: str):
        if algorithm not in self.SAMPLERS:
            raise SweepError(
                f"--sampler optuna:{algorithm}: expected one of {', '.join('optuna:' + a for a in self.SAMPLERS)}"
            )
        try:
            import optuna
        except ImportError:
            raise SweepError(
                "--sampler optuna:...: optuna is not installed (pip install optuna), or use the default sampler"
            ) from None
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.optuna, self.seed = optuna, seed
        self.make = getattr(optuna.samplers, self.SAMPLERS[algorithm])
        self.study = optuna.create_study(
            direction="maximize" if mode == "max" else "minimize", sampler=self.make(seed=seed)
        )
        d = optuna.distributions
        self.distributions = {
            p.key: (
                d.CategoricalDistribution([json.dumps(v) for v in p.values])
                if p.values
                else d.IntDistribution(int(p.low), int(p.high))
                if p.kind == "int"
                else d.FloatDistribution(p.low, p.high, log=p.kind == "loguniform")
            )
            for p in params
        }
        self.asked = {}

    def resume(self, recorded: int) -> None:
        """After a restart: a generator seeded anew, or the first draws would repeat those of the first run."""
        if recorded:
            self.study.sampler = self.make(seed=self.seed + recorded)

    def params(self, trial: int) -> dict:
        asked = self.study.ask(self.distributions)
        self.asked[trial] = asked
        return {
            k: json.loads(v)
            if isinstance(self.distributions[k], self.optuna.distributions.CategoricalDistribution)
            else v
            for k, v in asked.params.items()
        }

    def tell(self, trial: int, params: dict, status: str, value: float | None) -> None:
        state = self.optuna.trial.TrialState
        state = (
            state.COMPLETE
            if status == "done" and value is not None
            else state.PRUNED
            if status == "pruned"
            else state.FAIL
        )
        if trial in self.asked:
            self.study.tell(self.asked.pop(trial), value if state == state.COMPLETE else None, state=state)
            return
        encoded = {
            k: json.dumps(v)
            if isinstance(self.distributions[k], self.optuna.distributions.CategoricalDistribution)
            else v
            for k, v in params.items()
            if k in self.distributions
        }
        self.study.add_trial(
            self.optuna.trial.create_trial(
                params=encoded,
                distributions={k: self.distributions[k] for k in encoded},
                value=value if state == state.COMPLETE else None,
                state=state,
            )
        )
