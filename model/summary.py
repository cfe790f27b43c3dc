"""Model summary: layer path, output shape and parameter count per layer, and the totals."""

from __future__ import annotations

import math

import jax

from model.modules.branches import Branches, Heads
from model.modules.module import Module, key_path_str, output_shape, shape_of
from model.modules.sequential import Sequential


def summary_rows(model: Module, params, state, x, prefix: str = "") -> list[tuple[str, tuple | dict, int]]:
    """(path, output shape, parameter count); Sequentials, Branches and Heads are expanded, other modules are one
    row each. A module of several named outputs (a dict) has the dict of their shapes."""
    x = shape_of(x)
    if isinstance(model, Sequential):
        rows = []
        for name, layer in model.layers.items():
            path = f"{prefix}.{name}" if prefix else name
            rows += summary_rows(layer, params[name], state[name], x, path)
            x = output_shape(layer, params[name], state[name], x)
        return rows
    if isinstance(model, Branches):
        return [
            row
            for name, branch in model.branches.items()
            for row in summary_rows(branch, params[name], state[name], x[name], f"{prefix}.{name}" if prefix else name)
        ]
    if isinstance(model, Heads):
        return [
            row
            for name, head in model.heads.items()
            for row in summary_rows(head, params[name], state[name], x, f"{prefix}.{name}" if prefix else name)
        ]
    count = sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(params))
    shape = jax.tree.map(lambda leaf: tuple(leaf.shape), output_shape(model, params, state, x))
    return [(prefix or type(model).__name__, shape, count)]


def shape_text(shape) -> str:
    """(B, 10), or for named outputs digit (B, 10), ink (B, 1)."""
    if isinstance(shape, dict):
        return ", ".join(f"{name} {shape_text(value)}" for name, value in shape.items())
    return str(shape)


def summary(model: Module, params, state, x, trainable=None) -> str:
    """The table of ``summary_rows`` and the totals; ``trainable``: a tree of bools like ``params``, False on the
    leaves no update changes (frozen), counted apart."""
    rows = summary_rows(model, params, state, x)
    total = sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(params))
    size = sum(math.prod(leaf.shape) * leaf.dtype.itemsize for leaf in jax.tree.leaves(params))
    width = max([len("layer")] + [len(r[0]) for r in rows])
    lines = [f"{'layer':<{width}}  {'output shape':<20}  {'params':>10}", "-" * (width + 34)]
    lines += [f"{path:<{width}}  {shape_text(shape):<20}  {count:>10,}" for path, shape, count in rows]
    outputs = output_shape(model, params, state, x)
    if isinstance(outputs, dict):  # a model of several outputs: each by name, what losses and metrics name
        lines += [f"output {name}: {leaf.dtype}{list(leaf.shape)}" for name, leaf in outputs.items()]
    lines += ["-" * (width + 34), f"total parameters: {total:,} ({size / 2**20:.2f} MB)"]
    if trainable is not None:
        frozen = sum(math.prod(p.shape) for p, on in zip(jax.tree.leaves(params), jax.tree.leaves(trainable)) if not on)
        lines[-1] += f"; trainable {total - frozen:,}, frozen {frozen:,}"
    return "\n".join(lines)


def describe_batch(spec: dict) -> str:
    """The batch's tree of shapes and dtypes in one line: input int32[12,64], target int32[12,64], ..."""
    leaves = jax.tree_util.tree_flatten_with_path(spec)[0]
    return ", ".join(f"{key_path_str(path)} {leaf.dtype}{list(leaf.shape)}" for path, leaf in leaves)
