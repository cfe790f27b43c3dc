"""Embedding: a learned (num_embeddings, features) table indexed by integer ids; a learned position embedding."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from model.modules import initializers
from model.modules.module import Module, check_size, default_device

# On a GPU, tables of at most this many rows take their gradient as a matrix product with the ids' one-hot rows, not
# as the scatter-add that autodiff writes: every id of a batch adds into one of few rows, and on a GPU those adds wait
# on each other (a character vocabulary's scatter took a quarter of GPT-2 small's step). On the CPU the scatter is the
# faster (the language model's step was 10% slower with the product); on a TPU it was not measured. benchmarks/README.md
ONE_HOT_ROWS = 256


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
        table = params["embedding"]
        one_hot = table.shape[0] <= ONE_HOT_ROWS and default_device().platform == "gpu"  # chosen where traced
        return (rows_by_one_hot if one_hot else rows)(table, ids)


def rows(table, ids):
    """table[ids] with ids clamped to the table. mode="clip" is one clamping gather: the default mode fills
    out-of-range rows with NaN through a SELECT that tf2onnx turns into NaN * 0, and plain indexing adds a SELECT to
    wrap negative ids."""
    return jnp.take(table, ids, axis=0, mode="clip")


@jax.custom_jvp
def rows_by_one_hot(table, ids):
    """``rows(table, ids)`` whose derivative in the table is a matrix product with the ids' one-hot rows, so that
    its transpose, the table's gradient, is one too (one_hot(ids)^T @ cotangent) rather than a scatter-add."""
    return rows(table, ids)


@rows_by_one_hot.defjvp
def _rows_jvp(primals, tangents):
    table, ids = primals
    hot = jax.nn.one_hot(jnp.clip(ids, 0, table.shape[0] - 1), table.shape[0], dtype=table.dtype)
    # HIGHEST: a float32 table's rows pass exactly (a GPU's default would round them to TF32)
    tangent = jnp.einsum("...v,vd->...d", hot, tangents[0], precision=jax.lax.Precision.HIGHEST)
    return rows(table, ids), tangent


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
