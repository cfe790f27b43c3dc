"""data_loader/augment/pipeline.py, ops.py and mixing.py: each op against a numpy reference written per example (same
drawn parameters), the draws themselves, determinism for a key, per-example keys, evaluation mode, the config checks,
mixup/cutmix with the loss and metrics, and the preprocessing that predict.py repeats."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from data_loader.augment import mixing
from data_loader.augment import pipeline as aug
from data_loader.augment.ops import Pixels
from data_loader.augment.pipeline import Augment
from training.config.file import ConfigError
from training.config.validation import build_augment

B, H, W, C = 6, 9, 7, 3  # H != W catches a swapped axis
CLASSES = 5
rng = np.random.default_rng(0)
ROOT = Path(__file__).resolve().parents[2]


def images(dtype=np.uint8, shape=(B, H, W, C)):
    if dtype == np.uint8:
        return rng.integers(0, 256, shape).astype(np.uint8)
    return rng.uniform(0, 255, shape).astype(dtype)


def batch_of(x, target=None):
    target = rng.integers(0, CLASSES, len(x)).astype(np.int32) if target is None else target
    return {"input": x, "target": target, "mask": np.ones(len(x), np.float32)}


def draw(op, batch, seed=0):
    """The op's per-example parameters, from per-example keys, as numpy arrays (one jitted call: one compile)."""

    def run(key, batch):
        return op.draw(aug.uniforms(key, len(batch["input"]), op.uniforms), batch)

    return jax.device_get(jax.jit(run)(jax.random.PRNGKey(seed), batch))


def applied(op, batch, params, max_value=255.0, outputs=None):
    run = jax.jit(lambda batch, params: op.apply(batch, params, Pixels(max_value, outputs)))
    return jax.device_get(run(batch, params))


OUTPUTS = jax.ShapeDtypeStruct((B, CLASSES), jnp.float32)


# ------------------------------------------------------------------------------------------- numpy references
def ref_crop(x, top, left, p, mode, value):
    out = np.empty_like(x)
    for b in range(len(x)):
        kwargs = {"constant_values": value} if mode == "constant" else {}
        padded = np.pad(
            x[b],
            ((p, p), (p, p), (0, 0)),
            mode={"edge": "edge", "reflect": "reflect", "constant": "constant"}[mode],
            **kwargs,
        )
        out[b] = padded[top[b] : top[b] + x.shape[1], left[b] : left[b] + x.shape[2]]
    return out


def ref_bilinear_crop(x, top, left, height, width):
    """Per output pixel: the source point at the pixel centre's image in the box, bilinear from its 4 neighbours."""
    n, h, w, c = x.shape
    out = np.zeros((n, h, w, c), np.float64)
    for b in range(n):
        for i in range(h):
            sy = min(max(top[b] + (i + 0.5) * height[b] / h - 0.5, 0.0), h - 1.0)
            y0 = int(np.floor(sy))
            y1, fy = min(y0 + 1, h - 1), sy - y0
            for j in range(w):
                sx = min(max(left[b] + (j + 0.5) * width[b] / w - 0.5, 0.0), w - 1.0)
                x0 = int(np.floor(sx))
                x1, fx = min(x0 + 1, w - 1), sx - x0
                img = x[b].astype(np.float64)
                out[b, i, j] = (1 - fy) * ((1 - fx) * img[y0, x0] + fx * img[y0, x1]) + fy * (
                    (1 - fx) * img[y1, x0] + fx * img[y1, x1]
                )
    return out


def ref_gray(img):
    return (
        img[..., :1]
        if img.shape[-1] == 1
        else (0.299 * img[..., 0] + 0.587 * img[..., 1] + 0.114 * img[..., 2])[..., None]
    )


