"""Learning-rate (and other hyperparameter) schedules.

A schedule is a plain function ``step -> value``. Every factory here returns one that is jittable, accepts a Python
int or a traced integer array (a vector of steps too), and follows the argument meanings of the optax schedule of the
same name, so the two can be swapped and compared:

    lr = warmup_cosine_decay(0.0, peak_value=1e-3, warmup_steps=500, decay_steps=10_000)
    lr(0), lr(500), lr(jnp.arange(10_000))
"""

from __future__ import annotations

import json
import math
import typing
from collections.abc import Callable
from typing import NamedTuple, NewType

import jax.numpy as jnp

from model.checks import check_range
from model.registry import register

# What a config can name as a schedule.

Schedule = Callable[[int], jnp.ndarray]

# A schedule's argument that counts steps: annotated so, a config may give it as a number of steps, as
# {"steps": N}, in epochs ({"epochs": 2.5}) or as "all" (the run's length); the trainer turns each into steps.
Steps = NewType("Steps", int)


def step_arguments(fn: Callable) -> tuple[str, ...]:
    """The arguments of a schedule factory annotated as ``Steps``."""
    hints = typing.get_type_hints(fn)
    return tuple(name for name, hint in hints.items() if hint is Steps)


class StepCount(int):
    """A number of steps resolved from a config's ``{"epochs": N}`` or ``"all"``: an int that shows itself in the
    config's own words, so a schedule's error speaks the user's units (``{"epochs": 2} (the whole 2-epoch run)``),
    not in steps the user never wrote."""

    def __new__(cls, steps: int, given, steps_per_epoch: int | None, epochs: int):
        count = super().__new__(cls, steps)
        count.given, count.steps_per_epoch, count.epochs = given, steps_per_epoch, epochs
        return count

    def __str__(self) -> str:
        given = json.dumps(self.given)
        span = self.epochs if self.given == "all" else self.given["epochs"]
        whole = (
            f"the whole {self.epochs:g}-epoch run" if span == self.epochs else f"{span:g} of the run's {self.epochs}"
        )
        if span != self.epochs:
            whole += " epochs"
        steps = f"{int(self):,} steps, " if self.steps_per_epoch else ""
        return f"{given} ({steps}{whole})"

    __repr__ = __str__

    def __format__(self, spec: str) -> str:
        return str(self) if not spec else int(self).__format__(spec)


@register("schedule")
def constant(value: float) -> Schedule:
    """Always ``value``."""
    check_range(value, "value")

    def schedule(step):
        return jnp.full(jnp.shape(step), value, dtype=float)

    return schedule


@register("schedule")
def piecewise_constant(init_value: float, boundaries_and_scales: dict | None = None) -> Schedule:
    """``init_value`` multiplied by every ``scale`` whose boundary the step has reached (``step >= boundary``).

    Keys may be strings (``{"1000": 0.1}``), as JSON configs write them.
    """
    check_range(init_value, "init_value")
    if not isinstance(boundaries_and_scales, (dict, type(None))):
        raise ValueError(f"boundaries_and_scales: expected an object {{step: scale}}, got {boundaries_and_scales!r}")
    for key, scale in (boundaries_and_scales or {}).items():
        check_range(scale, f"boundaries_and_scales.{key}")
    items = sorted((_as_step(k, "boundaries_and_scales"), float(s)) for k, s in (boundaries_and_scales or {}).items())

    def schedule(step):
        value = jnp.full(jnp.shape(step), init_value, dtype=float)
        for boundary, scale in items:
            value = jnp.where(step < boundary, value, value * scale)
        return value

    return schedule


@register("schedule")
def step_decay(init_value: float, step_size: Steps, gamma: float = 0.1) -> Schedule:
    """``init_value * gamma ** (step // step_size)``: multiply by ``gamma`` every ``step_size`` steps."""
    check_range(init_value, "init_value")
    check_range(gamma, "gamma")
    if step_size <= 0:
        raise ValueError(f"step_decay: step_size must be positive, got {step_size}")
    return exponential_decay(init_value, step_size, gamma, staircase=True)


@register("schedule")
def exponential_decay(
    init_value: float,
    transition_steps: Steps,
    decay_rate: float,
    transition_begin: Steps = 0,
    staircase: bool = False,
    end_value: float | None = None,
) -> Schedule:
    """``init_value * decay_rate ** ((step - transition_begin) / transition_steps)``, constant before
    ``transition_begin``; ``staircase`` floors the exponent; ``end_value`` bounds the result.

    As in optax, a non-positive ``transition_steps`` or a zero ``decay_rate`` gives a constant schedule.
    """
    check_range(init_value, "init_value")
    check_range(decay_rate, "decay_rate")
    if end_value is not None:
        check_range(end_value, "end_value")
    if transition_steps <= 0 or decay_rate == 0:
        return constant(init_value)
    transition_begin = max(transition_begin, 0)

    def schedule(step):
        elapsed = step - transition_begin
        p = elapsed / transition_steps
        if staircase:
            p = jnp.floor(p)
        value = jnp.where(elapsed <= 0, init_value, init_value * jnp.power(decay_rate, p))
        if end_value is not None:
            # A decaying schedule stops at end_value from above, a growing one from below.
            value = jnp.maximum(value, end_value) if decay_rate < 1 else jnp.minimum(value, end_value)
        return value

    return schedule


