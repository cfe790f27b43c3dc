"""Multi-head scaled dot-product attention (self- or cross-attention)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from model.modules.activations import softmax
from model.modules.dropout import dropout
from model.modules.linear import Linear
from model.modules.module import Module, check_size, shape_of


def dot_product_attention(q, k, v, mask=None, *, dropout_rate=0.0, key=None):
    """softmax(q k^T / sqrt(d)) v for q (batch, q_len, heads, d), k and v (batch, kv_len, heads, d).

    mask: booleans broadcastable to (batch, heads, q_len, kv_len), True where a query may attend.
    dropout_rate > 0 drops attention weights (needs key).
    """
    logits = jnp.einsum("bqhd,bkhd->bhqk", q * (1.0 / math.sqrt(q.shape[-1])), k)
    if mask is not None:
        # The most negative finite value, not -inf: a fully masked row stays finite (uniform weights), and no
        # exporter's select lowering can form -inf * 0.
        logits = jnp.where(mask, logits, jnp.finfo(logits.dtype).min)
    weights = softmax(logits, axis=-1)
    if dropout_rate > 0.0:
        weights = dropout(weights, dropout_rate, key)
    return jnp.einsum("bhqk,bkhd->bqhd", weights, v)


def causal_mask(q_len: int, kv_len: int) -> jax.Array:
    """(1, 1, q_len, kv_len) booleans: query i may attend to keys 0..i (a constant, so every exporter folds it)."""
    return jnp.tril(jnp.ones((q_len, kv_len), bool))[None, None]


class MultiHeadAttention(Module):
    """Projects x (queries) and context (keys/values; x itself when None) into heads, attends, projects back.

    Params `query`, `key`, `value`, `out` are Linear layers; the projections have qkv_features outputs split as
    (heads, head_dim), head-major. qkv_features and out_features default to x's feature size. ``causal``: each
    position attends only to itself and earlier ones (a decoder); ``weight_init`` / ``out_init`` initialise the
    projections and the output layer.
    """

    @classmethod
    def export_examples(cls):
        return {
            "attention": (cls(2), (6, 8), "normal"),
            "attention_cross_features": (cls(2, qkv_features=12, out_features=5), (6, 8), "normal"),
            "causal_attention": (cls(2, use_bias=False, causal=True), (6, 8), "normal"),
        }

    def __init__(
        self,
        num_heads: int,
        qkv_features: int | None = None,
        out_features: int | None = None,
        use_bias: bool = True,
        dropout_rate: float = 0.0,
        causal: bool = False,
        weight_init="lecun_normal",
        out_init=None,
    ):
        check_size(num_heads, "num_heads")
        for name, size in (("qkv_features", qkv_features), ("out_features", out_features)):
            if size is not None:
                check_size(size, name)
        self.num_heads = num_heads
        self.qkv_features = qkv_features
        self.out_features = out_features
        self.use_bias = use_bias
        self.dropout_rate = dropout_rate
        self.causal = causal
        self.weight_init = weight_init
        self.out_init = out_init or weight_init

    def _projections(self, x_features):
        qkv = self.qkv_features or x_features
        if qkv % self.num_heads:
            raise ValueError(f"qkv_features={qkv} is not divisible by num_heads={self.num_heads}")
        proj = Linear(qkv, use_bias=self.use_bias, weight_init=self.weight_init)
        out = Linear(self.out_features or x_features, use_bias=self.use_bias, weight_init=self.out_init)
        return proj, out, qkv // self.num_heads

    def init(self, key, x, context=None):
        """context: keys/values (an array or jax.ShapeDtypeStruct) for cross-attention; defaults to x."""
        x = shape_of(x)
        context = x if context is None else shape_of(context)
        proj, out, head_dim = self._projections(x.shape[-1])
        k_q, k_k, k_v, k_o = jax.random.split(key, 4)
        heads = jax.ShapeDtypeStruct(x.shape[:-1] + (self.num_heads * head_dim,), x.dtype)
        params = {
            "query": proj.init_params(k_q, x),
            "key": proj.init_params(k_k, context),
            "value": proj.init_params(k_v, context),
            "out": out.init_params(k_o, heads),
        }
        return params, {}

    def __call__(self, params, state, x, *, context=None, mask=None, key_mask=None, train=False, key=None):
        """``mask``: booleans broadcastable to (batch, heads, q_len, kv_len), True where a query may attend;
        ``key_mask``: (batch, kv_len), nonzero on the real keys, zero on padding, which no query attends to (a
        query whose keys are all padding gets the mean of the values)."""
        context = x if context is None else context
        if key_mask is not None:
            keys = (key_mask != 0)[:, None, None, :]
            mask = keys if mask is None else jnp.logical_and(mask, keys)
        proj, out, head_dim = self._projections(x.shape[-1])

        def split_heads(name, inputs):
            return proj.forward(params[name], inputs).reshape(*inputs.shape[:-1], self.num_heads, head_dim)

        q, k, v = split_heads("query", x), split_heads("key", context), split_heads("value", context)
        if self.causal:
            causal = causal_mask(x.shape[-2], context.shape[-2])
            mask = causal if mask is None else jnp.logical_and(mask, causal)
        rate = self.dropout_rate if train else 0.0
        y = dot_product_attention(q, k, v, mask, dropout_rate=rate, key=key)
        return out.forward(params["out"], y.reshape(*x.shape[:-1], self.num_heads * head_dim)), state