def ref_jitter(x, factor, kind, max_value):
    out = np.empty(x.shape, np.float64)
    for b in range(len(x)):
        img, f = x[b].astype(np.float64), factor[b]
        if kind == "brightness":
            y = img * f
        elif kind == "contrast":
            m = ref_gray(img).mean()
            y = f * img + (1 - f) * m
        else:
            g = ref_gray(img)
            y = f * img + (1 - f) * g
        out[b] = y if max_value is None else np.clip(y, 0, max_value)
    return out


def ref_erase(x, erase, top, left, height, width, value):
    out = x.copy()
    for b in range(len(x)):
        if erase[b]:
            out[b, top[b] : top[b] + height[b], left[b] : left[b] + width[b], :] = value
    return out


# ---------------------------------------------------------------------------------------------------- the ops
@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
def test_random_crop_matches_numpy(mode):
    x = images()
    op = aug.random_crop(padding=3, padding_mode=mode, value=7)
    batch = batch_of(x)
    params = draw(op, batch)
    assert params["top"].min() >= 0 and params["top"].max() <= 6 and params["left"].max() <= 6
    got = applied(op, batch, params)["input"]
    assert got.dtype == np.uint8
    np.testing.assert_array_equal(got, ref_crop(x, params["top"], params["left"], 3, mode, 7))


def test_crop_offsets_cover_every_shift():
    op = aug.random_crop(padding=2)
    u = rng.random((400, op.uniforms), np.float32)
    params = jax.device_get(op.draw(jnp.asarray(u), {"input": jax.ShapeDtypeStruct((400, 4, 4, 1), jnp.uint8)}))
    assert set(params["top"]) == set(range(5)) and set(params["left"]) == set(range(5))


def test_random_resized_crop_matches_numpy():
    x = images(np.float32)
    op = aug.random_resized_crop(scale=[0.2, 1.0], ratio=[0.5, 2.0])
    batch = batch_of(x)
    params = draw(op, batch)
    area = params["height"] * params["width"]
    assert np.all(params["height"] <= H) and np.all(params["width"] <= W) and np.all(area <= H * W + 1e-3)
    assert np.all(params["top"] >= 0) and np.all(params["top"] + params["height"] <= H + 1e-4)
    assert np.all(params["left"] >= 0) and np.all(params["left"] + params["width"] <= W + 1e-4)
    got = applied(op, batch, params)["input"]
    assert got.dtype == np.float32
    np.testing.assert_allclose(
        got,
        ref_bilinear_crop(x, params["top"], params["left"], params["height"], params["width"]),
        rtol=1e-5,
        atol=1e-3,
    )
    # the whole image as the box is the image itself
    whole = {"top": np.zeros(B), "left": np.zeros(B), "height": np.full(B, float(H)), "width": np.full(B, float(W))}
    np.testing.assert_allclose(applied(op, batch, whole)["input"], x, atol=1e-3)


@pytest.mark.parametrize("name, axis", [("flip_horizontal", 2), ("flip_vertical", 1)])
def test_flips_match_numpy(name, axis):
    x = images()
    op = getattr(aug, name)(p=0.5)
    batch = batch_of(images(shape=(B, H, W, C)))
    batch["input"] = x
    params = draw(op, batch, seed=3)
    got = applied(op, batch, params)["input"]
    for b in range(B):
        np.testing.assert_array_equal(got[b], np.flip(x[b], axis - 1) if params["flip"][b] else x[b])
    assert 0 < params["flip"].sum() < B


@pytest.mark.parametrize(
    "kind, dtype",
    [("brightness", np.float32), ("brightness", np.uint8), ("contrast", np.uint8), ("saturation", np.uint8)],
)
def test_color_jitter_matches_numpy(kind, dtype):
    x = images(dtype)
    op = getattr(aug, kind)(strength=0.8)
    batch = batch_of(x)
    params = draw(op, batch)
    assert params["factor"].min() >= 0.2 - 1e-6 and params["factor"].max() <= 1.8 + 1e-6
    max_value = 255.0 if dtype == np.uint8 else None
    got = applied(op, batch, params, max_value)["input"]
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, ref_jitter(x, params["factor"], kind, max_value), rtol=1e-5, atol=1e-3)
    if dtype == np.uint8:
        assert got.min() >= 0 and got.max() <= 255


