"""A stack as one array of bytes (training/devices/packing.py): the bytes come back exactly, whatever the dtypes,
and training on packed stacks ends where training on the host's arrays does, on one device and split over four."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from training.devices.packing import Packing

ROOT = Path(__file__).resolve().parents[2]


def random_tree(rng, axes: tuple) -> dict:
    floats = rng.standard_normal((*axes, 3, 2)).astype(np.float32)
    floats.reshape(-1)[:3] = [np.nan, -0.0, np.inf]  # bit patterns a conversion would not keep
    return {
        "input": {
            "pixels": rng.integers(0, 256, (*axes, 4, 4, 3), dtype=np.uint8),
            "tokens": rng.integers(-(2**31), 2**31 - 1, (*axes, 7), dtype=np.int32),
            "half": rng.standard_normal((*axes, 5)).astype(np.float16),
        },
        "target": rng.integers(-128, 127, axes, dtype=np.int8),
        "flags": rng.random((*axes, 2)) > 0.5,
        "short": rng.integers(-(2**15), 2**15 - 1, axes, dtype=np.int16),
        "mask": floats,
    }


@pytest.mark.parametrize("lead", [1, 2])
def test_the_bytes_come_back_exactly(lead):
    rng = np.random.default_rng(lead)
    k, b = 3, 6
    tree = random_tree(rng, (k, b) if lead == 2 else (b,))
    batch_spec = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[lead - 1 :], a.dtype), tree)
    per_step = {"active": np.float32} if lead == 2 else None
    if lead == 2:
        tree["active"] = np.array([1.0, 1.0, 0.0], np.float32)
    packing = Packing(batch_spec, per_step)
    packed = packing.pack(tree, lead)
    assert packed.dtype == np.uint8 and packed.shape == (*((k,) if lead == 2 else ()), b, packing.row_bytes)
    back = jax.jit(lambda p: packing.unpack(p, lead))(packed)
    assert jax.tree.structure(back) == jax.tree.structure(tree)
    for (path, want), got in zip(jax.tree_util.tree_leaves_with_path(tree), jax.tree.leaves(back)):
        got = np.asarray(got)
        assert got.dtype == want.dtype and got.shape == want.shape, path
        assert got.tobytes() == want.tobytes(), path


def test_64_bit_leaves_are_not_packed():
    assert Packing.supports({"input": jax.ShapeDtypeStruct((4, 2), np.float32)})
    assert not Packing.supports(
        {"input": jax.ShapeDtypeStruct((4, 2), np.float32), "id": jax.ShapeDtypeStruct((4,), np.int64)}
    )


def test_training_on_packed_stacks_ends_where_host_arrays_end(tmp_path):
    """One device: the same run with each stack packed and placed (as on an accelerator) and with the host's arrays
    (XLA:CPU's path) ends in the same state, bit for bit, with the same epoch metrics."""
    from tests.training.test_trainer import make_trainer

    results = {}
    for host_arrays in (True, False):
        trainer = make_trainer(tmp_path, steps_per_call=2, epochs=2, run=f"host{host_arrays}")
        trainer.place_stacks(host_arrays=host_arrays)
        assert (trainer.placement.packing is None) == host_arrays
        trainer.train()
        results[host_arrays] = trainer.train_state, trainer.checkpoints.best
    (state, best), (packed_state, packed_best) = results[True], results[False]
    assert best == packed_best
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(packed_state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


FOUR_DEVICES = r"""
import sys, pathlib
sys.path.insert(0, ".")
import jax, numpy as np
from tests.training.test_trainer import make_trainer
states = []
for host_arrays in (True, False):
    trainer = make_trainer(pathlib.Path(sys.argv[1]), steps_per_call=2, epochs=1, batch=16, run=f"h{host_arrays}")
    trainer.place_stacks(host_arrays=host_arrays)
    trainer.train()
    states.append(jax.tree.leaves(trainer.train_state))
if not host_arrays:
    packed = trainer.placement.put_stack(next(trainer.train_loader.stacks(0, 2))[1])
    assert len(packed.sharding.device_set) == 4 and packed.dtype == np.uint8, packed.sharding
for a, b in zip(*states):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
print("same")
"""


def test_packed_stacks_split_over_four_devices_train_as_host_arrays(tmp_path):
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"}
    done = subprocess.run(
        [sys.executable, "-c", FOUR_DEVICES, str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("same"), done.stderr[-3000:]
