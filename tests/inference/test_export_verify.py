"""inference/verify.py against numpy's isclose, and inference/predict.py's batching, on random data."""

from __future__ import annotations

import numpy as np
import pytest

from inference import verify
from inference.predict import run_batched, softmax


@pytest.mark.parametrize("seed", range(5))
def test_compare_agrees_with_numpy_isclose(seed):
    rng = np.random.default_rng(seed)
    want = rng.standard_normal((6, 10)) * 10.0 ** rng.integers(-6, 3, (6, 10))
    got = want + rng.standard_normal(want.shape) * 10.0 ** rng.integers(-9, -2, want.shape)
    atol, rtol = 10.0 ** rng.uniform(-6, -3), 10.0 ** rng.uniform(-6, -3)
    result = verify.compare(got, want, atol, rtol)
    close = np.isclose(got, want, atol=atol, rtol=rtol)
    assert result.ok == bool(close.all())
    assert result.max_abs_diff == pytest.approx(np.abs(got - want).max())
    assert result.max_rel_diff == pytest.approx(np.abs(got - want).max() / np.abs(want).max())
    if not result.ok:
        excess = np.where(~close, np.abs(got - want) - rtol * np.abs(want), -np.inf)
        row, col = np.unravel_index(np.argmax(excess), want.shape)
        assert f"worst at example {row}, index [{col}]" in result.failure
        assert f"{int((~close).sum())} of 60 values" in result.failure


def test_compare_fails_on_nan_shape_and_passes_nonfinite_reference():
    want = np.ones((2, 3))
    got = want.copy()
    got[1, 2] = np.nan
    result = verify.compare(got, want)
    assert not result.ok and "example 1, index [2]" in result.failure and result.max_abs_diff == np.inf
    assert not verify.compare(np.ones((2, 4)), want).ok
    want[0, 0] = got[0, 0] = np.inf  # JAX itself gives inf there: nothing to match
    got[1, 2] = 1.0
    assert verify.compare(got, want).ok


def test_merge_keeps_worst_figures_and_first_failure():
    a = verify.Comparison(1e-6, 1e-5, True)
    b = verify.Comparison(2e-3, 1e-7, False, "b failed")
    c = verify.Comparison(1e-5, 1e-3, False, "c failed")
    merged = verify.merge([a, b, c])
    assert (merged.max_abs_diff, merged.max_rel_diff, merged.ok, merged.failure) == (2e-3, 1e-3, False, "b failed")


def test_agreement_and_quality_follow_the_task():
    from inference.exporter import agreement, quality

    logits = np.array([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]])
    assert quality("classification", logits, np.array([1, 1, 1]), np.ones(3)) == pytest.approx(2 / 3)
    assert agreement("classification", logits, logits[:, ::-1]) == 0.0
    # a class per position: only unmasked positions count
    got, want = np.zeros((2, 3, 4)), np.zeros((2, 3, 4))
    got[..., 1], want[..., 1] = 1.0, 1.0
    got[1, 2, 3] = 5.0  # differs at one position, which is masked
    mask = np.array([[1, 1, 1], [1, 1, 0]], np.float32)
    assert agreement("sequence", got, want, mask) == 1.0 and agreement("sequence", got, want) == pytest.approx(5 / 6)
    assert quality("sequence", want, np.ones((2, 3), int), mask) == 1.0
    # multi-label: the sign of each logit; regression: no agreement or quality at all
    assert agreement("multilabel", np.array([[1.0, -2.0]]), np.array([[0.5, 3.0]])) == 0.5
    assert quality("multilabel", np.array([[1.0, -2.0]]), np.array([[1.0, 0.0]]), np.ones(1)) == 1.0
    assert agreement("regression", logits, logits) is None and quality("regression", logits, logits, None) is None


class FixedBatch:
    """A model that only accepts batches of 4 and records what it was given."""

    inputs = [{"name": "input", "shape": (4, 3)}]

    def __init__(self):
        self.calls = []

    def __call__(self, x):
        assert x.shape == (4, 3)
        self.calls.append(x.copy())
        return x * 2.0


def test_run_batched_pads_fixed_batches_and_drops_the_padding():
    x = np.random.default_rng(0).standard_normal((10, 3))
    model = FixedBatch()
    np.testing.assert_array_equal(run_batched(model, x), x * 2.0)
    assert len(model.calls) == 3 and not model.calls[-1][2:].any()  # last chunk: 2 rows, then zero padding

    class Dynamic:
        inputs = [{"name": "input", "shape": (None, 3)}]

        def __call__(self, x):
            return x + 1.0

    np.testing.assert_array_equal(run_batched(Dynamic(), x, batch_size=3), x + 1.0)


def test_softmax_matches_scipy():
    from scipy.special import softmax as reference

    z = np.random.default_rng(1).standard_normal((4, 7)) * 30
    np.testing.assert_allclose(softmax(z), reference(z, axis=-1), rtol=1e-12, atol=1e-300)


def test_random_ids_stay_below_the_vocabulary_or_the_largest_id_seen():
    import jax

    from inference.exporter import id_bounds
    from inference.inputs import Inputs, random_inputs

    spec = {"ids": jax.ShapeDtypeStruct((4, 7), np.int32), "image": jax.ShapeDtypeStruct((4, 3, 3, 1), np.float32)}
    inputs = Inputs(spec, 2)
    assert inputs.names == ["ids", "image"] and [s.shape for s in inputs.specs] == [(2, 7), (2, 3, 3, 1)]
    seen = [np.array([[0, 5, 2]]), np.zeros((1, 3, 3, 1), np.float32)]
    assert id_bounds(inputs, seen, {}) == {"ids": 6}  # floats have no bound
    assert id_bounds(inputs, seen, {"vocabulary": "abc"}) == {"ids": 3}
    assert id_bounds(inputs, None, {}) == {}
    ids, image = random_inputs(inputs, 500, np.random.default_rng(0), {"ids": 6})
    assert ids.dtype == np.int32 and ids.shape == (500, 7) and set(np.unique(ids)) == set(range(6))
    assert image.dtype == np.float32 and image.shape == (500, 3, 3, 1)


def test_runners_take_one_array_or_named_arrays():
    import jax

    from inference.formats.jax_export import JaxModel, export_jax

    def fn(features, ids):
        return features * 2.0 + ids.astype(np.float32)

    specs = [jax.ShapeDtypeStruct((1, 3), np.float32), jax.ShapeDtypeStruct((1, 3), np.int32)]
    model = JaxModel(export_jax(fn, specs), ["features", "ids"])
    assert [(i["name"], i["shape"], i["dtype"]) for i in model.inputs] == [
        ("features", (None, 3), np.float32),
        ("ids", (None, 3), np.int32),
    ]
    x = {"ids": np.arange(6).reshape(2, 3), "features": np.ones((2, 3))}  # any order; cast to the inputs' dtypes
    np.testing.assert_array_equal(model(x), 2.0 + np.arange(6).reshape(2, 3))
    with pytest.raises(ValueError, match=r"missing inputs \['ids'\]"):
        model({"features": x["features"]})
    with pytest.raises(ValueError, match="takes 2 named inputs"):
        model(x["features"])
    with pytest.raises(ValueError, match="1 input names"):
        JaxModel(export_jax(fn, specs), ["features"])
