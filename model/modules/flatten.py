"""Flatten: (batch, ...) -> (batch, features), e.g. between convolutions and Linear layers."""

from __future__ import annotations

from model.modules.module import Module


class Flatten(Module):
    @classmethod
    def export_examples(cls):
        from model.modules.linear import Linear
        from model.modules.sequential import Sequential

        return {"flatten": (Sequential([cls(), Linear(3)]), (8, 8, 4), "normal")}

    def forward(self, params, x):
        return x.reshape(x.shape[0], -1)
