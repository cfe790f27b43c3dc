"""Optimizers as ``(init, update)`` pairs over pytrees, composed by chaining, in the manner of optax.

    opt = chain(clip_by_global_norm(1.0), adamw(schedules.cosine_decay(1e-3, 10_000)))
    state = opt.init(params)
    updates, state = opt.update(grads, state, params)
    params = apply_updates(params, updates)

Each building block transforms the gradient tree it is given; the last one of an optimizer scales by minus the
learning rate, so ``updates`` are added to the params. States are NamedTuples of arrays with int32 step counts, so
they jit, and checkpoint by key path like params. Every learning rate, weight decay and momentum may be a float or a
schedule ``step -> value`` (see ``training/schedules.py``); a block that takes one keeps its own step count.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, NewType

import jax
import jax.numpy as jnp

from model.checks import check_range
from model.modules.module import key_path_str
from model.registry import register

# What a config can name: the functions registered below (`@register("optimizer")`, `@register("transforms")`).
# The building blocks (trace, scale_by_adam, chain, ...) are for writing optimizers here, not for naming in a config:
# alone they would step along the raw gradient.

Schedule = Callable[[jax.Array], jax.Array]
Hyper = float | Schedule  # a hyperparameter: a constant or a schedule
# An argument that is a pytree of bools over the params (a decay mask): a config gives it as a list of key-path
# prefixes, ["params.encoder", "params.head.weight"], True on the leaves under them (prefix_mask).
LeafMask = NewType("LeafMask", object)


def check_hyper(value: Hyper, name: str, low: float = 0.0, high: float = math.inf, **open_ends: bool) -> None:
    """A hyperparameter given as a number must lie in its range: an Adam b1 of 1.5 or a negative weight decay
    trains without a word otherwise. A schedule is checked by its own factory."""
    if not callable(value):
        check_range(value, name, low, high, **open_ends)


class Optimizer(NamedTuple):
    init: Callable[[Any], Any]  # params -> state
    update: Callable[..., tuple[Any, Any]]  # (grads, state, params=None) -> (updates, state)
    # params -> a tree of Python bools, False on the frozen leaves (``freeze``); None: every leaf trains
    trainable: Callable[[Any], Any] | None = None
    # ``partition``'s: each group's optimizer over the whole tree, its state the partition's state[name], so a step
    # of its own may update one group alone
    groups: dict[str, Optimizer] | None = None


class EmptyState(NamedTuple):
    pass


class CountState(NamedTuple):
    count: jax.Array


class TraceState(NamedTuple):
    count: jax.Array
    trace: Any


class AdamState(NamedTuple):
    count: jax.Array
    mu: Any
    nu: Any


class RmsState(NamedTuple):
    nu: Any


class StddevState(NamedTuple):
    mu: Any
    nu: Any


class RssState(NamedTuple):
    sum_of_squares: Any


class LionState(NamedTuple):
    mu: Any


class PlateauState(NamedTuple):
    scale: jax.Array  # float32: the factor the updates are multiplied by, 1 until the first reduction
    best: jax.Array  # float32: the best monitored value so far, negated for a "max" monitor (lower is better)
    bad_epochs: jax.Array  # int32
    cooldown: jax.Array  # int32: epochs left in which bad epochs are not counted


def apply_updates(params, updates):
    """``params + updates``, each leaf keeping its param's dtype; a None update (a frozen leaf) leaves its param
    as it is, bit for bit."""

    def apply(u, p):
        return p if u is None else jnp.asarray(p + u).astype(jnp.asarray(p).dtype)

    return jax.tree.map(apply, updates, params, is_leaf=lambda u: u is None)


def chain(*optimizers: Optimizer) -> Optimizer:
    """Applies the optimizers one after the other; the state is the tuple of their states."""

    def init(params):
        return tuple(opt.init(params) for opt in optimizers)

    def update(grads, state, params=None):
        new_state = []
        for opt, s in zip(optimizers, state):
            grads, s = opt.update(grads, s, params)
            new_state.append(s)
        return grads, tuple(new_state)

    return Optimizer(init, update)


# Gradient transforms.


def scale_by_learning_rate(learning_rate: Hyper) -> Optimizer:
    """Multiplies by ``-learning_rate`` (descent); a schedule is read at this block's own step count."""
    check_hyper(learning_rate, "lr")

    def update(grads, state, params=None):
        lr = _value_at(learning_rate, state.count)
        return jax.tree.map(lambda g: jnp.asarray(-lr, g.dtype) * g, grads), CountState(_increment(state.count))

    return Optimizer(_count_init, update)