def test_contrast_of_gray_images_and_saturation_needs_rgb():
    x = images(shape=(B, H, W, 1))
    op = aug.contrast(0.5)
    batch = batch_of(x)
    params = draw(op, batch)
    np.testing.assert_allclose(
        applied(op, batch, params)["input"], ref_jitter(x, params["factor"], "contrast", 255), rtol=1e-5, atol=1e-3
    )
    augment = Augment([aug.saturation(0.5)], "config.json: data_loader.train.augment")
    with pytest.raises(ValueError, match=r"augment\.0: saturation needs RGB images \(3 channels\), the input has 1"):
        augment(batch, jax.random.PRNGKey(0), train=True)


def test_random_erasing_matches_numpy():
    dtype = np.uint8
    x = images(dtype)
    op = aug.random_erasing(p=0.7, scale=[0.1, 0.4], ratio=[0.5, 2.0], value=3)
    batch = batch_of(x)
    params = draw(op, batch, seed=5)
    assert np.all(params["top"] + params["height"] <= H) and np.all(params["left"] + params["width"] <= W)
    assert params["erase"].any()
    got = applied(op, batch, params)["input"]
    assert got.dtype == dtype
    expected = ref_erase(x, params["erase"], params["top"], params["left"], params["height"], params["width"], 3)
    np.testing.assert_array_equal(got, expected)
    u = rng.random((500, op.uniforms), np.float32)
    areas = jax.device_get(op.draw(jnp.asarray(u), {"input": jax.ShapeDtypeStruct((500, 20, 20, 1), jnp.uint8)}))
    share = (areas["height"] * areas["width"]) / 400
    assert 0.05 < share.min() and share.max() < 0.5


def test_mixup_matches_numpy_and_its_targets_are_soft():
    x = images(np.float32)
    batch = batch_of(x)
    op = aug.mixup(alpha=0.4)
    params = draw(op, batch)
    lam = params["lam"]
    assert np.all((0 <= lam) & (lam <= 1)) and len(set(lam.round(6))) == B  # a lam per example
    got = applied(op, batch, params, outputs=OUTPUTS)
    one_hot = np.eye(CLASSES)[batch["target"]]
    for b in range(B):
        partner = B - 1 - b
        np.testing.assert_allclose(got["input"][b], lam[b] * x[b] + (1 - lam[b]) * x[partner], rtol=1e-5, atol=1e-3)
        np.testing.assert_allclose(got["target"][b], lam[b] * one_hot[b] + (1 - lam[b]) * one_hot[partner], atol=1e-6)
    np.testing.assert_allclose(got["target"].sum(axis=1), 1.0, atol=1e-6)
    off = draw(aug.mixup(alpha=0.4, p=0.0), batch)["lam"]
    np.testing.assert_array_equal(off, 1.0)


