"""Embedding: a learned (num_embeddings, features) table indexed by integer ids; a learned position embedding."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from model.modules import initializers
from model.modules.module import Module, check_size


class Embedding(Module):
    """ids of any shape -> vectors of shape ids.shape + (features,). Out-of-range ids are clamped to the table."""

    @classmethod
    def export_examples(cls):
        return {"embedding": (cls(11, 6), (7,), "ids")}

    def __init__(self, num_embeddings: int, features: int, weight_init="normal", dtype=jnp.float32):
        check_size(num_embeddings, "num_embeddings")
        check_size(features, "features")
        self.num_embeddings = num_embeddings
        self.features = features
        self.weight_init = weight_init
        self.dtype = dtype

    def init_params(self, key, x):
        # x holds ids, so the table's dtype is a hyperparameter rather than x.dtype.
        shape = (self.num_embeddings, self.features)
        return {"embedding": initializers.get(self.weight_init)(key, shape, self.dtype)}

    def forward(self, params, ids):
        if not jnp.issubdtype(ids.dtype, jnp.integer):
            ids = ids.astype(jnp.int32)
        # mode="clip" is one clamping gather. The default mode fills out-of-range rows with NaN through a SELECT
        # that tf2onnx turns into NaN * 0, and plain indexing adds a SELECT to wrap negative ids.
        return jnp.take(params["embedding"], ids, axis=0, mode="clip")


class PositionalEmbedding(Module):
    """(B, T, D) -> the input plus a learned vector per position, T <= ``context``: what tells an encoder's
    attention, which is blind to order, where each element of a sequence is. The table (context, D) takes D from
    its input at init; a sequence shorter than ``context`` uses its first T rows."""

    def __init__(self, context: int, weight_init="normal"):
        check_size(context, "context")
        self.context = context
        self.weight_init = weight_init

    def init_params(self, key, x):
        if len(x.shape) < 2:
            raise ValueError(f"PositionalEmbedding takes (batch, length, features) inputs, got shape {tuple(x.shape)}")
        return {"embedding": initializers.get(self.weight_init)(key, (self.context, x.shape[-1]), x.dtype)}

    def forward(self, params, x):
        length = x.shape[-2]
        if length > self.context:
            raise ValueError(
                f"sequences of {length} positions exceed the position embedding's context of {self.context}"
            )
        # a static slice, not table[:T]: TFLite rejects the gather that indexing becomes (docs/export.md)
        return x + jax.lax.slice_in_dim(params["embedding"], 0, length).astype(x.dtype)
