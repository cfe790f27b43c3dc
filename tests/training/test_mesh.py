"""The device mesh, the FSDP rule and the run's processes as one process sees them (training/devices/mesh.py),
proven on simulated CPU devices (--xla_force_host_platform_device_count) in one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from data_loader.loader import ArrayDataset, DataLoader
from tests.conftest import make_idx_dataset
from tests.end_to_end.test_train import ROOT, run, write_config
from training.config.file import ConfigError
from training.config.validation import validate
from training.devices import mesh
from training.run import checkpoint


# ------------------------------------------------------------------------------------------------ without devices
def minimal_config(**extra) -> dict:
    return {
        "name": "m",
        "model": {"name": "mlp", "args": {"hidden": [8]}},
        "loss": {"name": "cross_entropy"},
        "optimizer": {"name": "sgd", "args": {"lr": 0.1}},
        "trainer": {"monitor": "off"},
        "data_loader": {"train": {"name": "mnist", "args": {"data_dir": "unused"}}},
        **extra,
    }


@pytest.mark.parametrize(
    "mesh, message",
    [
        ({"dta": 2}, "config.json: mesh.dta: unknown mesh axis. Did you mean 'data'? Axes: data, fsdp"),
        ({"fsdp": 0}, "config.json: mesh.fsdp: expected a device count >= 1, or -1"),
        ({"fsdp": 1.5}, "config.json: mesh.fsdp: expected a device count"),
        ({"data": -1, "fsdp": -1}, "config.json: mesh: only one axis may be -1"),
        ([2, 2], "config.json: mesh: expected an object like"),
    ],
)
def test_mesh_section_validated(mesh, message):
    with pytest.raises(ConfigError) as error:
        validate(minimal_config(mesh=mesh))
    assert str(error.value).startswith(message), str(error.value)


def test_mesh_defaults_and_shapes():
    assert validate(minimal_config())["mesh"] == {"data": -1, "fsdp": 1}
    assert validate(minimal_config(mesh={"fsdp": 4}))["mesh"] == {"data": -1, "fsdp": 4}
    assert mesh.mesh_shape({"data": -1, "fsdp": 2}, 8) == (4, 2)
    assert mesh.mesh_shape({"data": 2, "fsdp": -1}, 8) == (2, 4)
    assert mesh.mesh_shape({"data": -1, "fsdp": 1}, 1) == (1, 1)
    with pytest.raises(ValueError, match="mesh.fsdp 3 does not divide the 4 devices in use; --set mesh.fsdp=2 does"):
        mesh.mesh_shape({"data": -1, "fsdp": 3}, 4)
    with pytest.raises(ValueError, match="mesh.data 8 does not divide the 12 devices in use; --set mesh.data=6 does"):
        mesh.mesh_shape({"data": 8, "fsdp": -1}, 12)
    with pytest.raises(ValueError, match="mesh: data 2 x fsdp 1 = 2 devices, but 4 are in use"):
        mesh.mesh_shape({"data": 2, "fsdp": 1}, 4)


def test_fsdp_rule_largest_divisible_axis_else_replicated():
    from jax.sharding import PartitionSpec as P

    rule = mesh.fsdp_spec
    assert rule((784, 64), 4) == P("fsdp")  # the largest axis
    assert rule((3, 3, 16, 32), 4) == P(None, None, None, "fsdp")
    assert rule((10, 64), 4) == P(None, "fsdp")  # 10 is not divisible: the next largest that is
    assert rule((64, 64), 4) == P("fsdp")  # ties: the first
    assert rule((10,), 4) == P() and rule((), 4) == P() and rule((2,), 4) == P()
    assert rule((784, 64), 1) == P()


def test_process_shares_make_up_each_global_batch():
    """Each process reads only its rows; put together, process by process, they are the one-process batches, the
    padding of the last batch (mask 0) included. spec describes the global batch."""
    data = ArrayDataset(input=np.arange(70, dtype=np.float32).reshape(35, 2), target=np.arange(35))
    whole = DataLoader(data, 8, shuffle=True, seed=3)
    shares = []
    for index in range(4):
        loader = DataLoader(data, 8, shuffle=True, seed=3)
        loader.share = (index, 4)
        assert loader.spec["input"].shape == (8, 2)
        shares.append(list(loader.batches(epoch=2)))
    expected = list(whole.batches(epoch=2))
    assert len(expected) == 5 and all(len(s) == 5 for s in shares)
    for b, batch in enumerate(expected):
        for key in ("input", "target", "mask"):
            np.testing.assert_array_equal(np.concatenate([s[b][key] for s in shares]), batch[key])
    assert expected[-1]["mask"].tolist() == [1, 1, 1, 0, 0, 0, 0, 0]


def test_one_process_shares_with_nobody_and_waits_for_nobody():
    """What train.py asks of the run's processes, alone: no collective, no waiting, the text itself."""
    assert mesh.is_main()
    assert mesh.max_over_processes(15, 0, 7) == (15, 0, 7)
    assert mesh.share_text("run_dir", "saved/x/run_1") == "saved/x/run_1"
    assert mesh.describe_processes() == "1 process"
    mesh.finish_processes()