def test_beta_and_gamma_draws_follow_their_distributions():
    """The loop-free Marsaglia-Tsang sampler against scipy's distributions (Kolmogorov-Smirnov, fixed seed); log
    gamma for small alphas, whose Beta draws sit closer to 0 and 1 than float32 resolves."""
    from scipy import stats

    u = jax.random.uniform(jax.random.PRNGKey(1), (20000, mixing.BETA_UNIFORMS))
    alphas = (0.2, 2.0)  # the boosted shape (alpha < 1) and the plain one
    draws = jax.device_get(
        jax.jit(
            lambda u: [
                (mixing._log_gamma(u[:, : mixing.BETA_UNIFORMS // 2], a), mixing.beta_from_uniform(u, a))
                for a in alphas
            ]
        )(u)
    )
    for alpha, (log_gamma, lam) in zip(alphas, draws):
        assert stats.kstest(log_gamma.astype(np.float64), stats.loggamma(alpha).cdf).pvalue > 0.01, alpha
        if alpha < 0.4:  # Beta(0.2, 0.2) puts mass closer to 1 than float32 resolves: its log gamma draws tell
            continue
        lam = lam.astype(np.float64)
        assert np.all((lam >= 0) & (lam <= 1)) and stats.kstest(lam, stats.beta(alpha, alpha).cdf).pvalue > 0.01
        assert abs(lam.var() - 1 / (4 * (2 * alpha + 1))) < 0.005


def test_cutmix_matches_numpy():
    x = images()
    batch = batch_of(x)
    op = aug.cutmix(alpha=1.0)
    params = draw(op, batch, seed=2)
    got = applied(op, batch, params, outputs=OUTPUTS)
    assert got["input"].dtype == np.uint8
    one_hot = np.eye(CLASSES)[batch["target"]]
    for b in range(B):
        partner = B - 1 - b
        top, bottom, left, right = (int(params[k][b]) for k in ("top", "bottom", "left", "right"))
        expected = x[b].copy()
        expected[top:bottom, left:right] = x[partner, top:bottom, left:right]
        np.testing.assert_array_equal(got["input"][b], expected)
        kept = 1 - (bottom - top) * (right - left) / (H * W)
        np.testing.assert_allclose(params["lam"][b], kept, atol=1e-6)
        np.testing.assert_allclose(got["target"][b], kept * one_hot[b] + (1 - kept) * one_hot[partner], atol=1e-6)


def test_normalize_matches_numpy_and_applies_in_evaluation():
    x = images()
    mean, std = [0.4, 0.5, 0.6], [0.2, 0.25, 0.3]
    augment = Augment([aug.normalize(mean=mean, std=std)])
    expected = (x / 255.0 - np.array(mean)) / np.array(std)
    for train, key in ((False, None), (True, jax.random.PRNGKey(0))):
        got = np.asarray(augment(batch_of(x), key, train=train)["input"])
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    floats = images(np.float32) / 255.0
    got = np.asarray(Augment([aug.normalize(mean=0.5, std=0.5)])(batch_of(floats), None, train=False)["input"])
    np.testing.assert_allclose(got, (floats - 0.5) / 0.5, rtol=1e-5, atol=1e-5)  # float pixels: scale 1
    scaled = Augment([aug.normalize(scale=2.0)])(batch_of(floats), None, train=False)["input"]
    np.testing.assert_allclose(np.asarray(scaled), floats * 2.0, rtol=1e-6)


# ----------------------------------------------------------------------------------------- the list as a whole
PIPELINE = [
    {"name": "random_crop", "args": {"padding": 2}},
    {"name": "flip_horizontal"},
    {"name": "random_resized_crop", "args": {"scale": [0.5, 1.0]}},
    {"name": "brightness"},
    {"name": "contrast"},
    {"name": "saturation"},
    {"name": "random_erasing"},
    {"name": "normalize", "args": {"mean": [0.5, 0.4, 0.3], "std": [0.2, 0.2, 0.2]}},
    {"name": "mixup"},
    {"name": "cutmix", "args": {"p": 0.5}},
]


def config_with(ops, split="train"):
    return {
        "name": "t",
        "model": {"name": "mlp"},
        "loss": {"name": "cross_entropy"},
        "trainer": {"monitor": "off"},
        "optimizer": {"name": "sgd", "args": {"lr": 0.1}},
        "data_loader": {
            split: {"name": "mnist", "augment": ops},
            **({"train": {"name": "mnist"}} if split != "train" else {}),
        },
    }


def test_whole_list_is_deterministic_per_key_and_per_example():
    augment = build_augment(config_with(PIPELINE[:8]))
    batch = batch_of(images())
    run = jax.jit(lambda b, k: augment(b, k, train=True, outputs=None))
    key = jax.random.PRNGKey(42)
    first, again = run(batch, key), run(batch, key)
    other = run(batch, jax.random.PRNGKey(43))
    np.testing.assert_array_equal(np.asarray(first["input"]), np.asarray(again["input"]))
    assert not np.array_equal(np.asarray(first["input"]), np.asarray(other["input"]))
    # an example's draws come from its index alone: the first 3 of a batch of 6 equal a batch of those 3
    half = jax.tree.map(lambda a: a[:3], batch)
    small = run(half, key)
    np.testing.assert_allclose(np.asarray(small["input"]), np.asarray(first["input"])[:3], rtol=1e-6, atol=1e-5)


def test_evaluation_is_identity_but_for_conversion_and_normalisation():
    augment = build_augment(config_with(PIPELINE))
    batch = batch_of(images())
    evaluated = augment(batch, None, train=False, outputs=OUTPUTS)
    trained = jax.jit(lambda b, k: augment(b, k, train=True, outputs=OUTPUTS))(batch, jax.random.PRNGKey(0))
    expected = (batch["input"] / 255.0 - np.array([0.5, 0.4, 0.3])) / 0.2
    np.testing.assert_allclose(np.asarray(evaluated["input"]), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(evaluated["target"]), batch["target"])  # ids stay ids
    assert evaluated["input"].dtype == trained["input"].dtype == jnp.float32
    assert trained["target"].shape == (B, CLASSES) and trained["target"].dtype == jnp.float32
    spec = augment.spec(jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), batch))
    assert spec["input"].dtype == jnp.float32 and spec["target"].dtype == jnp.int32
    # colour ops before normalize convert to float in evaluation too: the model sees one dtype
    plain = Augment([aug.brightness(0.3)])(batch, None, train=False)
    assert plain["input"].dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(plain["input"]), batch["input"].astype(np.float32))
    with pytest.raises(ValueError, match="training needs the step's key"):
        augment(batch, None, train=True)


