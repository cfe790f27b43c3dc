"""Every layer and sample model that declares an export example, exported by every route, equals the JAX model.

The cases come from the components themselves: a layer class's ``export_examples()`` beside it in model/modules, a
model's ``@register("model", example=...)`` in model/model.py; a component declaring none is not in the matrix.

Routes here: ONNX by jax2onnx with a symbolic batch (run in onnxruntime) and jax.export (deserialised and called);
TFLite's (a fixed and a dynamic batch in LiteRT, and ONNX by tf2onnx from each .tflite) are checked the same way in
tests/inference/tflite/, which goes with its folder. Fixed-batch artifacts run at their batch size, dynamic ones at 1 and a larger size; the check is numpy's allclose at atol = rtol = 1e-4 with
finite outputs wherever JAX's are finite. Parameters are perturbed away from their initial values (unit scales,
zero biases) so that every parameter matters.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from inference.formats.jax_export import JaxModel, export_jax
from inference.formats.onnx_export import export_onnx
from inference.inputs import Inputs, Outputs
from inference.predict import OnnxModel
from model import model as samples
from model.modules.module import Lambda, Module
from model.registry import entries
from training.config.components import layers


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


def declared_cases():
    """The cases each component declares beside itself: a layer class's own ``export_examples()`` (model/modules)
    and a registered model's ``example=`` (model/registry.py). A layer or model declaring none is not here."""
    declared = [cls.export_examples() for cls in layers().values() if "export_examples" in vars(cls)]  # its own
    declared += [
        {name: (entry.fn(**entry.example[0]), *entry.example[1:])}
        for name, entry in entries("model").items()
        if entry.example is not None
    ]
    cases = {}
    for each in declared:
        twice = set(cases) & set(each)
        assert not twice, f"export cases declared twice (each case name once): {sorted(twice)}"
        cases.update(each)
    return cases


# name: (module, sample shape, input kind: "normal", "wide" (3x the spread, for activation tails), "ids" or
# "ids_mask"): the declared cases, and those that only make sense here (probes of the export's workarounds).
CASES = {
    **declared_cases(),
    # A batched matmul: with a dynamic batch, TFLite computes its reshape targets with UnsortedSegmentProd.
    "batched_matmul": (Lambda(lambda x: x @ jnp.swapaxes(x, 1, 2)), (4, 6), "normal"),
    # The pattern behind tf2onnx's NaNs: the branch not taken is -inf for x <= 0.
    "where_inf_branch": (Lambda(lambda x: jnp.where(x > 0, jnp.log(jnp.abs(x)), 0.0)), (4, 6), "wide"),
    # a model that declares mask: the padding mask as a second named input, zero on the padded positions
    "text_transformer_masked": (
        MaskInput(samples.text_transformer(vocab_size=11, num_classes=3, context=8, dim=8, depth=1, num_heads=2)),
        {"input": (8,), "mask": (8,)},
        "ids_mask",
    ),
}

ROUTES = ("onnx", "jax")  # both with a symbolic batch

# (case, route) pairs documented as unsupported (docs/export.md), each with its reason and the layer fix that
# removes it. strict=True: once a fix lands, the XPASS fails and the entry must go.
UNSUPPORTED: dict[tuple[str, str], str] = {}


def vocabulary(module) -> int:
    """The token ids an "ids" case draws from: the size of the first embedding table (or ``vocab_size``) found in
    the module's tree, so that a model built of layers (a Sequential) needs no attribute of its own."""
    queue = [module]
    while queue:
        node = queue.pop(0)
        for name in ("num_embeddings", "vocab_size"):
            if isinstance(getattr(node, name, None), int):
                return getattr(node, name)
        for value in vars(node).values():  # submodules: attributes, or lists or dicts of them (a Sequential's)
            values = (
                value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else [value]
            )
            queue += [v for v in values if isinstance(v, Module)]
    raise ValueError(f"an 'ids' case needs an embedding in its module: {type(module).__name__} has none")


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
            return rng.integers(0, vocabulary(module), (n, *sample)).astype(np.int32)
        if kind == "ids_mask":  # real tokens first, then padding holding any id
            (length,) = sample["input"]
            real = np.arange(length) < rng.integers(1, length + 1, (n, 1))
            ids = rng.integers(0, vocabulary(module), (n, length)).astype(np.int32)
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


def load(case, route):
    _, inputs, _ = setup(case)
    if route == "onnx":
        return OnnxModel(export_onnx(flat_fn(case), inputs.specs, inputs.names, output_name=output_name(case)))
    names = None if outputs_of(case).single else outputs_of(case).names
    return JaxModel(export_jax(flat_fn(case), inputs.specs), inputs.names, names)


def params_for_matrix(routes=ROUTES):
    for case in CASES:
        for route in routes:
            reason = UNSUPPORTED.get((case, route))
            marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
            yield pytest.param(case, route, id=f"{case}-{route}", marks=marks)


@pytest.mark.parametrize("case, route", list(params_for_matrix()))
def test_export_matches_jax(case, route):
    check_matches(case, route, load(case, route), dynamic=True)


def check_matches(case, route, runner, dynamic: bool):
    """The runner of `case` by `route` equals the JAX model: at batch FIXED, or where dynamic at each of DYNAMIC."""
    fn, named, inputs = setup(case)
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
