"""Multi-head scaled dot-product attention (self- or cross-attention).

The attention itself is the plain math below (two matrix products and a softmax, differentiated by JAX), or, on a
GPU, cuDNN's fused kernel (``jax.nn.dot_product_attention(..., implementation="cudnn")``), which never writes the
(q_len, kv_len) score matrix to memory. ``MultiHeadAttention(attention=...)`` chooses when it is traced: "auto" takes
the fused kernel where cuDNN can run it (``fused_obstacle`` says why not, once in the log) and the plain math
everywhere else; "fused" insists (a ValueError where it cannot run), "plain" never fuses. Exports trace the plain math
(``plain_attention()``): cuDNN's custom call is not among ``jax.export``'s stable targets, and no other runtime has it.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import math

import jax
import jax.numpy as jnp

from model.modules.activations import softmax
from model.modules.dropout import dropout
from model.modules.linear import Linear
from model.modules.module import Module, check_size, default_device, shape_of


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


IMPLEMENTATIONS = ("auto", "fused", "plain")
FUSED_DTYPES = ("bfloat16", "float16")
# Set by plain_attention(): a context variable, so that an export on one thread leaves a background compile alone.
FORCED_PLAIN = contextvars.ContextVar("plain_attention", default=False)
log = logging.getLogger(__name__)
_said: set[str] = set()


class FusedAttentionUnavailable(ValueError):
    """attention="fused" where cuDNN's kernel cannot run: the message says why."""


@contextlib.contextmanager
def plain_attention():
    """Every attention this thread traces inside takes the plain math, whatever its layer asked for (exports)."""
    token = FORCED_PLAIN.set(True)
    try:
        yield
    finally:
        FORCED_PLAIN.reset(token)


def fused_obstacle(
    dtype, head_dim: int, *, platform: str, compute_capability, masked: bool, dropout: bool, causal_offset: bool
) -> str | None:
    """Why cuDNN's fused attention cannot run these heads (None where it can): a GPU of compute capability 8.0 or
    later, bfloat16 or float16, a head size a multiple of 8 and at most 128 (256 on Hopper), no mask but the causal
    one over equal lengths, no dropout on the weights."""
    if platform != "gpu":
        return f"the platform is {platform}, not a GPU"
    capability = float(compute_capability or 0)
    if capability < 8.0:
        return f"the GPU's compute capability is {compute_capability}, under 8.0"
    if jnp.dtype(dtype).name not in FUSED_DTYPES:
        return f"it computes in {jnp.dtype(dtype).name}, not {' or '.join(FUSED_DTYPES)}"
    largest = 256 if 9.0 <= capability < 10.0 else 128
    if head_dim % 8 or head_dim > largest:
        return f"the head size is {head_dim}, not a multiple of 8 up to {largest}"
    if masked:
        return "a mask other than the causal one (padding, or one given)"
    if causal_offset:
        return "a causal mask between sequences of different lengths"
    if dropout:
        return "dropout on the attention weights"
    return None


def implementation(requested: str, obstacle: str | None) -> str:
    """ "fused" or "plain" for a layer that asked for `requested`, given what stops the fused kernel (said once
    in the log: the choice and its reason)."""
    if FORCED_PLAIN.get():
        return "plain"
    if requested == "fused" and obstacle:
        raise FusedAttentionUnavailable(f'attention "fused": cuDNN\'s fused attention cannot run here: {obstacle}')
    chosen = "plain" if requested == "plain" or obstacle else "fused"
    line = (
        "attention: cuDNN's fused kernel"
        if chosen == "fused"
        else f"attention: the plain math ({'asked for' if requested == 'plain' else obstacle})"
    )
    if line not in _said:
        _said.add(line)
        log.info(line)
    return chosen


def fused_attention(q, k, v, *, causal: bool):
    """cuDNN's fused attention of q (batch, q_len, heads, d), k and v (batch, kv_len, heads, d): the plain math's
    values, without the score matrix in memory."""
    return jax.nn.dot_product_attention(
        q, k, v, scale=1.0 / math.sqrt(q.shape[-1]), is_causal=causal, implementation="cudnn"
    )


def causal_mask(q_len: int, kv_len: int) -> jax.Array:
    """(1, 1, q_len, kv_len) booleans: query i may attend to keys 0..i (a constant, so every exporter folds it)."""
    return jnp.tril(jnp.ones((q_len, kv_len), bool))[None, None]


class MultiHeadAttention(Module):
    """Projects x (queries) and context (keys/values; x itself when None) into heads, attends, projects back.

    Params `query`, `key`, `value`, `out` are Linear layers; the projections have qkv_features outputs split as
    (heads, head_dim), head-major. qkv_features and out_features default to x's feature size. ``causal``: each
    position attends only to itself and earlier ones (a decoder); ``weight_init`` / ``out_init`` initialise the
    projections and the output layer; ``attention``: "auto" | "fused" | "plain", how to compute it (the module's
    docstring).
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
        attention: str = "auto",
    ):
        check_size(num_heads, "num_heads")
        if attention not in IMPLEMENTATIONS:
            raise ValueError(f"attention: expected one of {', '.join(IMPLEMENTATIONS)}, got {attention!r}")
        if attention == "fused" and dropout_rate:
            raise ValueError(f'attention "fused": cuDNN\'s fused attention takes no dropout (dropout {dropout_rate})')
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
        self.attention = attention

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
        rate = self.dropout_rate if train else 0.0
        if self.attention == "plain":
            how = "plain"
        else:
            device = default_device()
            obstacle = fused_obstacle(
                q.dtype,
                head_dim,
                platform=device.platform,
                compute_capability=getattr(device, "compute_capability", None),
                masked=mask is not None,
                dropout=rate > 0.0,
                causal_offset=self.causal and x.shape[-2] != context.shape[-2],
            )
            how = implementation(self.attention, obstacle)
        if how == "fused":
            y = fused_attention(q, k, v, causal=self.causal)
        else:
            if self.causal:
                causal = causal_mask(x.shape[-2], context.shape[-2])
                mask = causal if mask is None else jnp.logical_and(mask, causal)
            y = dot_product_attention(q, k, v, mask, dropout_rate=rate, key=key)
        return out.forward(params["out"], y.reshape(*x.shape[:-1], self.num_heads * head_dim)), state