@pytest.mark.slow
def test_runs_sharded_over_devices():
    """Under batch sharding (4 CPU devices, a fresh interpreter) the result equals one device's."""
    code = """
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from tests.data_loader.test_augment import PIPELINE, config_with
from training.config.validation import build_augment
assert len(jax.devices()) == 4
augment = build_augment(config_with([PIPELINE[i] for i in (0, 1, 6, 7, 8)]))  # a gather, a flip, masks, the partner
rng = np.random.default_rng(1)
batch = {"input": rng.integers(0, 256, (8, 9, 7, 3)).astype(np.uint8),
         "target": rng.integers(0, 5, 8).astype(np.int32), "mask": np.ones(8, np.float32)}
outputs = jax.ShapeDtypeStruct((8, 5), jnp.float32)
run = jax.jit(lambda b, k: augment(b, k, train=True, outputs=outputs))
key = jax.random.PRNGKey(7)
single = jax.device_get(run(batch, key))
sharding = NamedSharding(Mesh(np.array(jax.devices()), ("data",)), P("data"))
sharded = jax.device_get(run(jax.device_put(batch, sharding), key))
for name in single:
    np.testing.assert_allclose(sharded[name], single[name], rtol=1e-6, atol=1e-5)
print("ok")
"""
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={
            "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
            "JAX_PLATFORMS": "cpu",
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": str(ROOT),
        },
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


# ------------------------------------------------------------------------------------------- mixup and training
def test_soft_targets_with_the_loss_and_metrics():
    """cross_entropy takes mixup's soft targets; accuracy, top-k and the confusion matrix count a soft target as
    its largest class (numpy reference)."""
    from training import losses, metrics

    augment = build_augment(config_with([{"name": "mixup", "args": {"alpha": 0.4}}]))
    batch = batch_of(images(np.float32))
    logits = jnp.asarray(rng.standard_normal((B, CLASSES)), jnp.float32)

    def run(batch, logits):
        target = augment(batch, jax.random.PRNGKey(0), train=True, outputs=OUTPUTS)["target"]
        return (
            target,
            losses.cross_entropy(logits, target),
            metrics.compute(metrics.accuracy(), logits, target),
            metrics.compute(metrics.confusion_matrix(), logits, target),
        )

    target, loss, accuracy, matrix = jax.device_get(jax.jit(run)(batch, logits))
    soft = target.astype(np.float64)
    log_probs = np.asarray(logits, np.float64) - np.log(np.exp(np.asarray(logits, np.float64)).sum(1, keepdims=True))
    np.testing.assert_allclose(loss, -(soft * log_probs).sum(1), rtol=1e-5)
    dominant = soft.argmax(1)
    predicted = np.asarray(logits).argmax(1)
    assert float(accuracy) == pytest.approx((dominant == predicted).mean())
    expected = np.zeros((CLASSES, CLASSES))
    np.add.at(expected, (dominant, predicted), 1)
    np.testing.assert_array_equal(matrix, expected)


