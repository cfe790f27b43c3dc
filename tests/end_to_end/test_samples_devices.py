"""Every sample config (config.json and configs/*.json) trains on 1, 2, 4 and 8 simulated CPU devices: one
``train.py --fast-dev-run`` of each (a step of training, validation and test, a checkpoint written and read back) on
tiny generated data, the sample's model and batch sizes unchanged. Validation and test batches that do not divide over
the devices (cifar10_resnet's 500, the MNIST samples' 1000 on 8) are padded with masked rows; a training batch that
does not divide is refused in one line naming the sizes that do (shakespeare_char's 12, nanoGPT's recipe, on 8
devices: it then trains at 16). One process per device count trains every sample, so each pays JAX's start once.

The suite runs 2, 4 and 8 devices (each costs a minute or more of compiling every sample): 1 device is what every
sample's own end-to-end test runs; the parametrization takes any count (``-k``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import make_idx_dataset

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = [ROOT / "config.json", *sorted((ROOT / "configs").glob("*.json"))]
MNIST_SOURCES = {"mnist", "mnist_multitask", "mnist_segmentation"}

# In the process of one device count: each sample through train.main, the tiny MNIST files registered as the real
# ones' checksums (the loaders verify them); prints one JSON line of exit statuses.
TRAIN_EVERY_SAMPLE = textwrap.dedent(
    """
    import json, sys
    import jax
    from data_loader.sources import mnist
    import train

    configs, md5 = json.loads(sys.argv[1]), json.loads(sys.argv[2])
    mnist.SOURCES["mnist"] = {**mnist.SOURCES["mnist"], "md5": md5}
    def run(*args):
        try:
            return train.main(["--fast-dev-run", *args])
        except SystemExit as stop:
            return stop.code

    status = {"devices": jax.device_count()}
    for name, path in configs.items():
        status[name] = run("-c", path)
        if status[name] == 2 and name == "shakespeare_char":  # its batch of 12 on 8 devices: the nearest that divides
            status[name + " --bs 16"] = run("-c", path, "--bs", "16")
    print(json.dumps(status))
    """
)


def tiny_configs(tmp_path: Path) -> dict[str, str]:
    """Each sample config with its downloaded data sets pointed at tiny generated files (the shipped ones kept), and
    a warmup short enough for the few steps of a run over them."""
    mnist_dir, cifar_dir = tmp_path / "mnist", tmp_path / "cifar10"
    if any("cifar" in sample.stem for sample in SAMPLES):  # a project may have left the CIFAR sample out
        from tests.end_to_end.test_samples_cifar import write_cifar10

        write_cifar10(cifar_dir)
    configs = {}
    for sample in SAMPLES:
        config = json.loads(sample.read_text())
        for loader in config["data_loader"].values():
            args = loader.setdefault("args", {})
            if loader["name"] in MNIST_SOURCES:
                args.update(data_dir=str(mnist_dir), validation_size=100)
            elif loader["name"] == "cifar10":
                args.update(data_dir=str(cifar_dir), download=False, verify=False, validation_size=24)
        schedule = config["optimizer"].get("schedule", {}).get("args", {})
        if "warmup_steps" in schedule:
            schedule["warmup_steps"] = 1
        path = tmp_path / sample.name
        path.write_text(json.dumps(config))
        configs[config["name"] if sample.parent == ROOT else sample.stem] = str(path)
    return configs


@pytest.mark.slow
@pytest.mark.parametrize("devices", [8])  # every sample split 8 ways; 2 and 4 devices: test_mesh.py, test_train.py
def test_every_sample_trains_on_any_device_count(tmp_path, devices):
    md5 = make_idx_dataset(tmp_path / "mnist")
    configs = tiny_configs(tmp_path)
    env = {
        **os.environ,
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
        "JAX_PLATFORMS": "cpu",
        "PYTHONPATH": str(ROOT),
    }
    args = [sys.executable, "-c", TRAIN_EVERY_SAMPLE, json.dumps(configs), json.dumps(md5)]
    result = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    status = json.loads(result.stdout.strip().splitlines()[-1])
    refused = {"shakespeare_char": 2} if devices == 8 and "shakespeare_char" in configs else {}
    trained = {name: 0 for name in configs} | refused
    if refused:
        trained["shakespeare_char --bs 16"] = 0
    assert status == {"devices": devices, **trained}, result.stderr[-3000:]
