"""Schedules against optax's schedules of the same meaning, at every step of a range that crosses each boundary."""

import json
import shutil

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


class TorchReduceLROnPlateau:
    """PyTorch's ReduceLROnPlateau.step as its documentation and source define it (threshold_mode "rel", eps 1e-8),
    for one learning rate."""

    def __init__(self, lr, mode, factor, patience, threshold, cooldown, min_lr):
        self.lr, self.mode, self.factor, self.patience = lr, mode, factor, patience
        self.threshold, self.cooldown, self.min_lr = threshold, cooldown, min_lr
        self.best = np.inf if mode == "min" else -np.inf
        self.num_bad_epochs, self.cooldown_counter = 0, 0

    def step(self, metric):
        if self.mode == "min":
            better = metric < self.best * (1 - self.threshold)
        else:
            better = metric > self.best * (self.threshold + 1)
        if better:
            self.best, self.num_bad_epochs = metric, 0
        else:
            self.num_bad_epochs += 1
        if self.cooldown_counter > 0:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0
        if self.num_bad_epochs > self.patience:
            new_lr = max(self.lr * self.factor, self.min_lr)
            if self.lr - new_lr > 1e-8:
                self.lr = new_lr
            self.cooldown_counter, self.num_bad_epochs = self.cooldown, 0


@pytest.mark.parametrize("mode", ["min", "max"])
@pytest.mark.parametrize("patience, cooldown, min_value", [(0, 0, 0.0), (2, 1, 0.0), (1, 3, 2e-3)])
def test_reduce_on_plateau_follows_pytorchs_algorithm(mode, patience, cooldown, min_value):
    from training import optimizers

    lr, factor, threshold = 0.1, 0.5, 1e-2
    schedule = schedules.reduce_on_plateau(lr, factor, patience, threshold, cooldown, min_value)
    reference = TorchReduceLROnPlateau(lr, mode, factor, patience, threshold, cooldown, min_value)
    state = optimizers.scale_by_plateau().init({})
    rng = np.random.default_rng(patience + cooldown)
    # a noisy metric that improves, stalls and sometimes improves by less than the threshold
    values = np.cumsum(rng.normal(0.0, 0.05, 60)) + 3.0
    values[::7] = values[::7] * (1 - 0.005)
    reductions = 0
    for value in values.astype(np.float32):
        value = float(value)
        state = optimizers.observe_plateau(state, schedule.plateau, value, mode == "max")
        reference.step(value)
        assert lr * float(state.scale) == pytest.approx(reference.lr, rel=1e-6)
        reductions += reference.lr < lr
    assert reductions, "the sequence must exercise a reduction"
    assert float(schedule(123)) == pytest.approx(lr)  # as a function of the step: the initial rate


def test_reduce_on_plateau_scales_every_update_by_its_state():
    from training import optimizers

    params = {"w": jnp.arange(3.0)}
    grads = {"w": jnp.asarray([1.0, -2.0, 0.5])}
    opt = optimizers.chain(optimizers.sgd(0.1), optimizers.scale_by_plateau())
    state = opt.init(params)
    state = optimizers.with_plateau_state(state, optimizers.plateau_state(state)._replace(scale=jnp.float32(0.25)))
    updates, _ = jax.jit(opt.update)(grads, state, params)
    np.testing.assert_allclose(updates["w"], -0.1 * 0.25 * np.asarray(grads["w"]), rtol=1e-6)


@pytest.mark.slow
def test_reduce_on_plateau_logs_the_applied_lr_and_resumes_exactly(tmp_path):
    from tests.conftest import make_idx_dataset
    from tests.end_to_end.test_long_runs import assert_same_state
    from tests.end_to_end.test_train import make_config, run
    from training.run import checkpoint

    data = tmp_path / "mnist"
    make_idx_dataset(data, n_train=200, n_test=40)
    # a threshold no epoch meets: every epoch after the first is bad, so with patience 0 each halves the rate
    plateau = {
        "name": "reduce_on_plateau",
        "args": {"init_value": 0.004, "factor": 0.5, "patience": 0, "threshold": 0.999},
    }
    config = make_config(
        tmp_path,
        data,
        optimizer={"name": "adam", "schedule": plateau},
        trainer__monitor="min val/loss",
        trainer__epochs=3,
    )
    assert run("train.py", "-c", config, "--run-id", "whole").returncode == 0
    whole = tmp_path / "saved/tiny/whole"
    rows = [json.loads(line) for line in (whole / "metrics.jsonl").read_text().splitlines()]
    assert [r["lr"] for r in rows] == pytest.approx([0.004, 0.004, 0.002])  # the rate each epoch's steps applied
    arrays, _ = checkpoint.read(whole / "checkpoint-latest.params")
    scale = [v for k, v in arrays.items() if k.endswith("scale") and k.startswith("opt_state")]
    assert [float(s) for s in scale] == [0.25]  # after epoch 3: the rate its successor would apply
    assert "reduce_on_plateau: val/loss has not improved" in (whole / "train.log").read_text()

    assert run("train.py", "-c", config, "--run-id", "cut", "--epochs", "2").returncode == 0
    cut = tmp_path / "saved/tiny/cut"
    resumed = run("train.py", "-r", cut / "checkpoint-latest.params", "--epochs", "3")
    assert resumed.returncode == 0, resumed.stderr
    assert_same_state(cut / "checkpoint-latest.params", whole / "checkpoint-latest.params")


