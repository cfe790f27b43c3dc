"""Branches: one module per named input, their outputs joined, for a model of several inputs.

    Branches({"image": cnn, "features": mlp})    # x = {"image": (B, H, W, C), "features": (B, F)}

applies each branch to the input of its name and concatenates the outputs, each flattened to (B, -1), into one
(B, sum of widths) array that the layers after it take like any other. Each branch's params sit under its name.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from model.modules.module import Module, as_module, shape_of


class Branches(Module):
    def __init__(self, branches: dict):
        if not isinstance(branches, dict) or not branches:
            raise ValueError(f"Branches: expected a dict of {{input name: module}}, got {branches!r}")
        self.branches = {str(name): as_module(branch) for name, branch in branches.items()}

    def children(self):
        return self.branches

    def inputs_of(self, x) -> dict:
        """x's entries this module reads; a missing one is named (a KeyError deep in a trace says less)."""
        if not isinstance(x, dict):
            raise ValueError(f"Branches: expected named inputs {sorted(self.branches)}, got one array")
        missing = sorted(set(self.branches) - set(x))
        if missing:
            raise ValueError(f"Branches: no input {missing[0]!r}; the inputs are {sorted(x)}")
        return {name: x[name] for name in self.branches}

    def init(self, key, x):
        params, state = {}, {}
        for i, (name, value) in enumerate(self.inputs_of(shape_of(x)).items()):
            params[name], state[name] = self.branches[name].init(jax.random.fold_in(key, i), value)
        return params, state

    def __call__(self, params, state, x, *, train=False, key=None):
        outputs, new_state = [], {}
        for i, (name, value) in enumerate(self.inputs_of(x).items()):
            child_key = None if key is None else jax.random.fold_in(key, i)
            y, new_state[name] = self.branches[name](params[name], state[name], value, train=train, key=child_key)
            outputs.append(y.reshape(y.shape[0], -1))
        return jnp.concatenate(outputs, axis=-1), new_state

    def __repr__(self):
        inner = "\n".join(f"  ({name}): {branch!r}".replace("\n", "\n  ") for name, branch in self.branches.items())
        return f"Branches(\n{inner}\n)"


class Heads(Module):
    """One module per named output, each applied to the same input: a model of several outputs.

        Sequential({"body": cnn, "heads": Heads({"digit": Linear(10), "ink": Linear(1)})})

    gives ``{"digit": (B, 10), "ink": (B, 1)}``, which a ``weighted_sum`` loss and per-output metrics
    (``{"name": "accuracy", "output": "digit"}``) take by name. Each head's params sit under its name.
    """

    def __init__(self, heads: dict):
        if not isinstance(heads, dict) or not heads:
            raise ValueError(f"Heads: expected a dict of {{output name: module}}, got {heads!r}")
        self.heads = {str(name): as_module(head) for name, head in heads.items()}

    def children(self):
        return self.heads

    def init(self, key, x):
        params, state = {}, {}
        for i, (name, head) in enumerate(self.heads.items()):
            params[name], state[name] = head.init(jax.random.fold_in(key, i), shape_of(x))
        return params, state

    def __call__(self, params, state, x, *, train=False, key=None):
        outputs, new_state = {}, {}
        for i, (name, head) in enumerate(self.heads.items()):
            child_key = None if key is None else jax.random.fold_in(key, i)
            outputs[name], new_state[name] = head(params[name], state[name], x, train=train, key=child_key)
        return outputs, new_state

    def __repr__(self):
        inner = "\n".join(f"  ({name}): {head!r}".replace("\n", "\n  ") for name, head in self.heads.items())
        return f"Heads(\n{inner}\n)"
