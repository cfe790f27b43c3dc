"""Linear (dense) layer over the last axis.

Its product is ``x @ weight`` differentiated by JAX, or, where the optional ``model/kernels`` is there, has a form for
the product's shapes and the code is lowered for the CPU, that form (same values and gradients:
``model/modules/cpu_forms.py``)."""

from __future__ import annotations

import jax

from model.modules import initializers
from model.modules.cpu_forms import by_platform
from model.modules.module import Module, check_size


class Linear(Module):
    """y = x @ weight + bias, weight of shape (in_features, out_features); in_features is inferred at init."""

    @classmethod
    def export_examples(cls):
        return {"linear": (cls(6), (5,), "normal"), "linear_rank3": (cls(6), (3, 5), "normal")}

    def __init__(self, out_features: int, use_bias: bool = True, weight_init="lecun_normal", bias_init="zeros"):
        check_size(out_features, "out_features")
        self.out_features = out_features
        self.use_bias = use_bias
        self.weight_init = weight_init
        self.bias_init = bias_init

    def init_params(self, key, x):
        w_key, b_key = jax.random.split(key)
        params = {"weight": initializers.get(self.weight_init)(w_key, (x.shape[-1], self.out_features), x.dtype)}
        if self.use_bias:
            params["bias"] = initializers.get(self.bias_init)(b_key, (self.out_features,), x.dtype)
        return params

    def forward(self, params, x):
        # Rank > 2 inputs go through a 2-D matmul: tf2onnx mis-reshapes rank-3 dense layers (docs/export.md).
        lead = x.shape[:-1]
        y = matmul(x.reshape(-1, x.shape[-1]), params["weight"])
        if self.use_bias:
            y = y + params["bias"]
        return y.reshape(*lead, self.out_features)


def matmul(x, w):
    """``x @ w`` for a 2-D ``x``: model/kernels' product where it has one for these shapes and the code is lowered
    for the CPU."""
    return by_platform(plain_matmul, lambda kernels: kernels.matmul_for_cpu(x, w), x, w)


def plain_matmul(x, w):
    return x @ w
