"""Optimizers against optax: 200 steps of random gradients on a small nested params tree, compared at every step."""
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from training import optimizers as opt
from training import schedules

STEPS = 200


def make_params(key):
    """A tree shaped like a model's: a conv kernel, matrices, and vectors (biases, a norm scale)."""
    k = jax.random.split(key, 5)
    return {
        "conv": {"weight": jax.random.normal(k[0], (3, 3, 2, 4)), "bias": jax.random.normal(k[1], (4,))},
        "blocks": {"1": {
            "norm": {"scale": 1.0 + 0.1 * jax.random.normal(k[2], (4,))},
            "dense": {"weight": jax.random.normal(k[3], (4, 3)), "bias": jax.random.normal(k[4], (3,))},
        }},
    }


PARAMS = make_params(jax.random.key(0))
# Leaves with ndim > 1, written out by hand: the "default" weight-decay mask.
DEFAULT_MASK = {"conv": {"weight": True, "bias": False},
                "blocks": {"1": {"norm": {"scale": False}, "dense": {"weight": True, "bias": False}}}}


def random_grads(step, params):
    """Fresh normal gradients each step, with a per-step scale spanning ~0.05x to 20x so norms vary widely."""
    key = jax.random.fold_in(jax.random.key(1), step)
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(key, len(leaves) + 1)
    scale = jnp.exp(1.5 * jax.random.normal(keys[-1], ()))
    return treedef.unflatten([scale * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)])


@partial(jax.jit, static_argnums=0)
def trajectory(optimizer, params):
    """The updates of every step (stacked along a leading axis), each optimizer following its own params."""

    def step(carry, t):
        p, s = carry
        u, s = optimizer.update(random_grads(t, p), s, p)
        return (jax.tree.map(jnp.add, p, u), s), u

    _, updates = jax.lax.scan(step, (params, optimizer.init(params)), jnp.arange(STEPS))
    return updates


def max_rel_diff(got, want):
    """The largest elementwise |got - want| / |want| over all steps and leaves (a tiny floor avoids 0/0)."""
    diffs = jax.tree.map(lambda a, b: np.max(np.abs(np.asarray(a) - b) / (np.abs(b) + 1e-30)), got, want)
    return max(jax.tree.leaves(diffs))


def assert_matches(ours, reference, params=PARAMS):
    got, want = trajectory(ours, params), trajectory(reference, params)
    assert max(float(np.abs(x).max()) for x in jax.tree.leaves(want)) > 0
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
    "rmsprop_momentum": (opt.rmsprop(1e-2, decay=0.95, eps=1e-6, momentum=0.9),
                         optax.rmsprop(1e-2, decay=0.95, eps=1e-6, momentum=0.9)),
    "rmsprop_centered": (opt.rmsprop(1e-2, centered=True, momentum=0.5),
                         optax.rmsprop(1e-2, centered=True, momentum=0.5)),
    "adagrad": (opt.adagrad(0.1), optax.adagrad(0.1)),
    "adagrad_args": (opt.adagrad(0.1, initial_accumulator_value=0.0, eps=1e-5),
                     optax.adagrad(0.1, initial_accumulator_value=0.0, eps=1e-5)),
    "lion": (opt.lion(1e-3), optax.lion(1e-3, weight_decay=0.0)),
    "lion_decay": (opt.lion(1e-3, b1=0.8, b2=0.95, weight_decay=0.5),
                   optax.lion(1e-3, b1=0.8, b2=0.95, weight_decay=0.5, mask=DEFAULT_MASK)),
    "clip_by_global_norm": (opt.clip_by_global_norm(3.0), optax.clip_by_global_norm(3.0)),
    "clip_by_value": (opt.clip_by_value(0.5), optax.clip(0.5)),
    "add_decayed_weights": (opt.add_decayed_weights(0.3), optax.add_decayed_weights(0.3, mask=DEFAULT_MASK)),
    "clip_adamw_chain": (opt.chain(opt.clip_by_global_norm(2.0), opt.adamw(1e-2, weight_decay=0.05)),
                         optax.chain(optax.clip_by_global_norm(2.0),
                                     optax.adamw(1e-2, weight_decay=0.05, mask=DEFAULT_MASK))),
    "clip_value_sgd_chain": (opt.chain(opt.clip_by_value(1.0), opt.sgd(0.05, momentum=0.9)),
                             optax.chain(optax.clip(1.0), optax.sgd(0.05, momentum=0.9))),
    # Hyperparameters driven by schedules, against optax driven by its own schedule of the same meaning.
    "adam_warmup_cosine": (opt.adam(schedules.warmup_cosine_decay(0.0, 1e-2, 20, 150, 1e-4)),
                           optax.adam(optax.warmup_cosine_decay_schedule(0.0, 1e-2, 20, 150, 1e-4))),
    "sgd_one_cycle": (opt.sgd(schedules.one_cycle(180, 0.1), momentum=0.9),
                      optax.sgd(optax.cosine_onecycle_schedule(180, 0.1), momentum=0.9)),
    "adamw_scheduled_decay": (
        opt.adamw(schedules.piecewise_constant(1e-2, {"50": 0.3, "120": 0.3}),
                  weight_decay=schedules.linear(0.2, 0.0, 150)),
        optax.adamw(optax.piecewise_constant_schedule(1e-2, {50: 0.3, 120: 0.3}),
                    weight_decay=optax.linear_schedule(0.2, 0.0, 150), mask=DEFAULT_MASK)),
    "sgd_scheduled_momentum": (opt.sgd(0.05, momentum=schedules.linear(0.5, 0.95, 100)),
                               optax.inject_hyperparams(optax.sgd)(0.05, momentum=optax.linear_schedule(0.5, 0.95,
                                                                                                        100))),
}