@register("schedule")
def cosine_decay(init_value: float, decay_steps: Steps, alpha: float = 0.0) -> Schedule:
    """Half a cosine from ``init_value`` down to ``alpha * init_value`` over ``decay_steps``, then flat."""
    check_range(init_value, "init_value")
    check_range(alpha, "alpha")
    if decay_steps <= 0:
        raise ValueError(f"cosine_decay: decay_steps must be positive, got {decay_steps}")

    def schedule(step):
        # A float step keeps large step counts from overflowing int32 arithmetic.
        t = jnp.minimum(jnp.asarray(step, dtype=float), float(decay_steps)) / decay_steps
        return init_value * ((1 - alpha) * 0.5 * (1 + jnp.cos(math.pi * t)) + alpha)

    return schedule


@register("schedule")
def linear(init_value: float, end_value: float, transition_steps: Steps, transition_begin: Steps = 0) -> Schedule:
    """From ``init_value`` at ``transition_begin`` to ``end_value`` ``transition_steps`` later; flat outside.

    As in optax, a non-positive ``transition_steps`` gives a constant ``init_value``.
    """
    check_range(init_value, "init_value")
    check_range(end_value, "end_value")
    if transition_steps <= 0:
        return constant(init_value)
    transition_begin = max(transition_begin, 0)

    def schedule(step):
        done = jnp.clip(step - transition_begin, 0, transition_steps) / transition_steps
        return (init_value - end_value) * (1 - done) + end_value

    return schedule


@register("schedule")
def warmup_cosine_decay(
    init_value: float, peak_value: float, warmup_steps: Steps, decay_steps: Steps, end_value: float = 0.0
) -> Schedule:
    """Linear warm-up from ``init_value`` to ``peak_value`` over ``warmup_steps``, then cosine decay to
    ``end_value``; ``decay_steps`` counts the warm-up too (optax's convention)."""
    for name, value in (("init_value", init_value), ("peak_value", peak_value), ("end_value", end_value)):
        check_range(value, name)
    if decay_steps <= warmup_steps:
        raise ValueError(
            f"warmup_cosine_decay: decay_steps {decay_steps} must exceed warmup_steps {warmup_steps}, which it counts"
        )
    warmup = linear(init_value, peak_value, warmup_steps)
    decay = cosine_decay(peak_value, decay_steps - warmup_steps, alpha=end_value / peak_value if peak_value else 0.0)

    def schedule(step):
        return jnp.where(step < warmup_steps, warmup(step), decay(step - warmup_steps))

    return schedule


@register("schedule")
def one_cycle(
    transition_steps: Steps,
    peak_value: float,
    pct_start: float = 0.3,
    div_factor: float = 25.0,
    final_div_factor: float = 1e4,
) -> Schedule:
    """The one-cycle policy with cosine annealing (optax ``cosine_onecycle_schedule``): from
    ``peak_value / div_factor`` up to ``peak_value`` over the first ``pct_start`` of ``transition_steps``, then down
    to ``peak_value / (div_factor * final_div_factor)``, flat afterwards."""
    check_range(peak_value, "peak_value")
    check_range(pct_start, "pct_start", 0, 1)
    check_range(div_factor, "div_factor", open_low=True)
    check_range(final_div_factor, "final_div_factor", open_low=True)
    if transition_steps <= 0:
        raise ValueError(f"one_cycle: transition_steps must be positive, got {transition_steps}")
    start = peak_value / div_factor
    end = start / final_div_factor
    rise = int(pct_start * transition_steps)

    def cosine(a, b, fraction):
        return b + (a - b) / 2 * (jnp.cos(math.pi * fraction) + 1)

    def schedule(step):
        up = cosine(start, peak_value, step / max(rise, 1))
        down = cosine(peak_value, end, (step - rise) / max(transition_steps - rise, 1))
        return jnp.where(step < rise, up, jnp.where(step < transition_steps, down, end))

    return schedule


class Plateau(NamedTuple):
    """What ``reduce_on_plateau`` does at the end of an epoch (``training/optimizers.py``: ``observe_plateau``)."""

    init_value: float
    factor: float
    patience: int
    threshold: float
    cooldown: int
    min_value: float


@register("schedule")
def reduce_on_plateau(
    init_value: float,
    factor: float = 0.1,
    patience: int = 10,
    threshold: float = 1e-4,
    cooldown: int = 0,
    min_value: float = 0.0,
) -> Schedule:
    """``init_value``, multiplied by ``factor`` once the run's monitored metric (``trainer.monitor``) has not
    improved by a relative ``threshold`` for more than ``patience`` epochs; after a reduction, ``cooldown`` epochs
    count no bad epoch; never below ``min_value``. PyTorch's ``ReduceLROnPlateau`` (its "rel" threshold mode).

    As a function of the step it is ``init_value``: the reduction is a factor that the optimizer keeps in its state
    (``scale_by_plateau``), so a checkpoint holds it and a resumed run continues it; the trainer updates it from the
    monitored value at each epoch's end and logs the rate applied. Only as ``optimizer.schedule``.
    """
    check_range(init_value, "init_value", open_low=True)
    check_range(factor, "factor", 0, 1, open_low=True, open_high=True)
    check_range(threshold, "threshold")
    check_range(min_value, "min_value")
    for name, value in (("patience", patience), ("cooldown", cooldown)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name}: expected an integer >= 0, got {value!r}")
    schedule = constant(init_value)
    schedule.plateau = Plateau(float(init_value), float(factor), patience, float(threshold), cooldown, float(min_value))
    return schedule


def _as_step(key, where: str) -> int:
    try:
        return int(key)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: boundary {key!r} is not an integer step") from None
