"""Residual connection: x + f(x), or shortcut(x) + f(x) where the shape changes (a ResNet's projection).

The wrapped module's params sit directly under the residual's name; a shortcut's sit under "shortcut" beside them.
"""

from __future__ import annotations

import jax

from model.modules.module import Module, shape_of


class Residual(Module):
    @classmethod
    def export_examples(cls):
        from model.modules.activations import Activation
        from model.modules.linear import Linear
        from model.modules.sequential import Sequential

        return {"residual": (cls(Sequential([Linear(5), Activation("gelu")])), (4, 5), "normal")}

    def __init__(self, body: Module, shortcut: Module | None = None):
        self.body = body
        self.shortcut = shortcut

    def children(self):
        return {**self.body.children(), **({"shortcut": self.shortcut} if self.shortcut is not None else {})}

    def init(self, key, x):
        if self.shortcut is None:
            return self.body.init(key, x)
        params, state = self.body.init(key, x)
        if "shortcut" in params or "shortcut" in state:
            raise ValueError("Residual: the body has a child named 'shortcut', which the shortcut's params would hide")
        # a stream of its own, apart from the body's children (which fold in their positions 0, 1, ...)
        params["shortcut"], state["shortcut"] = self.shortcut.init(jax.random.fold_in(key, 2**31 - 1), shape_of(x))
        return params, state

    def __call__(self, params, state, x, *, train=False, key=None):
        if self.shortcut is None:
            y, state = self.body(params, state, x, train=train, key=key)
            return x + y, state
        body_params = {k: v for k, v in params.items() if k != "shortcut"}
        body_state = {k: v for k, v in state.items() if k != "shortcut"}
        y, new_state = self.body(body_params, body_state, x, train=train, key=key)
        short_key = None if key is None else jax.random.fold_in(key, 2**31 - 1)
        s, new_state["shortcut"] = self.shortcut(params["shortcut"], state["shortcut"], x, train=train, key=short_key)
        return s + y, new_state
