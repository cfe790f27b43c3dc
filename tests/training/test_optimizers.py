"""Optimizers against optax: 200 steps of random gradients on a small nested params tree, compared at every step."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from training import optimizers as opt
from training import schedules

STEPS = 200


# Test data comes from numpy's generator: no per-op compilations before the tests start.
RNG = np.random.default_rng(0)


def normal(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


# A tree shaped like a model's: a conv kernel, a matrix, and vectors (biases, a norm scale).
PARAMS = {
    "conv": {"weight": normal(3, 3, 2, 4), "bias": normal(4)},
    "blocks": {"1": {"norm": {"scale": 1 + 0.1 * normal(4)}, "dense": {"weight": normal(4, 3), "bias": normal(3)}}},
}
# Leaves with ndim > 1, written out by hand: the "default" weight-decay mask.
DEFAULT_MASK = {
    "conv": {"weight": True, "bias": False},
    "blocks": {"1": {"norm": {"scale": False}, "dense": {"weight": True, "bias": False}}},
}
# Normal gradients for every step, stacked along a leading axis; each step scaled by ~0.05x to 20x so that gradient
# norms vary widely (both branches of global-norm clipping occur).
_SCALES = np.exp(1.5 * normal(STEPS))
GRADS = jax.tree.map(lambda p: _SCALES.reshape((-1,) + (1,) * p.ndim) * normal(STEPS, *p.shape), PARAMS)


@functools.cache
def trajectory(optimizer):
    """The updates of every step on GRADS (stacked along a leading axis) and the final state, each optimizer
    following its own params from PARAMS; cached, as several tests compare against the same run."""
    return _trajectory(optimizer, PARAMS, GRADS)


@functools.partial(jax.jit, static_argnums=0)
def _trajectory(optimizer, params, grads):
    def step(carry, g):
        p, s = carry
        u, s = optimizer.update(g, s, p)
        return (jax.tree.map(jnp.add, p, u), s), u

    (_, state), updates = jax.lax.scan(step, (params, optimizer.init(params)), grads)
    return updates, state


def max_rel_diff(got, want):
    """The largest |got - want| relative to the largest |want| in the same leaf at the same step.

    Normwise per leaf rather than elementwise: with weight decay an update element can be a near-cancellation of
    the Adam step and the decay term, where float32 rounding alone gives large elementwise ratios.
    """

    def leaf(a, b):
        a, b = np.asarray(a).reshape(len(b), -1), np.asarray(b).reshape(len(b), -1)
        return np.max(np.abs(a - b).max(1) / np.abs(b).max(1))

    return max(jax.tree.leaves(jax.tree.map(leaf, got, want)))


def assert_matches(ours, reference):
    (got, _), (want, _) = trajectory(ours), trajectory(reference)
    assert all(np.all(np.abs(x).max(axis=tuple(range(1, x.ndim))) > 0) for x in jax.tree.leaves(want))
    err = max_rel_diff(got, want)
    assert err <= 1e-5, f"max relative difference {err:.3g}"


CASES = {
    "sgd": (opt.sgd(0.1), optax.sgd(0.1)),
    "sgd_momentum": (opt.sgd(0.1, momentum=0.9), optax.sgd(0.1, momentum=0.9)),
    "sgd_nesterov": (opt.sgd(0.1, momentum=0.9, nesterov=True), optax.sgd(0.1, momentum=0.9, nesterov=True)),
    "adam": (opt.adam(1e-2), optax.adam(1e-2)),
    "adam_args": (opt.adam(3e-3, b1=0.8, b2=0.99, eps=1e-3), optax.adam(3e-3, b1=0.8, b2=0.99, eps=1e-3)),
    "adamw": (opt.adamw(1e-2, weight_decay=0.1), optax.adamw(1e-2, weight_decay=0.1, mask=DEFAULT_MASK)),
    "adamw_all": (opt.adamw(1e-2, weight_decay=0.1, mask="all"), optax.adamw(1e-2, weight_decay=0.1)),
    "rmsprop": (opt.rmsprop(1e-2), optax.rmsprop(1e-2)),
    "rmsprop_momentum": (
        opt.rmsprop(1e-2, decay=0.95, eps=1e-6, momentum=0.9),
        optax.rmsprop(1e-2, decay=0.95, eps=1e-6, momentum=0.9),
    ),
    "rmsprop_centered": (
        opt.rmsprop(1e-2, centered=True, momentum=0.5),
        optax.rmsprop(1e-2, centered=True, momentum=0.5),
    ),
    "adagrad": (opt.adagrad(0.1), optax.adagrad(0.1)),
    "adagrad_args": (
        opt.adagrad(0.1, initial_accumulator_value=0.0, eps=1e-5),
        optax.adagrad(0.1, initial_accumulator_value=0.0, eps=1e-5),
    ),
    "lion": (opt.lion(1e-3), optax.lion(1e-3, weight_decay=0.0)),
    "lion_decay": (
        opt.lion(1e-3, b1=0.8, b2=0.95, weight_decay=0.5),
        optax.lion(1e-3, b1=0.8, b2=0.95, weight_decay=0.5, mask=DEFAULT_MASK),
    ),
    "clip_by_global_norm": (opt.clip_by_global_norm(3.0), optax.clip_by_global_norm(3.0)),
    "clip_by_value": (opt.clip_by_value(0.5), optax.clip(0.5)),
    "add_decayed_weights": (opt.add_decayed_weights(0.3), optax.add_decayed_weights(0.3, mask=DEFAULT_MASK)),
    "clip_adamw_chain": (
        opt.chain(opt.clip_by_global_norm(2.0), opt.adamw(1e-2, weight_decay=0.05)),
        optax.chain(optax.clip_by_global_norm(2.0), optax.adamw(1e-2, weight_decay=0.05, mask=DEFAULT_MASK)),
    ),
    "clip_value_sgd_chain": (
        opt.chain(opt.clip_by_value(1.0), opt.sgd(0.05, momentum=0.9)),
        optax.chain(optax.clip(1.0), optax.sgd(0.05, momentum=0.9)),
    ),
    # Hyperparameters driven by schedules, against optax driven by its own schedule of the same meaning.
    "adam_warmup_cosine": (
        opt.adam(schedules.warmup_cosine_decay(1e-4, 1e-2, 20, 150, 1e-4)),
        optax.adam(optax.warmup_cosine_decay_schedule(1e-4, 1e-2, 20, 150, 1e-4)),
    ),
    "sgd_one_cycle": (
        opt.sgd(schedules.one_cycle(180, 0.1), momentum=0.9),
        optax.sgd(optax.cosine_onecycle_schedule(180, 0.1), momentum=0.9),
    ),
    "adamw_scheduled_decay": (
        opt.adamw(
            schedules.piecewise_constant(1e-2, {"50": 0.3, "120": 0.3}), weight_decay=schedules.linear(0.2, 0.0, 150)
        ),
        optax.adamw(
            optax.piecewise_constant_schedule(1e-2, {50: 0.3, 120: 0.3}),
            weight_decay=optax.linear_schedule(0.2, 0.0, 150),
            mask=DEFAULT_MASK,
        ),
    ),
    # optax's trace takes no schedule; inject_hyperparams feeds it one, read at the same step count.
    "sgd_scheduled_momentum": (
        opt.sgd(0.05, momentum=schedules.linear(0.5, 0.95, 100)),
        optax.inject_hyperparams(optax.sgd)(0.05, momentum=optax.linear_schedule(0.5, 0.95, 100)),
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_matches_optax(name):
    assert_matches(*CASES[name])


def test_global_norm_clipping_both_branches_occur():
    # The comparison above only means something if some steps were clipped and some were not.
    norms = np.sqrt(sum(np.square(g).reshape(STEPS, -1).sum(1) for g in jax.tree.leaves(GRADS)))
    assert np.any(norms < 3.0) and np.any(norms > 3.0)


# Weight-decay masks.


def test_default_mask_selects_matrices_and_kernels():
    assert opt.decay_mask(PARAMS) == DEFAULT_MASK
    assert opt.decay_mask(PARAMS, None) == opt.decay_mask(PARAMS, "all") == jax.tree.map(lambda _: True, PARAMS)


def test_masked_leaves_get_no_decay():
    # Every selected leaf differs from plain Adam with the same learning rate; every masked one equals it exactly.
    (decayed, _), (plain, _) = trajectory(CASES["adamw"][0]), trajectory(CASES["adam"][0])
    for on, a, b in zip(jax.tree.leaves(DEFAULT_MASK), jax.tree.leaves(decayed), jax.tree.leaves(plain)):
        assert (not np.array_equal(a, b)) if on else np.array_equal(a, b)


def test_function_mask_sees_dotted_paths():
    seen = []

    def no_bias_no_norm(path, leaf):
        seen.append(path)
        return not (path.endswith("bias") or ".norm." in path)

    ours = opt.adamw(1e-2, weight_decay=0.1, mask=no_bias_no_norm)
    assert_matches(ours, CASES["adamw"][1])  # optax.adamw(1e-2, weight_decay=0.1, mask=DEFAULT_MASK)
    assert set(seen) == {
        "conv.weight",
        "conv.bias",
        "blocks.1.norm.scale",
        "blocks.1.dense.weight",
        "blocks.1.dense.bias",
    }


def test_pytree_prefix_mask():
    mask = {"conv": False, "blocks": True}
    assert_matches(opt.adamw(1e-2, weight_decay=0.1, mask=mask), optax.adamw(1e-2, weight_decay=0.1, mask=mask))


def test_bad_mask_and_missing_params_raise():
    with pytest.raises(ValueError, match="mask"):
        opt.adamw(1e-3, mask="biases")
    decay = opt.add_decayed_weights(0.1)
    with pytest.raises(ValueError, match="params"):
        decay.update(PARAMS, decay.init(PARAMS))


# State, dtypes, helpers.


def test_state_is_a_pytree_of_arrays_with_int32_counts():
    clip_adamw = CASES["clip_adamw_chain"][0]
    _, state = trajectory(clip_adamw)  # after STEPS jitted updates
    leaves = jax.tree_util.tree_leaves_with_path(state)
    assert all(isinstance(x, jax.Array) for _, x in leaves)
    assert jax.tree.structure(state) == jax.tree.structure(clip_adamw.init(PARAMS))
    # Adam, the weight decay and the learning rate each count their own steps.
    counts = {opt.key_path_str(p): int(x) for p, x in leaves if x.dtype == jnp.int32}
    assert counts == {"1.0.count": STEPS, "1.1.count": STEPS, "1.2.count": STEPS}


def test_step_count_saturates():
    sgd = opt.sgd(schedules.linear(1.0, 0.0, 10))
    state = (opt.CountState(jnp.array(jnp.iinfo(jnp.int32).max, jnp.int32)),)
    updates, state = sgd.update(PARAMS, state)
    assert int(state[0].count) == jnp.iinfo(jnp.int32).max
    # Past the end of the schedule the learning rate is 0, not the value of a wrapped negative step (1.0).
    assert all(float(jnp.abs(u).max()) == 0.0 for u in jax.tree.leaves(updates))


def test_apply_updates_keeps_dtypes():
    params = {"w": jnp.ones((2, 3), jnp.bfloat16), "b": jnp.ones((3,), jnp.float32)}
    updates = {"w": jnp.full((2, 3), 0.1, jnp.float32), "b": jnp.full((3,), 0.1, jnp.float32)}
    got, want = opt.apply_updates(params, updates), optax.apply_updates(params, updates)
    assert jax.tree.map(lambda x: x.dtype, got) == jax.tree.map(lambda x: x.dtype, params)
    jax.tree.map(np.testing.assert_array_equal, got, want)


def test_key_path_str():
    tree = {"blocks": [{"norm": {"scale": 1.0}}, {"norm": {"scale": 2.0}}], "adam": opt.RmsState(nu=3.0)}
    paths = [opt.key_path_str(p) for p, _ in jax.tree_util.tree_leaves_with_path(tree)]
    assert paths == ["adam.nu", "blocks.0.norm.scale", "blocks.1.norm.scale"]


# A small model trains: a two-layer MLP on a fixed three-class problem.


def make_problem():
    rng = np.random.default_rng(42)
    centers = 2 * rng.standard_normal((3, 8))
    labels = rng.integers(0, 3, 96)
    x = (centers[labels] + rng.standard_normal((96, 8))).astype(np.float32)
    params = {
        "hidden": {"weight": rng.standard_normal((8, 32)) / np.sqrt(8), "bias": np.zeros(32)},
        "out": {"weight": rng.standard_normal((32, 3)) / np.sqrt(32), "bias": np.zeros(3)},
    }
    return x, labels.astype(np.int32), jax.tree.map(lambda a: a.astype(np.float32), params)


def mlp_loss(params, x, labels):
    h = jnp.tanh(x @ params["hidden"]["weight"] + params["hidden"]["bias"])
    logits = h @ params["out"]["weight"] + params["out"]["bias"]
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=1))


TRAIN_STEPS, TARGET_LOSS = 60, 0.05
TRAINERS = {
    "sgd_nesterov": opt.sgd(0.1, momentum=0.9, nesterov=True),
    "adam": opt.adam(0.03),
    "adamw": opt.adamw(0.03, weight_decay=1e-2),
    "rmsprop": opt.rmsprop(0.01),
    "adagrad": opt.adagrad(0.3),
    "lion": opt.lion(0.01, weight_decay=0.1),
    "clip_adam_cosine": opt.chain(opt.clip_by_global_norm(1.0), opt.adam(schedules.cosine_decay(0.05, TRAIN_STEPS))),
}


@pytest.mark.parametrize("name", TRAINERS)
def test_small_model_trains(name):
    optimizer = TRAINERS[name]
    x, labels, params = make_problem()

    @jax.jit
    def train(params):
        def step(carry, _):
            p, s = carry
            loss, grads = jax.value_and_grad(mlp_loss)(p, x, labels)
            updates, s = optimizer.update(grads, s, p)
            return (opt.apply_updates(p, updates), s), loss

        (params, _), losses = jax.lax.scan(step, (params, optimizer.init(params)), None, length=TRAIN_STEPS)
        return losses[0], mlp_loss(params, x, labels)

    first, last = train(params)
    assert first > 0.5 and last < TARGET_LOSS, f"loss {float(first):.3f} -> {float(last):.3f} in {TRAIN_STEPS} steps"


FROZEN_CASES = {
    "sgd": ({"name": "sgd", "args": {"lr": 0.1, "momentum": 0.9}}, lambda: optax.sgd(0.1, momentum=0.9)),
    "adam": ({"name": "adam", "args": {"lr": 0.01}}, lambda: optax.adam(0.01)),
    "adamw": (
        {"name": "adamw", "args": {"lr": 0.01, "weight_decay": 0.5}},
        lambda: optax.adamw(0.01, weight_decay=0.5, mask=lambda p: jax.tree.map(lambda x: x.ndim > 1, p)),
    ),
}


@pytest.mark.parametrize("name", FROZEN_CASES)
def test_frozen_leaves_are_untouched_and_the_rest_trains_as_optax_would(name):
    """optimizer.frozen: the conv and norm leaves stay bit for bit (weight decay included), the optimizer keeps no
    state for them, and the other leaves follow optax's optimizer run on them alone."""
    from training.config.components import build_optimizer

    spec, reference = FROZEN_CASES[name]
    config = {"optimizer": {**spec, "frozen": ["params.conv", "params.blocks.1.norm"]}, "trainer": {"epochs": 1}}
    optimizer, _ = build_optimizer(config)
    params = jax.tree.map(lambda p: p.copy(), PARAMS)
    params["conv"]["bias"][0] = -0.0  # a negative zero stays one: no "+ 0" update either
    grads = jax.tree.map(lambda g: g[:20], GRADS)

    @jax.jit
    def run(params, grads):
        def step(carry, g):
            p, s = carry
            u, s = optimizer.update(g, s, p)
            return (opt.apply_updates(p, u), s), None

        return jax.lax.scan(step, (params, optimizer.init(params)), grads)[0]

    final, state = run(params, grads)
    frozen = {"conv": params["conv"], "norm": params["blocks"]["1"]["norm"]}
    for got, want in zip(
        jax.tree.leaves({"conv": final["conv"], "norm": final["blocks"]["1"]["norm"]}), jax.tree.leaves(frozen)
    ):
        assert np.asarray(got).tobytes() == np.asarray(want).tobytes()
    assert np.signbit(np.asarray(final["conv"]["bias"])[0])
    # no moments or traces for the frozen leaves: the state holds the dense layer's shapes and scalars only
    assert {np.shape(leaf) for leaf in jax.tree.leaves(state)} <= {(), (4, 3), (3,)}
    # the trained leaves: optax's optimizer over them alone
    ref, ref_params = reference(), {"dense": params["blocks"]["1"]["dense"]}
    ref_state = ref.init(ref_params)
    for i in range(20):
        g = {"dense": jax.tree.map(lambda x: x[i], GRADS["blocks"]["1"]["dense"])}
        u, ref_state = ref.update(g, ref_state, ref_params)
        ref_params = optax.apply_updates(ref_params, u)
    for got, want in zip(jax.tree.leaves(final["blocks"]["1"]["dense"]), jax.tree.leaves(ref_params["dense"])):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)