def trace(momentum: Hyper, nesterov: bool = False) -> Optimizer:
    """Heavy-ball momentum ``t = g + momentum * t`` (optax ``trace``); Nesterov returns ``g + momentum * t``."""
    check_hyper(momentum, "momentum", 0, 1, open_high=True)

    def init(params):
        return TraceState(jnp.zeros([], jnp.int32), jax.tree.map(jnp.zeros_like, params))

    def update(grads, state, params=None):
        m = _value_at(momentum, state.count)
        step = lambda g, t: g + jnp.asarray(m, t.dtype) * t
        new_trace = jax.tree.map(step, grads, state.trace)
        updates = jax.tree.map(step, grads, new_trace) if nesterov else new_trace
        return updates, TraceState(_increment(state.count), new_trace)

    return Optimizer(init, update)


def scale_by_adam(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> Optimizer:
    """Adam's bias-corrected ``m / (sqrt(v) + eps)``."""
    check_hyper(b1, "b1", 0, 1, open_high=True)
    check_hyper(b2, "b2", 0, 1, open_high=True)
    check_hyper(eps, "eps", open_low=True)

    def init(params):
        zeros = lambda: jax.tree.map(jnp.zeros_like, params)
        return AdamState(jnp.zeros([], jnp.int32), zeros(), zeros())

    def update(grads, state, params=None):
        mu = jax.tree.map(lambda g, m: (1 - b1) * g + b1 * m, grads, state.mu)
        nu = jax.tree.map(lambda g, v: (1 - b2) * g * g + b2 * v, grads, state.nu)
        count = _increment(state.count)
        c1, c2 = 1 - b1**count, 1 - b2**count
        updates = jax.tree.map(lambda m, v: (m / c1.astype(m.dtype)) / (jnp.sqrt(v / c2.astype(v.dtype)) + eps), mu, nu)
        return updates, AdamState(count, mu, nu)

    return Optimizer(init, update)


def scale_by_rms(decay: float = 0.9, eps: float = 1e-8) -> Optimizer:
    """RMSProp's ``g / sqrt(v + eps)`` with ``v`` the running mean of ``g**2`` (eps inside the root, as optax)."""
    check_hyper(decay, "decay", 0, 1, open_high=True)
    check_hyper(eps, "eps", open_low=True)

    def init(params):
        return RmsState(jax.tree.map(jnp.zeros_like, params))

    def update(grads, state, params=None):
        nu = jax.tree.map(lambda g, v: (1 - decay) * g * g + decay * v, grads, state.nu)
        return jax.tree.map(lambda g, v: g * jax.lax.rsqrt(v + eps), grads, nu), RmsState(nu)

    return Optimizer(init, update)


def scale_by_stddev(decay: float = 0.9, eps: float = 1e-8) -> Optimizer:
    """Centered RMSProp: divides by the running standard deviation, ``sqrt(E[g**2] - E[g]**2 + eps)``."""
    check_hyper(decay, "decay", 0, 1, open_high=True)
    check_hyper(eps, "eps", open_low=True)

    def init(params):
        zeros = lambda: jax.tree.map(jnp.zeros_like, params)
        return StddevState(zeros(), zeros())

    def update(grads, state, params=None):
        mu = jax.tree.map(lambda g, m: (1 - decay) * g + decay * m, grads, state.mu)
        nu = jax.tree.map(lambda g, v: (1 - decay) * g * g + decay * v, grads, state.nu)
        updates = jax.tree.map(lambda g, m, v: g * jax.lax.rsqrt(v - m * m + eps), grads, mu, nu)
        return updates, StddevState(mu, nu)

    return Optimizer(init, update)


def scale_by_rss(initial_accumulator_value: float = 0.1, eps: float = 1e-7) -> Optimizer:
    """Adagrad's ``g / sqrt(sum of all g**2 so far + eps)``."""
    check_hyper(initial_accumulator_value, "initial_accumulator_value")
    check_hyper(eps, "eps", open_low=True)

    def init(params):
        return RssState(jax.tree.map(lambda p: jnp.full_like(p, initial_accumulator_value), params))

    def update(grads, state, params=None):
        sums = jax.tree.map(lambda g, s: g * g + s, grads, state.sum_of_squares)
        # A zero accumulator (zero initial value, zero gradients so far) means no step rather than g / sqrt(eps).
        updates = jax.tree.map(lambda g, s: g * jnp.where(s > 0, jax.lax.rsqrt(s + eps), 0.0), grads, sums)
        return updates, RssState(sums)

    return Optimizer(init, update)


def scale_by_lion(b1: float = 0.9, b2: float = 0.99) -> Optimizer:
    """Lion's ``sign(b1 * m + (1 - b1) * g)``, then ``m`` moves towards ``g`` at rate ``1 - b2``."""
    check_hyper(b1, "b1", 0, 1, open_high=True)
    check_hyper(b2, "b2", 0, 1, open_high=True)

    def init(params):
        return LionState(jax.tree.map(jnp.zeros_like, params))

    def update(grads, state, params=None):
        updates = jax.tree.map(lambda g, m: jnp.sign((1 - b1) * g + b1 * m), grads, state.mu)
        mu = jax.tree.map(lambda g, m: (1 - b2) * g + b2 * m, grads, state.mu)
        return updates, LionState(mu)

    return Optimizer(init, update)


@register("transforms")
def add_decayed_weights(weight_decay: Hyper, mask: LeafMask = "default") -> Optimizer:
    """Adds ``weight_decay * params`` to the leaves the mask selects (decoupled weight decay when it is followed by
    ``scale_by_learning_rate``, as in AdamW). ``mask`` is one of:

    - ``"default"``: leaves with ``ndim > 1`` (weights and kernels; not biases, norm scales or other vectors);
    - ``None`` or ``"all"``: every leaf;
    - a function ``(path, leaf) -> bool``, ``path`` the dotted key path such as ``"blocks.1.norm.scale"``;
    - a pytree of bools shaped like the params (or a prefix of them);
    - in a config, a list of key-path prefixes (``["params.encoder"]``): the leaves under them (``prefix_mask``).
    """
    check_hyper(weight_decay, "weight_decay")
    if (isinstance(mask, str) and mask not in ("default", "all")) or not (
        mask is None or isinstance(mask, str) or callable(mask) or _bool_tree(mask)
    ):
        raise ValueError(
            f'add_decayed_weights: mask must be "default", "all", None, a function or a pytree of bools, got {mask!r}'
        )

    def update(grads, state, params=None):
        new_state = CountState(_increment(state.count))
        if not callable(weight_decay) and weight_decay == 0:
            return grads, new_state
        if params is None:
            raise ValueError("add_decayed_weights needs the params: call update(grads, state, params)")
        wd = _value_at(weight_decay, state.count)
        selected = decay_mask(params, mask)
        updates = jax.tree.map(lambda g, p, on: g + jnp.asarray(wd, g.dtype) * p if on else g, grads, params, selected)
        return updates, new_state

    return Optimizer(_count_init, update)


@register("transforms")
def clip_by_global_norm(max_norm: float) -> Optimizer:
    """Rescales the whole tree to global L2 norm ``max_norm`` when its norm exceeds that."""
    check_hyper(max_norm, "max_norm", open_low=True)

    def update(grads, state, params=None):
        norm = global_norm(grads)
        clip = lambda g: jnp.where(norm < max_norm, g, g / norm.astype(g.dtype) * max_norm)
        return jax.tree.map(clip, grads), state

    return Optimizer(_empty_init, update)


@register("transforms")
def clip_by_value(max_delta: float) -> Optimizer:
    """Clips every element to ``[-max_delta, max_delta]``."""
    check_hyper(max_delta, "max_delta", open_low=True)

    def update(grads, state, params=None):
        return jax.tree.map(lambda g: jnp.clip(g, -max_delta, max_delta), grads), state

    return Optimizer(_empty_init, update)


def scale_by_plateau() -> Optimizer:
    """Multiplies the updates by the ``scale`` in its state: the reduce-on-plateau factor of the learning rate, which
    the trainer changes between epochs (``observe_plateau``); chained after the optimizer, so it scales the weight
    decay too, as a lower learning rate does."""

    def init(params):
        return PlateauState(
            jnp.ones([], jnp.float32), jnp.full([], jnp.inf, jnp.float32), *[jnp.zeros([], jnp.int32)] * 2
        )

    def update(grads, state, params=None):
        return jax.tree.map(lambda g: g * state.scale.astype(g.dtype), grads), state

    return Optimizer(init, update)


def plateau_state(opt_state) -> PlateauState | None:
    """The ``scale_by_plateau`` state inside an optimizer's state, if it has one."""
    found = [s for s in jax.tree.leaves(opt_state, is_leaf=_is_plateau) if _is_plateau(s)]
    return found[0] if found else None


def with_plateau_state(opt_state, new: PlateauState):
    return jax.tree.map(lambda s: new if _is_plateau(s) else s, opt_state, is_leaf=_is_plateau)


def observe_plateau(state: PlateauState, plateau, value: float, higher_is_better: bool) -> PlateauState:
    """The state after an epoch whose monitored metric was ``value`` (host numbers, at an epoch's end): PyTorch's
    ``ReduceLROnPlateau.step`` with ``threshold_mode="rel"``; ``plateau`` is the schedule's ``Plateau``."""
    import numpy as np

    scale, bad, cooldown = float(state.scale), int(state.bad_epochs), int(state.cooldown)
    best = -float(state.best) if higher_is_better else float(state.best)  # as the monitor reports it
    if higher_is_better:
        better = value > best * (1 + plateau.threshold)
    else:
        better = value < best * (1 - plateau.threshold)
    if better:
        best, bad = value, 0
    else:
        bad += 1
    if cooldown > 0:
        cooldown, bad = cooldown - 1, 0
    if bad > plateau.patience:
        floor = plateau.min_value / plateau.init_value
        reduced = max(scale * plateau.factor, floor)
        if plateau.init_value * (scale - reduced) > 1e-8:  # PyTorch's eps: a change below it is none
            scale = reduced
        cooldown, bad = plateau.cooldown, 0

    def put(value, like):
        return jax.device_put(np.asarray(value, like.dtype), like.sharding)

    stored = -best if higher_is_better else best
    return PlateauState(
        put(scale, state.scale), put(stored, state.best), put(bad, state.bad_epochs), put(cooldown, state.cooldown)
    )


def _is_plateau(node) -> bool:
    return isinstance(node, PlateauState)


def prefix_mask(prefixes: Sequence[str]) -> Callable[[str, Any], bool]:
    """A mask function ``(path, leaf) -> bool``: True on the leaves at or under one of the key-path prefixes, written
    as checkpoints name the parameters (``params.encoder``; ``params.encoder`` does not cover ``params.encoder2``)."""
    prefixes = tuple(prefixes)

    def mask(path: str, leaf=None) -> bool:
        full = f"params.{path}"
        return any(full == p or full.startswith(p + ".") for p in prefixes)

    return mask


def freeze(optimizer: Optimizer, prefixes: Sequence[str]) -> Optimizer:
    """``optimizer`` over the leaves outside the key-path prefixes (``params.backbone``, as checkpoints name them);
    the leaves under them are frozen: no update reaches them (weight decay included) and the optimizer keeps no
    state for them (no Adam moments). A prefix that matches no parameter is an error. A partition's groups are
    frozen alike, so each still updates alone."""
    frozen = prefix_mask(prefixes)

    def trainable(params):
        _check_prefixes(params, prefixes, "optimizer.frozen")
        keep = jax.tree_util.tree_map_with_path(lambda path, p: not frozen(key_path_str(path)), params)
        inner = optimizer.trainable  # a group's own leaves
        return keep if inner is None else jax.tree.map(lambda a, b: a and b, keep, inner(params))

    groups = optimizer.groups and {name: freeze(group, prefixes) for name, group in optimizer.groups.items()}
    return _only(optimizer, trainable, groups)


def partition(groups: dict[str, tuple[Sequence[str], Optimizer]]) -> Optimizer:
    """Parameter groups: ``{name: (key-path prefixes, optimizer)}``, each optimizer over the leaves under its
    prefixes (as ``optax.multi_transform``). The state is ``{name: that group's state}``; ``.groups[name]`` updates
    that group alone (None on every other leaf), with ``state[name]``. Every leaf the partition is given (a frozen
    one is not) must lie in exactly one group, and every prefix match a leaf: a ValueError at init otherwise."""
    members = {
        name: _only(optimizer, _under(prefixes, f"optimizer.groups.{name}.params"))
        for name, (prefixes, optimizer) in groups.items()
    }

    def init(params):
        for name, (prefixes, _) in groups.items():  # a mistyped prefix is named before the leaves it misses
            _check_prefixes(params, prefixes, f"optimizer.groups.{name}.params")
        for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]:
            path = key_path_str(path)
            owners = [name for name, (prefixes, _) in groups.items() if prefix_mask(prefixes)(path)]
            if len(owners) != 1:
                where = f"groups {' and '.join(owners)}" if owners else f"no group (groups: {', '.join(groups)})"
                raise ValueError(
                    f"optimizer.groups: params.{path} lies in {where}; each trained parameter lies in exactly one"
                )
        return {name: member.init(params) for name, member in members.items()}

    def update(grads, state, params=None):
        updates, new_state = None, {}
        for name, member in members.items():
            each, new_state[name] = member.update(grads, state[name], params)
            # each group's updates are None outside it: the groups' trees merged leaf by leaf
            merge = lambda a, b: b if a is None else a
            updates = each if updates is None else jax.tree.map(merge, updates, each, is_leaf=lambda u: u is None)
        return updates, new_state

    return Optimizer(init, update, None, members)