# ------------------------------------------------------------------------------------------------ simulated devices
def devices_env(count: int) -> dict:
    return {"XLA_FLAGS": f"--xla_force_host_platform_device_count={count}", "JAX_PLATFORMS": "cpu"}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("data") / "mnist"
    make_idx_dataset(folder, n_train=160, n_test=40)
    return folder


def tiny_config(folder: Path, data_dir: Path, validation: bool = True, **changes) -> Path:
    loader = {"name": "mnist", "args": {"data_dir": str(data_dir), "verify": False, "validation_size": 32}}
    config = {
        "name": "tiny",
        "seed": 1,
        "model": {"name": "mlp", "args": {"hidden": [64], "dropout": 0.1}},
        "loss": {"name": "cross_entropy"},
        "metrics": [{"name": "accuracy"}],
        # momentum, not Adam: Adam divides a near-zero gradient by its own size, so the last-bit differences of
        # another summation order (4 devices, 2 processes) grow to ~1e-4 in the weights of a pixel that is ~never lit
        "optimizer": {"name": "sgd", "args": {"lr": 0.05, "momentum": 0.9}},
        "data_loader": {
            "train": {**loader, "args": {**loader["args"], "split": "train", "batch_size": 32, "shuffle": True}},
            "validation": {**loader, "args": {**loader["args"], "split": "validation", "batch_size": 16}},
        },
        "trainer": {
            "epochs": 2,
            "save_dir": str(folder / "saved"),
            "save_period": 1,
            "steps_per_call": 2,
            "monitor": "min val/loss",
            "log_every": 1,
        },
    }
    if not validation:  # one compilation less
        del config["data_loader"]["validation"]
        config["trainer"]["monitor"] = "off"
    return write_config(folder, config, changes)


def assert_close_states(path, want_path, atol=1e-5) -> None:
    got, header = checkpoint.read(path)
    want, want_header = checkpoint.read(want_path)
    assert (header["epoch"], header["step"]) == (want_header["epoch"], want_header["step"])
    assert got.keys() == want.keys() and any(k.startswith("opt_state") for k in got)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=0, atol=atol, err_msg=key)


def losses(run_dir: Path) -> np.ndarray:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return np.array([[r["train/loss"], r["val/loss"], r["train/accuracy"]] for r in rows])


@pytest.mark.slow
def test_four_devices_equal_one_device_and_resume_on_one(tmp_path, data_dir):
    """1 process x 4 devices == 1 device (losses and final state within 1e-5); the 4-device run's epoch-1
    checkpoint resumes on one device and ends as the 1-device run."""
    config = tiny_config(tmp_path, data_dir)
    saved = tmp_path / "saved/tiny"
    one = run("train.py", "-c", config, "--run-id", "one", env=devices_env(1))
    assert one.returncode == 0, one.stderr
    four = run("train.py", "-c", config, "--run-id", "four", env=devices_env(4))
    assert four.returncode == 0, four.stderr
    assert "1 process, mesh {'data': 4, 'fsdp': 1}" in four.stdout
    np.testing.assert_allclose(losses(saved / "four"), losses(saved / "one"), rtol=0, atol=1e-5)
    for name in ("checkpoint-latest.params", "checkpoint-epoch_1.params", "model_best.params"):
        assert_close_states(saved / "four" / name, saved / "one" / name)
    resumed_dir = resume_in_one(saved / "four", saved / "resumed")
    assert_close_states(resumed_dir / "checkpoint-latest.params", saved / "one" / "checkpoint-latest.params")
    np.testing.assert_allclose(losses(resumed_dir), losses(saved / "one"), rtol=0, atol=1e-5)


def resume_in_one(run_dir: Path, resumed_dir: Path) -> Path:
    """`run_dir`'s epoch-1 checkpoint continued by one process on one device, in `resumed_dir`."""
    resumed_dir.mkdir()
    (resumed_dir / "config.json").write_text((run_dir / "config.json").read_text())
    (resumed_dir / "checkpoint-latest.params").write_bytes((run_dir / "checkpoint-epoch_1.params").read_bytes())
    (resumed_dir / "metrics.jsonl").write_text((run_dir / "metrics.jsonl").read_text().splitlines()[0] + "\n")
    resumed = run("train.py", "-r", resumed_dir / "checkpoint-latest.params", env=devices_env(1))
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stdout and "1 process, mesh {'data': 1, 'fsdp': 1}" in resumed.stdout
    return resumed_dir


FSDP_CHILD = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    import jax
    import numpy as np
    from training.run import checkpoint
    from training.devices import mesh
    from training import startup
    from training.trainer import Trainer
    from training.assembly import assemble
    from training.config.validation import load_config

    folder = Path(sys.argv[1])
    out = {}
    for fsdp in (1, 4):
        config = load_config(folder / "config.json", [f"mesh.fsdp={fsdp}"])
        run = assemble(config)
        run.load_data(["train"])
        run_dir = folder / f"fsdp{fsdp}"
        run_dir.mkdir()
        trainer = Trainer(run, run_dir)
        trainer.begin(startup.from_seed(trainer))
        held = mesh.device_bytes({k: trainer.train_state[k] for k in ("params", "opt_state")})
        specs = {k: list(v.sharding.spec) for k, v in trainer.train_state["params"]["fc0"].items()}
        trainer.train()
        after = mesh.device_bytes({k: trainer.train_state[k] for k in ("params", "opt_state")})
        np.savez(folder / f"fsdp{fsdp}.npz", **checkpoint.flatten(mesh.to_host(trainer.train_state)))
        out[fsdp] = {"max_device_bytes": max(held.values()), "devices": len(held), "after": max(after.values()),
                     "specs": specs, "mesh": dict(trainer.placement.mesh.shape)}
    print(json.dumps(out))