def test_frozen_prefixes_must_name_parameters():
    from training.config.components import build_optimizer
    from training.config.file import ConfigError
    from training.config.schema import check_optimizer

    config = {
        "optimizer": {"name": "adam", "args": {"lr": 0.1}, "frozen": ["params.conv.weigh"]},
        "trainer": {"epochs": 1},
    }
    optimizer, _ = build_optimizer(config)
    with pytest.raises(
        ValueError,
        match="optimizer.frozen.0: 'params.conv.weigh' matches no parameter; the model's: params.blocks, params.conv",
    ):
        optimizer.init(PARAMS)
    for bad, said in (
        (["conv"], 'frozen.0: expected a key path of the parameters such as "params.backbone"'),
        ("params.conv", "frozen: expected a list"),
    ):
        with pytest.raises(ConfigError, match=said):
            check_optimizer({"optimizer": {"name": "adam", "args": {"lr": 0.1}, "frozen": bad}}, "c.json")


def test_decay_mask_as_key_path_prefixes_in_json():
    """AdamW's mask from a config: a list of key-path prefixes, the leaves under them decayed (as optax's mask of the
    same leaves)."""
    from training.config.components import build_optimizer
    from training.config.schema import check_optimizer

    spec = {
        "name": "adamw",
        "args": {"lr": 0.01, "weight_decay": 0.3, "mask": ["params.conv", "params.blocks.1.dense.weight"]},
    }
    check_optimizer({"optimizer": spec}, "c.json")
    ours, _ = build_optimizer({"optimizer": spec, "trainer": {"epochs": 1}})
    mask = {
        "conv": {"weight": True, "bias": True},
        "blocks": {"1": {"norm": {"scale": False}, "dense": {"weight": True, "bias": False}}},
    }
    assert_matches(ours, optax.adamw(0.01, weight_decay=0.3, mask=mask))
    transform = {"name": "add_decayed_weights", "args": {"weight_decay": 0.1, "mask": ["params.conv.bias"]}}
    chained, _ = build_optimizer(
        {"optimizer": {"name": "sgd", "args": {"lr": 0.1}, "transforms": [transform]}, "trainer": {"epochs": 1}}
    )
    updates, _ = chained.update(jax.tree.map(jnp.zeros_like, PARAMS), chained.init(PARAMS), PARAMS)
    np.testing.assert_allclose(updates["conv"]["bias"], -0.1 * 0.1 * PARAMS["conv"]["bias"], rtol=1e-6)
    assert not np.asarray(updates["conv"]["weight"]).any()