def test_mixup_refuses_targets_it_cannot_mix():
    augment = Augment([aug.mixup()], "cfg.json: data_loader.train.augment")
    batch = batch_of(images(np.float32), target=np.zeros((B, 4), np.int32))
    with pytest.raises(ValueError, match=r"augment\.0: mixup mixes class labels"):
        augment(batch, jax.random.PRNGKey(0), train=True, outputs=OUTPUTS)
    with pytest.raises(ValueError, match="needs the model's class count"):
        augment(batch_of(images(np.float32)), jax.random.PRNGKey(0), train=True, outputs=None)


# ---------------------------------------------------------------------------------------------- config checks
@pytest.mark.parametrize(
    "ops, message",
    [
        (
            [{"name": "flip_horizntal"}],
            "augment.0.name: unknown augment 'flip_horizntal'; available: brightness, "
            "contrast, cutmix, flip_horizontal, flip_vertical, mixup, normalize, random_crop, "
            "random_erasing, random_resized_crop, saturation. Did you mean 'flip_horizontal'?",
        ),
        (
            [{"name": "random_crop", "args": {"pading": 4}}],
            "augment.0.args.pading: unknown argument. Did you mean 'padding'? Accepted: random_crop(padding",
        ),
        ([{"name": "random_crop", "args": {"padding": -1}}], "augment.0.args.padding: must be an integer >= 0"),
        (
            [{"name": "random_crop", "args": {"padding_mode": "wrap"}}],
            "padding_mode: expected one of constant, reflect",
        ),
        (
            [{"name": "flip_horizontal", "args": {"p": 1.5}}],
            "augment.0.args.p: must be a number >= 0 and <= 1, got 1.5",
        ),
        ([{"name": "flip_vertical", "args": {"p": "often"}}], "augment.0.args.p: expected float"),
        ([{"name": "random_resized_crop", "args": {"scale": [0.9, 0.1]}}], "args.scale: min 0.9 is above max 0.1"),
        ([{"name": "random_resized_crop", "args": {"ratio": [0, 1]}}], "args.ratio.0: must be a number > 0"),
        ([{"name": "brightness", "args": {"strength": -0.1}}], "augment.0.args.strength: must be a number >= 0"),
        ([{"name": "mixup", "args": {"alpha": 0}}], "augment.0.args.alpha: must be a number > 0"),
        ([{"name": "normalize", "args": {"std": [0.2, 0]}}], "augment.0.args.std.1: must be a number > 0, got 0"),
        ([{"name": "normalize", "args": {"mean": [1, 2], "std": [1, 2, 3]}}], "std: 3 values, but mean has 2"),
        (
            [{"name": "normalize"}, {"name": "flip_vertical"}, {"name": "normalize"}],
            "augment.2: normalize appears twice",
        ),
        ({"name": "random_crop"}, "data_loader.train.augment: expected a list of"),
        (["random_crop", 3], 'augment.1: expected {"name": ..., "args": {...}}, got 3'),
    ],
)
def test_config_errors_name_their_place(ops, message):
    with pytest.raises(ConfigError) as error:
        build_augment(config_with(ops), "cfg.json")
    assert str(error.value).startswith("cfg.json: data_loader.train.augment") and message in str(error.value)