def _under(prefixes: Sequence[str], place: str) -> Callable[[Any], Any]:
    """A ``trainable`` function: True on the leaves under the prefixes (a group's), which must each match one."""
    inside = prefix_mask(prefixes)

    def trainable(params):
        _check_prefixes(params, prefixes, place)
        return jax.tree_util.tree_map_with_path(lambda path, p: inside(key_path_str(path)), params)

    return trainable


def _only(optimizer: Optimizer, trainable: Callable[[Any], Any], groups=None) -> Optimizer:
    """``optimizer`` given only the leaves ``trainable`` marks (None elsewhere: no update, no state)."""

    def init(params):
        return optimizer.init(only_trainable(params, trainable(params)))

    def update(grads, state, params=None):
        keep = trainable(grads)
        params = None if params is None else only_trainable(params, keep)
        return optimizer.update(only_trainable(grads, keep), state, params)

    return Optimizer(init, update, trainable, groups)


def _check_prefixes(params, prefixes: Sequence[str], place: str) -> None:
    paths = [key_path_str(path) for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
    for i, prefix in enumerate(prefixes):
        if not any(prefix_mask([prefix])(path) for path in paths):
            names = sorted({"params." + path.split(".")[0] for path in paths})
            raise ValueError(f"{place}.{i}: {prefix!r} matches no parameter; the model's: {', '.join(names)}")


def only_trainable(tree, trainable):
    """``tree`` with None in place of its frozen leaves: a tree.map over it skips them, and stores nothing."""
    return jax.tree.map(lambda x, on: x if on else None, tree, trainable)


# The optimizers a config names; each is a chain of the blocks above, in optax's order.


@register("optimizer")
def sgd(lr: Hyper, momentum: Hyper = 0.0, nesterov: bool = False) -> Optimizer:
    """Stochastic gradient descent, with (Nesterov) momentum when ``momentum`` is non-zero."""
    return chain(*_present(momentum, lambda: trace(momentum, nesterov)), scale_by_learning_rate(lr))


@register("optimizer")
def adam(lr: Hyper, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> Optimizer:
    return chain(scale_by_adam(b1, b2, eps), scale_by_learning_rate(lr))


@register("optimizer")
def adamw(
    lr: Hyper,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: Hyper = 1e-4,
    mask: LeafMask = "default",
) -> Optimizer:
    """Adam with decoupled weight decay; the decay is multiplied by the learning rate (optax and PyTorch)."""
    return chain(scale_by_adam(b1, b2, eps), add_decayed_weights(weight_decay, mask), scale_by_learning_rate(lr))


@register("optimizer")
def rmsprop(
    lr: Hyper, decay: float = 0.9, eps: float = 1e-8, momentum: Hyper = 0.0, centered: bool = False
) -> Optimizer:
    """RMSProp as optax writes it: eps inside the square root, momentum applied after the learning rate."""
    scale = scale_by_stddev(decay, eps) if centered else scale_by_rms(decay, eps)
    return chain(scale, scale_by_learning_rate(lr), *_present(momentum, lambda: trace(momentum)))


@register("optimizer")
def adagrad(lr: Hyper, initial_accumulator_value: float = 0.1, eps: float = 1e-7) -> Optimizer:
    return chain(scale_by_rss(initial_accumulator_value, eps), scale_by_learning_rate(lr))


@register("optimizer")
def lion(
    lr: Hyper, b1: float = 0.9, b2: float = 0.99, weight_decay: Hyper = 0.0, mask: LeafMask = "default"
) -> Optimizer:
    """Lion (Chen et al., 2023); its updates are signs, so it wants a learning rate 3-10x smaller than Adam's."""
    return chain(scale_by_lion(b1, b2), add_decayed_weights(weight_decay, mask), scale_by_learning_rate(lr))


# Helpers.


def global_norm(tree) -> jax.Array:
    """The L2 norm of all leaves together."""
    return jnp.sqrt(sum(jnp.sum(jnp.square(x)) for x in jax.tree.leaves(tree)))


def decay_mask(params, mask: Any = "default"):
    """The pytree of Python bools, shaped like ``params``, that ``add_decayed_weights`` uses for ``mask``."""
    if mask is None or mask == "all":
        return jax.tree.map(lambda p: True, params)
    if isinstance(mask, str):  # "default"
        return jax.tree.map(lambda p: jnp.ndim(p) > 1, params)
    if callable(mask):
        return jax.tree_util.tree_map_with_path(lambda path, p: bool(mask(key_path_str(path), p)), params)
    # A prefix tree of bools: each bool covers the whole subtree below it.
    return jax.tree.map(lambda on, sub: jax.tree.map(lambda p: bool(on), sub), mask, params)


def _bool_tree(tree) -> bool:
    """A pytree whose leaves are all bools (Python's or numpy's), as a decay mask must be."""
    return all(
        isinstance(leaf, bool) or getattr(leaf, "dtype", None) == bool  # noqa: E721 (a numpy dtype equals bool)
        for leaf in jax.tree.leaves(tree)
    )


def _value_at(hyper: Hyper, count):
    return hyper(count) if callable(hyper) else hyper


def _present(hyper: Hyper, make: Callable[[], Optimizer]) -> tuple[Optimizer, ...]:
    """``(make(),)`` unless ``hyper`` is a constant zero, which would make the block a no-op."""
    return (make(),) if callable(hyper) or hyper else ()


def _increment(count):
    # Saturate instead of wrapping to a negative step after 2**31 - 1 updates.
    return jnp.where(count < jnp.iinfo(jnp.int32).max, count + 1, count)


def _count_init(params):
    return CountState(jnp.zeros([], jnp.int32))


def _empty_init(params):
    return EmptyState()
