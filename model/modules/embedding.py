"""Embedding: a learned (num_embeddings, features) table indexed by integer ids."""

from __future__ import annotations

import jax.numpy as jnp

from model.modules import initializers
from model.modules.module import Module, check_size


class Embedding(Module):
    """ids of any shape -> vectors of shape ids.shape + (features,). Out-of-range ids are clamped to the table."""

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