def test_grad_norm_counts_only_the_trainable_leaves():
    from model import model as samples
    from training.config.components import build_optimizer
    from training.losses import cross_entropy
    from training.step import make_train_step

    model = samples.mlp(hidden=(8,))
    x = RNG.standard_normal((6, 4, 4, 1)).astype(np.float32)
    batch = {"input": x, "target": RNG.integers(0, 10, 6).astype(np.int32), "mask": np.ones(6, np.float32)}
    params, state = model.init(jax.random.key(0), x)
    config = {"optimizer": {"name": "adamw", "args": {"lr": 0.1}, "frozen": ["params.fc0"]}, "trainer": {"epochs": 1}}
    optimizer, _ = build_optimizer(config)
    ts = {"params": params, "state": state, "opt_state": optimizer.init(params), "step": 0, "rng": jax.random.key(1)}
    new, _, logs = jax.jit(make_train_step(model, cross_entropy, optimizer, []))(ts, batch)

    def loss(head):
        outputs, _ = model({**params, "head": head}, state, x, train=True, key=jax.random.fold_in(ts["rng"], 0))
        return cross_entropy(outputs, batch["target"]).mean()

    head_grads = jax.grad(loss)(params["head"])
    want = np.sqrt(sum(float(jnp.sum(g**2)) for g in jax.tree.leaves(head_grads)))
    assert float(logs["grad_norm"]) == pytest.approx(want, rel=1e-5)
    for got, kept in zip(jax.tree.leaves(new["params"]["fc0"]), jax.tree.leaves(params["fc0"])):
        assert np.asarray(got).tobytes() == np.asarray(kept).tobytes()
    assert not np.allclose(new["params"]["head"]["weight"], params["head"]["weight"])


def test_summary_counts_trainable_and_frozen_parameters():
    from model import model as samples
    from model.summary import summary
    from training.config.components import build_optimizer

    model = samples.mlp(hidden=(8,))
    x = jax.ShapeDtypeStruct((2, 4, 4, 1), jnp.float32)
    params, state = model.init(jax.random.key(0), x)
    config = {"optimizer": {"name": "sgd", "args": {"lr": 0.1}, "frozen": ["params.fc0"]}, "trainer": {"epochs": 1}}
    optimizer, _ = build_optimizer(config)
    text = summary(model, params, state, x, optimizer.trainable(params))
    assert "total parameters: 226 (0.00 MB); trainable 90, frozen 136" in text
