"""Every layer of model/modules and every sample model, exported by every route, equals the JAX model.

Routes: TFLite with a fixed and with a dynamic batch (run in LiteRT), ONNX by jax2onnx with a symbolic batch and by
tf2onnx from each .tflite (run in onnxruntime), and jax.export (deserialised and called). Fixed-batch artifacts run
at their batch size, dynamic ones at 1 and a larger size; the check is numpy's allclose at atol = rtol = 1e-4 with
finite outputs wherever JAX's are finite. Parameters are perturbed away from their initial values (unit scales,
zero biases) so that every parameter matters.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from inference.export_jax import JaxModel, export_jax
from inference.export_onnx import export_onnx, tflite_to_onnx
from inference.export_tflite import export_tflite
from inference.inputs import Inputs, Outputs
from inference.predict import OnnxModel, TFLiteModel
from model import model as samples
from model.modules.activations import Activation
from model.modules.attention import MultiHeadAttention
from model.modules.conv import Conv1d, Conv2d, ConvTranspose2d
from model.modules.dropout import Dropout
from model.modules.embedding import Embedding, PositionalEmbedding
from model.modules.flatten import Flatten
from model.modules.linear import Linear
from model.modules.module import Lambda, Module
from model.modules.normalization import BatchNorm, GroupNorm, LayerNorm, RMSNorm
from model.modules.pooling import AvgPool1d, AvgPool2d, GlobalAvgPool, MaxPool1d, MaxPool2d
from model.modules.residual import Residual
from model.modules.sequential import Sequential
from model.modules.transformer import TransformerBlock
from utils import available


class MaskInput(Module):
    """A model that declares ``mask`` as the export sees it: named inputs ``input`` and ``mask`` (train.py gives it
    the batch's mask the same way)."""

    def __init__(self, model):
        self.model = model

    def init(self, key, x):
        return self.model.init(key, x["input"])

    def __call__(self, params, state, x, *, train=False, key=None):
        return self.model(params, state, x["input"], mask=x["mask"], train=train, key=key)


FIXED = 2  # batch of the fixed-batch exports
DYNAMIC = (1, 5)  # batches a symbolic-batch export runs at
ATOL = RTOL = 1e-4
IMAGE = (8, 8, 4)  # (H, W, C) for the image layers

# name: (module, sample shape, input kind: "normal", "wide" (3x the spread, for activation tails) or "ids")
CASES = {
    "linear": (Linear(6), (5,), "normal"),
    "linear_rank3": (Linear(6), (3, 5), "normal"),
    "conv": (Conv2d(6, 3), IMAGE, "normal"),
    "conv_stride2": (Conv2d(6, 3, stride=2), IMAGE, "normal"),
    "conv_dilation2": (Conv2d(6, 3, dilation=2), IMAGE, "normal"),
    "conv_depthwise": (Conv2d(4, 3, groups=4), IMAGE, "normal"),
    "conv_grouped": (Conv2d(6, 3, groups=2), IMAGE, "normal"),
    "conv_valid": (Conv2d(6, 3, padding="VALID"), IMAGE, "normal"),
    "conv_explicit_pad": (Conv2d(6, (3, 2), padding=((2, 0), (1, 1))), IMAGE, "normal"),
    "conv_transpose_k2s2": (ConvTranspose2d(3, 2, stride=2), IMAGE, "normal"),
    "conv_transpose_k3s2": (ConvTranspose2d(3, 3, stride=2), IMAGE, "normal"),
    "conv_transpose_k4s2": (ConvTranspose2d(3, 4, stride=2), IMAGE, "normal"),
    "conv_transpose_k3s2_valid": (ConvTranspose2d(3, 3, stride=2, padding="VALID"), IMAGE, "normal"),
    "conv_transpose_k3s1": (ConvTranspose2d(3, 3), IMAGE, "normal"),
    "max_pool": (MaxPool2d(2), IMAGE, "normal"),
    "max_pool_odd": (MaxPool2d(2), (7, 7, 4), "normal"),
    "max_pool_k3s2_same": (MaxPool2d(3, stride=2, padding="SAME"), IMAGE, "normal"),
    "avg_pool": (AvgPool2d(2), IMAGE, "normal"),
    "avg_pool_k3s2_same": (AvgPool2d(3, stride=2, padding="SAME"), IMAGE, "normal"),
    "relu_max_pool": (Sequential([Activation("relu"), MaxPool2d(2)]), IMAGE, "normal"),
    "global_avg_pool": (GlobalAvgPool(), IMAGE, "normal"),
    "global_avg_pool_keepdims": (GlobalAvgPool(keepdims=True), IMAGE, "normal"),
    "layer_norm": (LayerNorm(), IMAGE, "normal"),
    "batch_norm_eval": (BatchNorm(), IMAGE, "normal"),
    "group_norm": (GroupNorm(2), IMAGE, "normal"),
    "rms_norm": (RMSNorm(), IMAGE, "normal"),
    "dropout_eval": (Sequential([Linear(6), Dropout(0.5)]), (5,), "normal"),
    "embedding": (Embedding(11, 6), (7,), "ids"),
    # sequences (B, L, C): the 1-D layers run as their 2-D forms over (B, L, 1, C)
    "conv1d_stride2_pad": (Conv1d(6, 3, stride=2, padding=(2, 1)), (9, 4), "normal"),
    "conv1d_pool_positions": (
        Sequential([PositionalEmbedding(12), Conv1d(6, 3), MaxPool1d(2), AvgPool1d(3, stride=1, padding="SAME")]),
        (10, 4),
        "normal",
    ),
    "attention": (MultiHeadAttention(2), (6, 8), "normal"),
    "attention_cross_features": (MultiHeadAttention(2, qkv_features=12, out_features=5), (6, 8), "normal"),
    "residual": (Residual(Sequential([Linear(5), Activation("gelu")])), (4, 5), "normal"),
    "flatten": (Sequential([Flatten(), Linear(3)]), IMAGE, "normal"),
    **{
        f"act_{name}": (Activation(name), (4, 6), "wide")
        for name in ("relu", "gelu", "silu", "hard_swish", "sigmoid", "tanh", "softmax", "log_softmax")
    },
    "act_gelu_tanh": (Activation("gelu", approximate=True), (4, 6), "wide"),
    # A batched matmul: with a dynamic batch, TFLite computes its reshape targets with UnsortedSegmentProd.
    "batched_matmul": (Lambda(lambda x: x @ jnp.swapaxes(x, 1, 2)), (4, 6), "normal"),
    # The pattern behind tf2onnx's NaNs: the branch not taken is -inf for x <= 0.
    "where_inf_branch": (Lambda(lambda x: jnp.where(x > 0, jnp.log(jnp.abs(x)), 0.0)), (4, 6), "wide"),
    "mnist_convnext": (samples.mnist_convnext(dims=(8, 16), depths=(1, 1), dropout=0.1), (28, 28, 1), "normal"),
    "mnist_cnn": (samples.mnist_cnn(channels=(4, 8), hidden=16, dropout=0.1), (28, 28, 1), "normal"),
    "mlp": (samples.mlp(hidden=(16, 8), activation="gelu", dropout=0.1), (28, 28, 1), "normal"),
    # BatchNorm, Dropout, attention and exact GELU in one model.
    "mnist_attention": (samples.mnist_attention(dim=8, num_heads=2), (28, 28, 1), "normal"),
    "mnist_segmenter": (samples.mnist_segmenter(channels=(4, 8)), (28, 28, 1), "normal"),
    # batch norm everywhere and a Residual with a projection shortcut (a strided 1x1 convolution)
    "cifar_resnet": (samples.cifar_resnet(depth=8, widths=(4, 8)), (8, 8, 3), "normal"),
    "causal_attention": (MultiHeadAttention(2, use_bias=False, causal=True), (6, 8), "normal"),
    "transformer_block": (TransformerBlock(2, mlp_ratio=2, dropout=0.1), (6, 8), "normal"),
    # int32 token ids in, logits per position out; the position slice and the tied head in every route.
    "char_transformer": (samples.char_transformer(vocab_size=11, context=8, dim=16, depth=2, num_heads=2), (8,), "ids"),
    # an encoder over token ids; called without a mask, every position is a token
    "text_transformer": (
        samples.text_transformer(vocab_size=11, num_classes=3, context=8, dim=8, depth=1, num_heads=2),
        (8,),
        "ids",
    ),
    # a model that declares mask: the padding mask as a second named input, zero on the padded positions
    "text_transformer_masked": (
        MaskInput(samples.text_transformer(vocab_size=11, num_classes=3, context=8, dim=8, depth=1, num_heads=2)),
        {"input": (8,), "mask": (8,)},
        "ids_mask",
    ),
    # named outputs (Heads): each a named output of the export, compared on its own
    "mnist_multitask": (samples.mnist_multitask(channels=(4, 8), hidden=16), (28, 28, 1), "normal"),
    # named inputs: one sample shape per input, each a named input of the export
    "image_and_features": (
        samples.image_and_features(num_classes=3, channels=(4,), hidden=8, width=8),
        {"image": IMAGE, "features": (5,)},
        "normal",
    ),
}

ROUTES = ("tflite", "tflite_dynamic", "onnx", "onnx_via_tflite", "onnx_via_tflite_dynamic", "jax")
DYNAMIC_ROUTES = {"tflite_dynamic", "onnx", "onnx_via_tflite_dynamic", "jax"}

# (case, route) pairs documented as unsupported (docs/export.md), each with its reason and the layer fix that
# removes it. strict=True: once a fix lands, the XPASS fails and the entry must go.
UNSUPPORTED: dict[tuple[str, str], str] = {}


@functools.cache
def setup(case):
    """(fn, the inputs at the fixed batch, input generator) for a case, with perturbed params and state."""
    module, sample, kind = CASES[case]
    dtype = jnp.int32 if kind == "ids" else jnp.float32
    spec = jax.tree.map(
        lambda shape: jax.ShapeDtypeStruct((FIXED, *shape), dtype), sample, is_leaf=lambda node: isinstance(node, tuple)
    )
    if kind == "ids_mask":  # int32 ids and a float32 mask
        spec = {**spec, "input": jax.ShapeDtypeStruct(spec["input"].shape, jnp.int32)}
    key = jax.random.PRNGKey(len(case))
    params, state = module.init(key, spec)
    # Away from unit scales, zero biases and (0, 1) batch statistics, so that every leaf matters; variances stay > 0.
    flat, tree = jax.tree_util.tree_flatten_with_path((params, state))
    leaves = []
    for i, (path, leaf) in enumerate(flat):
        noise = jax.random.normal(jax.random.fold_in(key, i), leaf.shape)
        shift = 0.0 if path[-1].key == "var" else 0.1 * noise
        leaves.append(leaf * jnp.exp(0.2 * noise) + shift if leaf.dtype == jnp.float32 else leaf)
    params, state = jax.tree_util.tree_unflatten(tree, leaves)

    def fn(x):
        return module(params, state, x, train=False)[0]

    def inputs(n, seed):
        rng = np.random.default_rng(seed)
        if kind == "ids":
            vocabulary = getattr(module, "num_embeddings", None) or module.vocab_size
            return rng.integers(0, vocabulary, (n, *sample)).astype(np.int32)
        if kind == "ids_mask":  # real tokens first, then padding holding any id
            (length,) = sample["input"]
            real = np.arange(length) < rng.integers(1, length + 1, (n, 1))
            ids = rng.integers(0, module.model.vocab_size, (n, length)).astype(np.int32)
            return {"input": ids, "mask": real.astype(np.float32)}
        return jax.tree.map(
            lambda shape: (rng.standard_normal((n, *shape)) * (3.0 if kind == "wide" else 1.0)).astype(np.float32),
            sample,
            is_leaf=lambda node: isinstance(node, tuple),
        )

    return fn, Inputs(spec, FIXED), inputs


@functools.cache
def outputs_of(case) -> Outputs:
    """The case's outputs: one ("output"), or a model's named outputs (a dict), each a named output of the file."""
    fn, inputs, _ = setup(case)
    return Outputs(jax.eval_shape(inputs.flat_fn(fn), *inputs.specs), "other", "output")


def flat_fn(case):
    fn, inputs, _ = setup(case)
    return outputs_of(case).flat_fn(inputs.flat_fn(fn))


def output_name(case):
    outputs = outputs_of(case)
    return "output" if outputs.single else outputs.names


@functools.cache
def tflite_bytes(case, dynamic):
    _, inputs, _ = setup(case)
    return export_tflite(
        flat_fn(case), inputs.specs, inputs.names, dynamic_batch=dynamic, output_name=output_name(case)
    )


def load(case, route):
    _, inputs, _ = setup(case)
    if route in ("tflite", "tflite_dynamic"):
        return TFLiteModel(tflite_bytes(case, route == "tflite_dynamic"))
    if route == "onnx":
        return OnnxModel(export_onnx(flat_fn(case), inputs.specs, inputs.names, output_name=output_name(case)))
    if route in ("onnx_via_tflite", "onnx_via_tflite_dynamic"):
        return OnnxModel(
            tflite_to_onnx(tflite_bytes(case, route.endswith("dynamic")), inputs.names, output_name=output_name(case))
        )
    names = None if outputs_of(case).single else outputs_of(case).names
    return JaxModel(export_jax(flat_fn(case), inputs.specs), inputs.names, names)


def params_for_matrix():
    for case in CASES:
        for route in ROUTES:
            reason = UNSUPPORTED.get((case, route))
            marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
            yield pytest.param(case, route, id=f"{case}-{route}", marks=marks)


@pytest.mark.parametrize("case, route", list(params_for_matrix()))
def test_export_matches_jax(case, route):
    fn, named, inputs = setup(case)
    runner = load(case, route)
    dynamic = route in DYNAMIC_ROUTES
    given = {i["name"]: i for i in runner.inputs}
    assert sorted(given) == sorted(named.names)
    for name, spec in zip(named.names, named.specs):
        assert given[name]["shape"] == ((None,) if dynamic else (FIXED,)) + spec.shape[1:]
        assert given[name]["dtype"] == np.dtype(spec.dtype)
    outputs = outputs_of(case)
    if not outputs.single:  # each named output under its name, in every route
        assert sorted(o["name"] for o in runner.outputs) == outputs.names
    for n in DYNAMIC if dynamic else (FIXED,):
        x = inputs(n, seed=n)
        wants = [np.asarray(w) for w in outputs.flat(jax.jit(fn)(x))]
        for name, got, want in zip(outputs.names, outputs.of(runner(x)), wants):
            assert got.shape == want.shape, name
            assert np.isfinite(got[np.isfinite(want)]).all(), f"non-finite outputs {name} at batch {n}"
            np.testing.assert_allclose(
                got, want, atol=ATOL, rtol=RTOL, err_msg=f"{case} via {route}, output {name}, batch {n}"
            )


# Layer classes or sample models the coverage tests accept outside CASES, each with the reason it cannot be a case.
# Empty: everything a config can reach is exported by every route above.
NOT_IN_MATRIX: dict[str, str] = {}


def test_every_layer_is_in_the_matrix():
    """A layer class added to model/modules, or defined in model/model.py, must be in CASES (on its own or inside a
    case's tree) or in NOT_IN_MATRIX with a reason."""
    import importlib
    import inspect
    import pkgutil

    import model.modules as modules
    from model.modules.module import Module

    covered = set()
    for m, _, _ in CASES.values():  # layers inside Sequential/Residual cases count as covered too
        stack = [m]
        while stack:
            layer = stack.pop()
            covered.add(type(layer).__name__)
            stack += list(layer.children().values()) + ([layer.body] if isinstance(layer, Residual) else [])
    files = [importlib.import_module(f"model.modules.{info.name}") for info in pkgutil.iter_modules(modules.__path__)]
    layers = {
        name
        for file in (*files, samples)
        for name, obj in vars(file).items()
        if inspect.isclass(obj) and issubclass(obj, Module) and obj.__module__ == file.__name__
    }
    missing = layers - covered - set(NOT_IN_MATRIX) - {"Module"}
    assert not missing, f"layers not in the export matrix (add a case, or a reason to NOT_IN_MATRIX): {sorted(missing)}"


def test_every_sample_model_is_in_the_matrix():
    """A model a config can name (registered in model/model.py) must be a case of its own, under its own name, or in
    NOT_IN_MATRIX with a reason."""
    missing = set(available("model")) - set(CASES) - set(NOT_IN_MATRIX)
    assert not missing, (
        f"sample models not in the export matrix (add a case, or a reason to NOT_IN_MATRIX): {sorted(missing)}"
    )
    assert all(reason.strip() for reason in NOT_IN_MATRIX.values()), "every NOT_IN_MATRIX entry needs its reason"


# Quantized weights change the outputs by design: each is held to its own bound on max |diff| / max |JAX output|.
QUANTIZED_BOUNDS = {"float16": 1e-2, "dynamic-int8": 1e-1}


@pytest.mark.parametrize("quantize", QUANTIZED_BOUNDS)
def test_quantized_tflite_is_smaller_and_close(quantize):
    fn, named, inputs = setup("mnist_cnn")
    model = export_tflite(named.flat_fn(fn), named.specs, named.names, quantize=quantize, output_name="output")
    runner = TFLiteModel(model)
    assert len(model) < len(tflite_bytes("mnist_cnn", False))
    assert runner.names() == named.names and runner.output_name == "output"
    x = inputs(FIXED, seed=0)
    want, got = np.asarray(jax.jit(fn)(x)), runner(x)
    assert np.isfinite(got).all()
    assert np.abs(got - want).max() <= QUANTIZED_BOUNDS[quantize] * np.abs(want).max()