def test_validation_refuses_augment_outside_the_train_split_and_checks_ops():
    from training.config.validation import validate

    with pytest.raises(
        ConfigError,
        match=r"data_loader\.validation\.augment: augmentation belongs to the train "
        r"split",
    ):
        validate(config_with([{"name": "flip_horizontal"}], split="validation"))
    with pytest.raises(ConfigError, match=r"train\.augment\.0\.name: unknown augment"):
        validate(config_with([{"name": "flip"}]))
    resolved = validate(config_with(PIPELINE))
    assert resolved["data_loader"]["train"]["augment"] == PIPELINE
    assert build_augment(config_with([])) is None and build_augment(config_with(None)) is None


def test_a_bad_op_stops_train_py_before_the_data(tmp_path):
    config = config_with([{"name": "random_crop", "args": {"padding": 4}}, {"name": "flip_horizntal"}])
    config["data_loader"]["train"]["args"] = {"data_dir": str(tmp_path / "missing")}
    (tmp_path / "c.json").write_text(json.dumps(config))
    done = subprocess.run(
        [sys.executable, "train.py", "-c", str(tmp_path / "c.json")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        "error: c.json: data_loader.train.augment.1.name: unknown augment 'flip_horizntal'; available: brightness, "
        "contrast, cutmix, flip_horizontal, flip_vertical, mixup, normalize, random_crop, random_erasing, "
        "random_resized_crop, saturation. Did you mean 'flip_horizontal'?"
    ]


def test_a_channel_mismatch_is_one_line_at_its_place():
    augment = build_augment(config_with([{"name": "normalize", "args": {"mean": [0.5, 0.5, 0.5]}}]), "cfg.json")
    gray = jax.ShapeDtypeStruct((B, H, W, 1), jnp.uint8)
    with pytest.raises(
        ValueError,
        match=r"^cfg\.json: data_loader\.train\.augment\.0\.args\.mean: 3 values, but the "
        r"input has 1 channel",
    ):
        augment.spec({"input": gray})


# ------------------------------------------------------------------------------------------------ preprocessing
def test_preprocessing_folds_normalisation_into_what_predict_py_computes():
    from inference.predict import normalised

    x = images()
    spec = {"input": jax.ShapeDtypeStruct(x.shape, x.dtype)}
    augment = build_augment(
        config_with(
            [
                {"name": "flip_horizontal"},
                {"name": "normalize", "args": {"mean": [0.4, 0.5, 0.6], "std": [0.2, 0.25, 0.3]}},
            ]
        )
    )
    model_input = np.asarray(augment(batch_of(x), None, train=False)["input"])
    for data in (
        {"classes": ["a", "b"], "pixel_scale": 1.0},  # uint8 pixels as stored
        {"classes": ["a", "b"], "pixel_scale": 0.5, "mean": 10.0, "std": 4.0},
    ):  # a data set's own scaling
        raw = x if "mean" not in data else x.astype(np.float32)
        source = (raw * data["pixel_scale"] - data.get("mean", 0.0)) / data.get("std", 1.0)
        prepared = augment(batch_of(source.astype(np.float32) if "mean" in data else x), None, train=False)["input"]
        folded = augment.preprocessing(
            data, spec if "mean" not in data else {"input": jax.ShapeDtypeStruct(x.shape, jnp.float32)}
        )
        assert folded["classes"] == ["a", "b"]
        json.dumps(folded)  # JSON-able
        np.testing.assert_allclose(
            normalised(x.astype(np.float32) * np.asarray(folded["pixel_scale"]), folded),
            np.asarray(prepared),
            rtol=1e-5,
            atol=1e-4,
        )
    np.testing.assert_allclose(
        model_input, normalised(x / 255.0, {"mean": [0.4, 0.5, 0.6], "std": [0.2, 0.25, 0.3]}), rtol=1e-5, atol=1e-5
    )
    assert build_augment(config_with([{"name": "flip_horizontal"}])).preprocessing({"classes": ["a"]}, spec) == {
        "classes": ["a"]
    }
