"""Sequential: layers applied in order, each with its params under its name ("0", "1", ... or given names)."""

from __future__ import annotations

import jax

from model.modules.module import Module, as_module, output_shape, shape_of


class Sequential(Module):
    def __init__(self, layers):
        items = layers.items() if isinstance(layers, dict) else enumerate(layers)
        self.layers = {str(name): as_module(layer) for name, layer in items}

    def children(self):
        return self.layers

    def init(self, key, x):
        # fold_in by position: each child gets its own stream, independent of how many keys siblings use.
        x = shape_of(x)
        params, state = {}, {}
        for i, (name, layer) in enumerate(self.layers.items()):
            params[name], state[name] = layer.init(jax.random.fold_in(key, i), x)
            x = output_shape(layer, params[name], state[name], x)
        return params, state

    def __call__(self, params, state, x, *, train=False, key=None):
        new_state = {}
        for i, (name, layer) in enumerate(self.layers.items()):
            child_key = None if key is None else jax.random.fold_in(key, i)
            x, new_state[name] = layer(params[name], state[name], x, train=train, key=child_key)
        return x, new_state

    def __repr__(self):
        inner = "\n".join(f"  ({name}): {layer!r}".replace("\n", "\n  ") for name, layer in self.layers.items())
        return f"Sequential(\n{inner}\n)"
