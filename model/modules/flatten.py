"""Flatten: (batch, ...) -> (batch, features), e.g. between convolutions and Linear layers."""

from __future__ import annotations

from model.modules.module import Module


class Flatten(Module):
    def forward(self, params, x):
        return x.reshape(x.shape[0], -1)
