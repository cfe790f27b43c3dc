"""Transformers: the pre-norm block of GPT-2 / nanoGPT, a language model over token ids (decoder-only, causal) and
a classifier of padded token sequences (an encoder: every position attends to every real one).

    model = TransformerLM(vocab_size=65, context=64, dim=128, depth=4, num_heads=4)
    params, state = model.init(key, jax.ShapeDtypeStruct((12, 64), jnp.int32))
    logits, _ = model(params, state, ids, train=True, key=dropout_key)      # (B, T, vocab_size)

Initialisation follows GPT-2 (as nanoGPT does): every weight normal(0.02), the layers that write into the residual
stream (attention output, second MLP layer) normal(0.02 / sqrt(2 * depth)) so the stream's variance does not grow
with depth; biases and norms at zero/one.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from model.checks import check_range
from model.modules import initializers
from model.modules.activations import gelu
from model.modules.attention import MultiHeadAttention
from model.modules.dropout import dropout
from model.modules.embedding import Embedding, PositionalEmbedding
from model.modules.linear import Linear
from model.modules.module import Module, check_size, shape_of
from model.modules.normalization import LayerNorm

STDDEV = 0.02


class TransformerBlock(Module):
    """The pre-norm transformer block, ``x + attn(norm1(x))`` then ``+ fc2(gelu(fc1(norm2(.))))`` with dropout on
    both residual branches: a decoder block (``causal``) or, with ``causal=False``, an encoder block; ``key_mask``
    in the call marks padding no position attends to. ``attention``: "auto" | "fused" | "plain"
    (``model.modules.attention``)."""

    @classmethod
    def export_examples(cls):
        return {"transformer_block": (cls(2, mlp_ratio=2, dropout=0.1), (6, 8), "normal")}

    def __init__(
        self,
        num_heads: int,
        mlp_ratio: int = 4,
        dropout: float = 0.0,
        causal: bool = True,
        use_bias: bool = False,
        residual_init=STDDEV,
        attention: str = "auto",
    ):
        check_size(num_heads, "num_heads")
        check_size(mlp_ratio, "mlp_ratio")
        self.num_heads, self.mlp_ratio, self.dropout, self.use_bias = num_heads, mlp_ratio, dropout, use_bias
        weight, residual = initializers.normal(STDDEV), initializers.normal(residual_init)
        self.norm1, self.norm2 = LayerNorm(use_bias=use_bias), LayerNorm(use_bias=use_bias)
        self.attn = MultiHeadAttention(
            num_heads,
            use_bias=use_bias,
            dropout_rate=dropout,
            causal=causal,
            weight_init=weight,
            out_init=residual,
            attention=attention,
        )
        self.weight_init, self.residual_init = weight, residual

    def _mlp(self, dim: int):
        return (
            Linear(self.mlp_ratio * dim, use_bias=self.use_bias, weight_init=self.weight_init),
            Linear(dim, use_bias=self.use_bias, weight_init=self.residual_init),
        )

    def init(self, key, x):
        x = shape_of(x)
        fc1, fc2 = self._mlp(x.shape[-1])
        hidden = jax.ShapeDtypeStruct((*x.shape[:-1], fc1.out_features), x.dtype)
        keys = jax.random.split(key, 3)
        params = {
            "norm1": self.norm1.init_params(None, x),
            "attn": self.attn.init(keys[0], x)[0],
            "norm2": self.norm2.init_params(None, x),
            "fc1": fc1.init_params(keys[1], x),
            "fc2": fc2.init_params(keys[2], hidden),
        }
        return params, {}

    def __call__(self, params, state, x, *, key_mask=None, train=False, key=None):
        """``key_mask``: (batch, length), zero on padding: no position attends to a padded one."""
        fc1, fc2 = self._mlp(x.shape[-1])
        rate = self.dropout if train else 0.0
        keys = jax.random.split(key, 3) if key is not None and rate > 0 else (None, None, None)
        normed = self.norm1.forward(params["norm1"], x)
        h, _ = self.attn(params["attn"], {}, normed, key_mask=key_mask, train=train, key=keys[0])
        x = x + dropout(h, rate, keys[1])
        h = fc2.forward(params["fc2"], gelu(fc1.forward(params["fc1"], self.norm2.forward(params["norm2"], x))))
        return x + dropout(h, rate, keys[2]), state


class TransformerLM(Module):
    """Token ids (B, T), T <= context -> next-token logits (B, T, vocab_size): token + learned position embeddings,
    ``depth`` causal pre-norm blocks, a final LayerNorm and a head (the token embedding itself with
    ``tie_weights``, so no separate ``head`` weight). ``attention``: "auto" | "fused" | "plain", how each block
    computes its attention (``model.modules.attention``: cuDNN's fused kernel on a GPU where it can run)."""

    def __init__(
        self,
        vocab_size: int,
        context: int,
        dim: int = 128,
        depth: int = 4,
        num_heads: int = 4,
        mlp_ratio: int = 4,
        dropout: float = 0.0,
        tie_weights: bool = True,
        use_bias: bool = False,
        attention: str = "auto",
    ):
        for name, size in (
            ("vocab_size", vocab_size),
            ("context", context),
            ("dim", dim),
            ("depth", depth),
            ("num_heads", num_heads),
            ("mlp_ratio", mlp_ratio),
        ):
            check_size(size, name)
        check_range(dropout, "dropout", 0, 1)
        if dim % num_heads:
            raise ValueError(f"dim {dim} is not divisible by num_heads {num_heads}")
        self.vocab_size, self.context, self.dim, self.depth = vocab_size, context, dim, depth
        self.dropout, self.tie_weights = dropout, tie_weights
        self.tokens = Embedding(vocab_size, dim, weight_init=initializers.normal(STDDEV))
        self.positions = PositionalEmbedding(context, weight_init=initializers.normal(STDDEV))
        residual = STDDEV / math.sqrt(2 * depth)
        self.blocks = [
            TransformerBlock(num_heads, mlp_ratio, dropout, True, use_bias, residual, attention) for _ in range(depth)
        ]
        self.norm = LayerNorm(use_bias=use_bias)
        self.head = Linear(vocab_size, use_bias=False, weight_init=initializers.normal(STDDEV))

    def init(self, key, ids):
        ids = shape_of(ids)
        x = jax.ShapeDtypeStruct((*ids.shape, self.dim), jnp.float32)
        keys = jax.random.split(key, self.depth + 3)
        params = {
            "tokens": self.tokens.init_params(keys[0], ids),
            "positions": self.positions.init_params(keys[1], x),
            "blocks": {str(i): block.init(keys[3 + i], x)[0] for i, block in enumerate(self.blocks)},
            "norm": self.norm.init_params(None, x),
        }
        if not self.tie_weights:
            params["head"] = self.head.init_params(keys[2], x)
        return params, {}

    def __call__(self, params, state, ids, *, train=False, key=None):
        length = ids.shape[-1]
        if length > self.context:
            raise ValueError(f"sequences of {length} tokens exceed the model's context of {self.context}")
        keys = jax.random.split(key, self.depth + 1) if key is not None else [None] * (self.depth + 1)
        x = self.positions.forward(params["positions"], self.tokens.forward(params["tokens"], ids))
        x = dropout(x, self.dropout if train else 0.0, keys[0])
        for i, block in enumerate(self.blocks):
            x, _ = block(params["blocks"][str(i)], {}, x, train=train, key=keys[i + 1])
        x = self.norm.forward(params["norm"], x)
        if self.tie_weights:  # through a 2-D matmul, as Linear does, for the exporters
            table = params["tokens"]["embedding"]
            return (x.reshape(-1, self.dim) @ table.T).reshape(*x.shape[:-1], self.vocab_size), state
        return self.head.forward(params["head"], x), state


class TransformerClassifier(Module):
    """Token ids (B, T), T <= context, padded at the end or anywhere -> class logits (B, num_classes): token and
    learned position embeddings, ``depth`` pre-norm encoder blocks (``causal=False``), a final LayerNorm, the mean
    over the real positions and a linear head. It declares ``mask`` (B, T), nonzero on real tokens: the trainer
    gives it the batch's mask, and padded positions then change nothing (not the attention, not the mean), so the
    logits are the same whatever the padding's length or content."""

    def __init__(
        self,
        vocab_size: int,
        num_classes: int,
        context: int,
        dim: int = 64,
        depth: int = 2,
        num_heads: int = 4,
        mlp_ratio: int = 4,
        dropout: float = 0.0,
    ):
        for name, size in (("vocab_size", vocab_size), ("num_classes", num_classes), ("depth", depth)):
            check_size(size, name)
        check_range(dropout, "dropout", 0, 1)
        if dim % num_heads:
            raise ValueError(f"dim {dim} is not divisible by num_heads {num_heads}")
        self.vocab_size, self.num_classes, self.context = vocab_size, num_classes, context
        self.dim, self.depth, self.dropout = dim, depth, dropout
        self.tokens = Embedding(vocab_size, dim, weight_init=initializers.normal(STDDEV))
        self.positions = PositionalEmbedding(context, weight_init=initializers.normal(STDDEV))
        self.blocks = [TransformerBlock(num_heads, mlp_ratio, dropout, causal=False) for _ in range(depth)]
        self.norm = LayerNorm()
        self.head = Linear(num_classes)

    def init(self, key, ids):
        ids = shape_of(ids)
        x = jax.ShapeDtypeStruct((*ids.shape, self.dim), jnp.float32)
        keys = jax.random.split(key, self.depth + 3)
        params = {
            "tokens": self.tokens.init_params(keys[0], ids),
            "positions": self.positions.init_params(keys[1], x),
            "blocks": {str(i): block.init(keys[3 + i], x)[0] for i, block in enumerate(self.blocks)},
            "norm": self.norm.init_params(None, x),
            "head": self.head.init_params(keys[2], jax.ShapeDtypeStruct((ids.shape[0], self.dim), jnp.float32)),
        }
        return params, {}

    def __call__(self, params, state, ids, *, mask=None, train=False, key=None):
        keys = jax.random.split(key, self.depth + 1) if key is not None else [None] * (self.depth + 1)
        real = jnp.ones(ids.shape, jnp.float32) if mask is None else (mask != 0).astype(jnp.float32)
        if ids.shape[-1] > self.context:
            raise ValueError(f"sequences of {ids.shape[-1]} tokens exceed the model's context of {self.context}")
        # computed at the full context whatever the batch's padding: sums over the positions then run over the same
        # shapes, so the logits of a sequence are bit for bit the same however far its batch was padded
        pad = ((0, 0), (0, self.context - ids.shape[-1]))
        ids, real = jnp.pad(ids, pad), jnp.pad(real, pad)
        x = self.positions.forward(params["positions"], self.tokens.forward(params["tokens"], ids))
        x = dropout(x, self.dropout if train else 0.0, keys[0])
        for i, block in enumerate(self.blocks):
            x, _ = block(params["blocks"][str(i)], {}, x, key_mask=real, train=train, key=keys[i + 1])
        x = self.norm.forward(params["norm"], x)
        # where, not a product: a padded position may hold anything, even an overflow, and must add exactly 0
        total = jnp.where(real[..., None] > 0, x, 0.0).sum(axis=-2)
        pooled = total / jnp.maximum(real.sum(axis=-1, keepdims=True), 1.0)
        return self.head.forward(params["head"], pooled), state