""")


@pytest.mark.slow
def test_fsdp4_equals_fsdp1_with_a_quarter_of_the_memory_per_device(tmp_path, data_dir):
    tiny_config(tmp_path, data_dir, validation=False, trainer__epochs=1)
    child = subprocess.run(
        [sys.executable, "-c", FSDP_CHILD, str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, **devices_env(4)},
        timeout=300,
    )
    assert child.returncode == 0, child.stderr
    out = json.loads(child.stdout.strip().splitlines()[-1])
    replicated, sharded = out["1"], out["4"]
    assert replicated["mesh"] == {"data": 4, "fsdp": 1} and sharded["mesh"] == {"data": 1, "fsdp": 4}
    assert sharded["specs"] == {"weight": ["fsdp"], "bias": ["fsdp"]}  # (784, 64): its largest axis
    ratio = replicated["max_device_bytes"] / sharded["max_device_bytes"]
    print(
        f"per-device parameter + optimizer bytes: fsdp 1 {replicated['max_device_bytes']:,}, fsdp 4 "
        f"{sharded['max_device_bytes']:,} ({ratio:.3f}x less)"
    )
    assert 3.9 < ratio <= 4.0, ratio  # only head.bias (10 values) and its momentum stay whole
    assert sharded["after"] == sharded["max_device_bytes"]  # the step keeps the state sharded
    a, b = np.load(tmp_path / "fsdp1.npz"), np.load(tmp_path / "fsdp4.npz")
    assert a.files == b.files and any(k.startswith("opt_state") for k in a.files)
    for key in a.files:
        np.testing.assert_allclose(b[key], a[key], rtol=0, atol=1e-5, err_msg=key)
    # the checkpoint gathered from the shards holds the whole arrays, equal to the state
    saved, _ = checkpoint.read(tmp_path / "fsdp4/checkpoint-latest.params")
    for key in saved:
        np.testing.assert_array_equal(saved[key], b[key], err_msg=key)


EVALUATE = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from data_loader.loader import ArrayDataset, DataLoader
    from training import startup
    from training.trainer import Trainer
    from training.assembly import assemble
    from training.config.validation import validate

    def trainer(train_batch):
        config = validate({
            "name": "pad", "seed": 3,
            "model": {"name": "mlp", "args": {"num_classes": 5, "hidden": [16]}},
            "loss": {"name": "cross_entropy"}, "metrics": [{"name": "accuracy"}, {"name": "f1"}],
            "optimizer": {"name": "adam", "args": {"lr": 0.01}},
            "data_loader": {"train": {"name": "mnist"}, "validation": {"name": "mnist"}},
            "trainer": {"epochs": 1, "save_dir": sys.argv[1]},
        })
        rng = np.random.default_rng(0)
        x, y = rng.standard_normal((30, 6)).astype(np.float32), rng.integers(0, 5, 30).astype(np.int32)
        run = assemble(config)
        # 30 examples in batches of 12: 12, 12 and 6 real rows, none a multiple of 8 devices
        run.use_data({"train": DataLoader(ArrayDataset(input=x, target=y), train_batch),
                      "validation": DataLoader(ArrayDataset(input=x, target=y), 12)})
        return Trainer(run, None)

    try:
        trainer(12)
    except ValueError as error:
        print("refused:", error)
    t = trainer(8)
    t.begin(startup.from_seed(t))
    print(json.dumps(t.evaluate(t.valid_loader)))
    """
)


def test_evaluation_batches_are_padded_to_the_devices_and_training_batches_refused(tmp_path):
    """A validation batch of 12 on 8 devices: padded with masked rows, the loss and metrics those of 1 device. A
    training batch of 12 is refused in one line naming the sizes that divide."""
    outputs = {}
    for devices in (1, 8):
        done = subprocess.run(
            [sys.executable, "-c", EVALUATE, str(tmp_path)],
            cwd=ROOT,
            env={**os.environ, **devices_env(devices)},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        outputs[devices] = done.stdout.strip().splitlines()
    assert len(outputs[1]) == 1  # 12 divides over one device
    assert outputs[8][0] == (
        "refused: data_loader.train.args.batch_size 12 must be a multiple of the 8 devices in use: 8 or 16"
    )
    one, eight = json.loads(outputs[1][-1]), json.loads(outputs[8][-1])
    assert one.keys() == eight.keys() and one["loss"] > 0
    for name in one:
        np.testing.assert_allclose(eight[name], one[name], rtol=1e-6, atol=1e-7, err_msg=name)