def test_any_schedules_step_count_argument_takes_steps_epochs_or_all(monkeypatch):
    """A schedule of one's own: its argument annotated ``Steps`` takes every form, with nothing else to declare."""
    from model import registry
    from training.config.components import build_optimizer
    from training.config.file import ConfigError
    from training.config.schema import check_schedule

    def my_ramp(peak: float, ramp: schedules.Steps = 10):
        return lambda step: peak * jnp.minimum(step / ramp, 1.0)

    registry.entries("schedule")  # the built-in ones registered, then this one beside them for this test
    monkeypatch.setitem(registry._REGISTERED["schedule"], "my_ramp", registry.Entry(my_ramp))
    assert schedules.step_arguments(my_ramp) == ("ramp",)
    config = {
        "optimizer": {"name": "sgd", "schedule": {"name": "my_ramp", "args": {"peak": 1.0}}},
        "trainer": {"epochs": 3},
    }
    for given, steps in ((40, 40), ({"steps": 40}, 40), ({"epochs": 2}, 20), ({"epochs": 0.5}, 5), ("all", 30)):
        config["optimizer"]["schedule"]["args"]["ramp"] = given
        check_schedule(config["optimizer"]["schedule"], "config.json: optimizer.schedule")
        _, lr = build_optimizer(config, steps_per_epoch=10)
        assert float(lr(steps)) == 1.0 and float(lr(steps - 1)) < 1.0, given
    for bad, said in (
        ({"epoch": 2}, 'expected a number of steps, {"steps": N}, {"epochs": N} or "all", got {"epoch": 2}'),
        ("most", 'expected a number of steps, {"steps": N}, {"epochs": N} or "all", got "most"'),
        ({"steps": 2.5}, "ramp.steps: expected int"),
        ({"epochs": 0}, "ramp.epochs: must be > 0"),
        (-3, "ramp: must be >= 0"),
    ):
        config["optimizer"]["schedule"]["args"]["ramp"] = bad
        with pytest.raises(ConfigError) as error:
            check_schedule(config["optimizer"]["schedule"], "config.json: optimizer.schedule")
        assert said in str(error.value) and "\n" not in str(error.value)


def test_length_errors_speak_the_configs_units():
    from training.config.components import build_optimizer
    from training.config.file import ConfigError

    args = {"init_value": 0.0, "peak_value": 1e-3, "warmup_steps": {"epochs": 2}, "decay_steps": "all"}
    config = {
        "optimizer": {"name": "adam", "schedule": {"name": "warmup_cosine_decay", "args": args}},
        "trainer": {"epochs": 2},
    }
    for steps_per_epoch in (None, 50):  # before the data is read, then with its 50 steps an epoch
        with pytest.raises(ConfigError) as error:
            build_optimizer(config, steps_per_epoch)
        message = str(error.value)
        assert 'warmup_steps {"epochs": 2} (' in message and "the whole 2-epoch run" in message
        assert str(2**20) not in message and str(2**21) not in message


@pytest.mark.slow
def test_an_extended_run_keeps_its_schedules_length(tmp_path):
    """Resuming a finished run with more epochs: the schedule ("all" = its 2 epochs) has ended and its lr stays at
    the end value, rather than the decay starting over, stretched."""
    from tests.conftest import make_idx_dataset
    from tests.end_to_end.test_train import make_config, run

    data = tmp_path / "mnist"
    make_idx_dataset(data, n_train=200, n_test=40)
    cosine = {"name": "cosine_decay", "args": {"init_value": 0.004, "decay_steps": "all", "alpha": 0.1}}
    config = make_config(tmp_path, data, optimizer={"name": "adam", "schedule": cosine}, trainer__epochs=2)
    assert run("train.py", "-c", config, "--run-id", "r").returncode == 0
    folder = tmp_path / "saved/tiny/r"
    extended = run("train.py", "-r", folder / "checkpoint-latest.params", "--epochs", "4")
    assert extended.returncode == 0, extended.stderr
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2, 3, 4]
    assert [r["lr"] for r in rows[2:]] == pytest.approx([0.0004] * 2)  # the end value, once the 2 epochs are done
    log = (folder / "train.log").read_text()
    assert "the schedule keeps the length the run started with (optimizer.schedule.args.decay_steps" in log
    assert "--set optimizer.schedule.args.decay_steps=N" in log


@pytest.mark.slow
def test_an_extension_that_would_train_at_learning_rate_0_is_refused_in_one_line(tmp_path):
    """A finished run whose schedule decays to 0 over "all", extended with --epochs: its extra epochs would train
    nothing. Refused before anything is written, naming the key that stretches the schedule."""
    from tests.conftest import make_idx_dataset
    from tests.end_to_end.test_train import make_config, run, train_py_in_one_process

    data = tmp_path / "mnist"
    make_idx_dataset(data, n_train=200, n_test=40)
    cosine = {"name": "cosine_decay", "args": {"init_value": 0.004, "decay_steps": "all"}}  # to 0 at its end
    config = make_config(tmp_path, data, optimizer={"name": "adam", "schedule": cosine}, trainer__epochs=2)
    assert run("train.py", "-c", config, "--run-id", "r").returncode == 0
    folder = tmp_path / "saved/tiny/r"
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    copy = shutil.copytree(folder, tmp_path / "saved/tiny/copy")  # the stretched schedule resumes it
    stretched = ["--set", "optimizer.schedule.args.decay_steps=40"]  # 4 epochs of 10 steps: trains on
    extended, resumed = train_py_in_one_process(  # one process, a JAX start fewer
        ["-r", folder / "checkpoint-latest.params", "--epochs", "4"],
        ["-r", copy / "checkpoint-latest.params", "--epochs", "4", *stretched],
    )
    assert extended.returncode == 2 and len(extended.stderr.strip().splitlines()) == 1, extended.stderr
    assert "its 2 extra epoch(s) would train at learning rate 0" in extended.stderr
    assert "--set optimizer.schedule.args.decay_steps=N" in extended.stderr
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()} == before
    assert resumed.returncode == 0, resumed.stderr
