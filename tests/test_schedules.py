"""Schedules against optax's schedules of the same meaning, at every step of a range that crosses each boundary."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from training import schedules

# Every step up to 300 (past each boundary below), then far out, up to the largest int32 step.
STEPS = np.concatenate([np.arange(301), [1_000, 10**6, 2**31 - 1]]).astype(np.int32)

CASES = {
    "constant": (schedules.constant(0.3), optax.constant_schedule(0.3)),
    "piecewise_constant": (
        schedules.piecewise_constant(0.1, {"100": 0.5, 250: 0.1, "40": 2.0}),
        optax.piecewise_constant_schedule(0.1, {100: 0.5, 250: 0.1, 40: 2.0}),
    ),
    "step_decay": (schedules.step_decay(0.1, 30, gamma=0.5), optax.exponential_decay(0.1, 30, 0.5, staircase=True)),
    "exponential_decay": (
        schedules.exponential_decay(0.1, 50, 0.5, transition_begin=20),
        optax.exponential_decay(0.1, 50, 0.5, transition_begin=20),
    ),
    "exponential_staircase_end": (
        schedules.exponential_decay(0.1, 40, 0.3, staircase=True, end_value=2e-3),
        optax.exponential_decay(0.1, 40, 0.3, staircase=True, end_value=2e-3),
    ),
    "exponential_growth_end": (
        schedules.exponential_decay(1e-3, 25, 2.0, end_value=0.05),
        optax.exponential_decay(1e-3, 25, 2.0, end_value=0.05),
    ),
    "cosine_decay": (schedules.cosine_decay(0.1, 200), optax.cosine_decay_schedule(0.1, 200)),
    "cosine_decay_alpha": (schedules.cosine_decay(0.1, 150, alpha=0.1), optax.cosine_decay_schedule(0.1, 150, 0.1)),
    "warmup_cosine_decay": (
        schedules.warmup_cosine_decay(0.0, 0.1, 20, 200, end_value=1e-3),
        optax.warmup_cosine_decay_schedule(0.0, 0.1, 20, 200, end_value=1e-3),
    ),
    "warmup_cosine_no_warmup": (
        schedules.warmup_cosine_decay(0.05, 0.1, 0, 120),
        optax.warmup_cosine_decay_schedule(0.05, 0.1, 0, 120),
    ),
    "linear": (schedules.linear(0.1, 0.0, 100, transition_begin=30), optax.linear_schedule(0.1, 0.0, 100, 30)),
    "linear_up": (schedules.linear(1e-4, 0.2, 75), optax.linear_schedule(1e-4, 0.2, 75)),
    "one_cycle": (schedules.one_cycle(200, 0.1), optax.cosine_onecycle_schedule(200, 0.1)),
    "one_cycle_args": (
        schedules.one_cycle(150, 1.0, pct_start=0.25, div_factor=10.0, final_div_factor=100.0),
        optax.cosine_onecycle_schedule(150, 1.0, pct_start=0.25, div_factor=10.0, final_div_factor=100.0),
    ),
}


def evaluate(schedule, steps):
    """The schedule at each step, each evaluated with a traced scalar int32 step under jit."""
    return np.asarray(jax.jit(jax.vmap(lambda s: jnp.asarray(schedule(s), jnp.float32)))(jnp.asarray(steps)))


@pytest.mark.parametrize("name", CASES)
def test_matches_optax(name):
    ours, reference = CASES[name]
    got, want = evaluate(ours, STEPS), evaluate(reference, STEPS)
    scale = np.abs(want).max()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7 * scale)
    # The range must exercise the schedule: a schedule that ignored its step would fail the comparison above only if
    # the reference changes, which holds for all but the constant one.
    assert name == "constant" or np.ptp(want) > 0


@pytest.mark.parametrize("name", CASES)
def test_python_int_steps_match_traced(name):
    ours, _ = CASES[name]
    steps = [0, 1, 20, 30, 40, 100, 150, 200, 250, 300]
    eager = np.array([float(ours(s)) for s in steps], np.float32)
    traced = evaluate(ours, np.array(steps, np.int32))
    # Python-int steps compute in float64 where the traced ones use float32.
    np.testing.assert_allclose(eager, traced, rtol=1e-5, atol=1e-7 * np.abs(traced).max())


def test_step_decay_formula():
    steps = np.arange(200)
    want = 0.2 * 0.1 ** (steps // 45)
    np.testing.assert_allclose(evaluate(schedules.step_decay(0.2, 45), steps), want, rtol=1e-6)


def test_piecewise_constant_string_keys_sorted_numerically():
    # "100" sorts before "40" as strings; the scales must still apply in step order.
    s = schedules.piecewise_constant(1.0, {"100": 0.5, "40": 0.1})
    np.testing.assert_allclose(evaluate(s, np.array([39, 40, 99, 100])), [1.0, 0.1, 0.1, 0.05], rtol=1e-6)


def test_vector_of_steps():
    s = schedules.warmup_cosine_decay(0.0, 1.0, 10, 50)
    steps = jnp.arange(60)
    np.testing.assert_allclose(np.asarray(s(steps)), evaluate(s, np.arange(60)), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
    "make",
    [
        lambda: schedules.piecewise_constant(0.1, {10: -0.5}),
        lambda: schedules.piecewise_constant(0.1, {"ten": 0.5}),
        lambda: schedules.step_decay(0.1, 0),
        lambda: schedules.cosine_decay(0.1, 0),
        lambda: schedules.warmup_cosine_decay(0.0, 0.1, 100, 100),
        lambda: schedules.one_cycle(0, 0.1),
    ],
)
def test_bad_arguments_raise(make):
    with pytest.raises(ValueError):
        make()
