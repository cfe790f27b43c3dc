"""Residual connection: x + f(x). The wrapped module's params sit directly under the residual's name."""
from __future__ import annotations

from model.modules.module import Module


class Residual(Module):
    def __init__(self, body: Module):
        self.body = body

    def children(self):
        return self.body.children()

    def init(self, key, x):
        return self.body.init(key, x)

    def __call__(self, params, state, x, *, train=False, key=None):
        y, state = self.body(params, state, x, train=train, key=key)
        return x + y, state