@pytest.mark.parametrize("name", CASES)
def test_matches_optax(name):
    assert_matches(*CASES[name])


def test_global_norm_clipping_both_branches_occur():
    # The comparison above only means something if some steps were clipped and some were not.
    norms = jax.vmap(lambda t: optax.tree.norm(random_grads(t, PARAMS)))(jnp.arange(STEPS))
    assert np.any(norms < 3.0) and np.any(norms > 3.0)


# Weight-decay masks.

def test_default_mask_selects_matrices_and_kernels():
    assert opt.decay_mask(PARAMS) == DEFAULT_MASK
    assert opt.decay_mask(PARAMS, None) == opt.decay_mask(PARAMS, "all") == jax.tree.map(lambda _: True, PARAMS)


def test_masked_leaves_get_no_decay():
    # With a large decay, every selected leaf differs from plain Adam and every masked one equals it exactly.
    decayed, plain = trajectory(opt.adamw(1e-2, weight_decay=1.0), PARAMS), trajectory(opt.adam(1e-2), PARAMS)
    for on, a, b in zip(jax.tree.leaves(DEFAULT_MASK), jax.tree.leaves(decayed), jax.tree.leaves(plain)):
        assert (not np.array_equal(a, b)) if on else np.array_equal(a, b)


def test_function_mask_sees_dotted_paths():
    seen = []

    def no_bias_no_norm(path, leaf):
        seen.append(path)
        return not (path.endswith("bias") or ".norm." in path)

    ours = opt.adamw(1e-2, weight_decay=0.1, mask=no_bias_no_norm)
    assert_matches(ours, optax.adamw(1e-2, weight_decay=0.1, mask=DEFAULT_MASK))
    assert set(seen) == {"conv.weight", "conv.bias", "blocks.1.norm.scale", "blocks.1.dense.weight",
                         "blocks.1.dense.bias"}


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
    adamw = opt.chain(opt.clip_by_global_norm(1.0), opt.adamw(schedules.cosine_decay(1e-3, 100)))
    state = adamw.init(PARAMS)
    update = jax.jit(adamw.update)
    for t in range(3):
        _, state = update(random_grads(t, PARAMS), state, PARAMS)
    leaves = jax.tree_util.tree_leaves_with_path(state)
    assert all(isinstance(x, jax.Array) for _, x in leaves)
    counts = {opt.key_path_str(p): int(x) for p, x in leaves if x.dtype == jnp.int32}
    # Adam, the weight decay and the learning rate each count their own steps.
    assert counts == {"1.0.count": 3, "1.1.count": 3, "1.2.count": 3}
    assert jax.tree.structure(state) == jax.tree.structure(adamw.init(PARAMS))


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
    kx, ky, kc, k1, k2 = jax.random.split(jax.random.key(42), 5)
    centers = 2.0 * jax.random.normal(kc, (3, 8))
    labels = jax.random.randint(ky, (96,), 0, 3)
    x = centers[labels] + jax.random.normal(kx, (96, 8))
    params = {"hidden": {"weight": jax.random.normal(k1, (8, 32)) / np.sqrt(8), "bias": jnp.zeros(32)},
              "out": {"weight": jax.random.normal(k2, (32, 3)) / np.sqrt(32), "bias": jnp.zeros(3)}}
    return x, labels, params


def mlp_loss(params, x, labels):
    h = jnp.tanh(x @ params["hidden"]["weight"] + params["hidden"]["bias"])
    logits = h @ params["out"]["weight"] + params["out"]["bias"]
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=1))


TRAIN_STEPS, TARGET_LOSS = 60, 0.1
TRAINERS = {
    "sgd": opt.sgd(0.5),
    "sgd_nesterov": opt.sgd(0.1, momentum=0.9, nesterov=True),
    "adam": opt.adam(0.03),
    "adamw": opt.adamw(0.03, weight_decay=1e-2),
    "rmsprop": opt.rmsprop(0.01),
    "rmsprop_centered_momentum": opt.rmsprop(0.005, centered=True, momentum=0.9),
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
