"""The one interface every layer implements.

A module object holds hyperparameters only. Its parameters and its state (batch-norm statistics) are plain nested
dicts that ``init`` returns and every call takes explicitly, so ``jax.grad``, optimizers, checkpoints and exporters
all see the same tree, with key paths such as ``blocks.1.norm.scale``.

    params, state = module.init(key, x)                       # x: an array or a jax.ShapeDtypeStruct
    y, state = module(params, state, x, train=False, key=None)

Stateless layers implement ``init_params(key, x)`` and ``forward(params, x)`` and inherit the rest.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any

import jax

from model.checks import MAX_SIZE, check_integer

Params = dict
State = dict
# The most entries of a list of sizes, one per layer or stage (an MLP's `hidden`, a CNN's `channels`): every layer
# is traced, lowered and compiled as code of its own, so 100,000 layers exhaust a 3 GB memory limit in tracing and
# compiling, before the compiled step has any memory figures to check; deeper models repeat a block (depth).
MAX_LAYERS = 1000


def check_size(value, name: str, minimum: int = 1) -> None:
    """A width, count or class number: an integer from `minimum` to MAX_SIZE (10.0 or 1e30 from a JSON config is
    refused here, not as a shape error deep inside jax)."""
    check_integer(value, name, minimum, MAX_SIZE)


def check_sizes(values, name: str, minimum: int = 1, nonempty: bool = False) -> None:
    """A list of sizes, one per layer or stage."""
    if not isinstance(values, (list, tuple)) or (nonempty and not values):
        raise ValueError(f"{name}: expected a{' non-empty' if nonempty else ''} list of integers, got {values!r}")
    if len(values) > MAX_LAYERS:
        raise ValueError(f"{name}: {len(values):,} entries, one layer each; at most {MAX_LAYERS:,}")
    for i, value in enumerate(values):
        check_size(value, f"{name}.{i}", minimum)


def key_path_str(keypath) -> str:
    """A jax key path as a dotted string: ``blocks.1.norm.scale``."""
    parts = []
    for k in keypath:
        if isinstance(k, jax.tree_util.DictKey):
            parts.append(str(k.key))
        elif isinstance(k, jax.tree_util.SequenceKey):
            parts.append(str(k.idx))
        elif isinstance(k, jax.tree_util.GetAttrKey):
            parts.append(k.name)
        elif isinstance(k, jax.tree_util.FlattenedIndexKey):
            parts.append(str(k.key))
        else:
            parts.append(str(k))
    return ".".join(parts)


def shape_of(x):
    """The abstract value of an array, a ShapeDtypeStruct or a tuple shape (float32 assumed for a tuple), or of
    each leaf of a tree of them (a model of named inputs)."""
    if isinstance(x, tuple) and all(isinstance(d, numbers.Integral) for d in x):
        return jax.ShapeDtypeStruct(x, jax.numpy.float32)
    return jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype), x)


class Module:
    def init(self, key: jax.Array, x) -> tuple[Params, State]:
        return self.init_params(key, shape_of(x)), {}

    def init_params(self, key: jax.Array, x: jax.ShapeDtypeStruct) -> Params:
        return {}

    def __call__(self, params: Params, state: State, x, *, train: bool = False, key: jax.Array | None = None):
        return self.forward(params, x), state

    def forward(self, params: Params, x):
        raise NotImplementedError(f"{type(self).__name__} must implement forward() or __call__()")

    def children(self) -> dict[str, Module]:
        """Named submodules whose params sit under their names; used by summaries."""
        return {}

    @classmethod
    def export_examples(cls) -> dict[str, tuple]:
        """The cases the export-parity check (tests/inference/test_export_parity.py) runs this layer class on, by case
        name: ``(an instance, the shape of one example without the batch, the input kind)``, the kind ``"normal"``,
        ``"wide"`` (3x the spread, for activation tails) or ``"ids"`` (int32 token ids). Only a class's own
        definition counts (a subclass does not inherit its parent's cases); a class without one is not in that
        check, except inside another case's module."""
        return {}

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({fields})"


def output_shape(module: Module, params: Params, state: State, x):
    """Shape inference without computing anything (jax.eval_shape)."""
    return jax.eval_shape(lambda p, s, v: module(p, s, v, train=False)[0], params, state, shape_of(x))


class Lambda(Module):
    """A parameter-free function (an activation, a reshape) used as a layer."""

    def __init__(self, fn: Callable, name: str | None = None):
        self.fn = fn
        self.name = name or getattr(fn, "__name__", "lambda")

    def forward(self, params, x):
        return self.fn(x)

    def __repr__(self) -> str:
        return f"Lambda({self.name})"


def as_module(layer: Any) -> Module:
    if isinstance(layer, Module):
        return layer
    if callable(layer):
        return Lambda(layer)
    raise TypeError(f"expected a Module or a function, got {type(layer).__name__}")


def default_device():
    """The device the code being traced is placed on: ``jax.default_device`` where set (as ``peaks.step_flops``
    does for the host's CPU), else JAX's first device. A layer that chooses its formulation by platform asks it."""
    import jax

    device = jax.config.jax_default_device
    if isinstance(device, str):
        return jax.devices(device)[0]
    return device if device is not None else jax.devices()[0]
