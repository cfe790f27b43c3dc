"""JAX for the machine's accelerator, checked without one: a fake `nvidia-smi` on PATH stands for an NVIDIA driver.
The Makefile's dry run (`make -n`) shows what it would install; train.py warns when JAX ignores the accelerator."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.end_to_end.test_train import ROOT, data_dir, make_config, run  # noqa: F401
from training.devices import peaks, platform
from training.devices.accelerator import machine_accelerator

needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="no make")
no_accelerator = pytest.mark.skipif(machine_accelerator() != "cpu", reason="this machine has an accelerator")


@pytest.fixture
def fake_gpu_path(tmp_path) -> str:
    """PATH with an `nvidia-smi` in front, as a machine with the NVIDIA driver has."""
    folder = tmp_path / "fake-driver"
    folder.mkdir()
    tool = folder / "nvidia-smi"
    tool.write_text("#!/bin/sh\nexit 0\n")
    tool.chmod(0o755)
    return f"{folder}{os.pathsep}{os.environ['PATH']}"


def make_dry_run(*args, path=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": path or os.environ["PATH"]}
    # a make started from `make test` inherits its level and flags, and would print "Entering directory" lines
    for name in ("ACCEL", "MAKELEVEL", "MAKEFLAGS", "MFLAGS"):
        env.pop(name, None)
    return subprocess.run(["make", "-n", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


def pip_installs(output: str) -> list[str]:
    return [
        line.split("pip install --quiet ", 1)[1] for line in output.splitlines() if "pip install --quiet -r" in line
    ]


@needs_make
def test_make_picks_cuda_where_an_nvidia_driver_is_visible(tmp_path, fake_gpu_path):
    venv = tmp_path / "venv"
    result = make_dry_run("train", f"VENV={venv}", path=fake_gpu_path)
    assert result.returncode == 0, result.stderr
    assert pip_installs(result.stdout) == ["-r requirements-cuda12.txt"]
    assert "JAX for cuda12 (detected; override with ACCEL=cpu|cuda12|cuda13|tpu)" in result.stdout
    tests = make_dry_run("test", f"VENV={venv}", path=fake_gpu_path)
    assert pip_installs(tests.stdout) == ["-r requirements-dev.txt -r requirements-cuda12.txt"]
    forced = make_dry_run("train", f"VENV={venv}", "ACCEL=cpu", path=fake_gpu_path)
    assert pip_installs(forced.stdout) == ["-r requirements.txt"] and "(ACCEL=cpu given;" in forced.stdout


@needs_make
@no_accelerator
def test_make_installs_the_cpu_set_without_an_accelerator(tmp_path):
    result = make_dry_run("train", f"VENV={tmp_path / 'venv'}")
    assert result.returncode == 0, result.stderr
    assert pip_installs(result.stdout) == ["-r requirements.txt"] and "rm -rf" not in result.stdout
    assert "JAX for cpu (detected;" in result.stdout
    tests = make_dry_run("test", f"VENV={tmp_path / 'venv'}")
    assert pip_installs(tests.stdout) == ["-r requirements-dev.txt"]


@needs_make
def test_make_rebuilds_the_venv_when_the_accelerator_changes(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)  # a Python the Makefile accepts (it runs, >= 3.12)
    (venv / ".installed").touch()  # newer than the requirements files: installed, nothing to do
    (venv / "accelerator").write_text("cuda12\n")
    same = make_dry_run("train", f"VENV={venv}", "ACCEL=cuda12")
    assert same.stdout.splitlines() == [f"{venv}/bin/python train.py -c config.json"]
    other = make_dry_run("train", f"VENV={venv}", "ACCEL=cpu")
    assert f"rm -rf {venv}" in other.stdout.splitlines() and pip_installs(other.stdout) == ["-r requirements.txt"]
    (venv / "accelerator").unlink()  # a venv made before the choice existed: a CPU one, left as it is
    assert make_dry_run("train", f"VENV={venv}", "ACCEL=cpu").stdout.splitlines() == same.stdout.splitlines()


@needs_make
def test_make_rebuilds_a_venv_made_with_a_python_older_than_3_12(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    old = venv / "bin" / "python"
    old.write_text("#!/bin/sh\nexit 1\n")  # what `python -c 'sys.exit(version < (3, 12))'` does on 3.11
    old.chmod(0o755)
    (venv / ".installed").touch()
    result = make_dry_run("train", f"VENV={venv}", "ACCEL=cpu")
    assert result.returncode == 0, result.stderr
    assert f"rm -rf {venv}" in result.stdout.splitlines() and pip_installs(result.stdout) == ["-r requirements.txt"]


@needs_make
def test_make_refuses_an_unknown_accelerator():
    result = make_dry_run("train", "ACCEL=rocm")
    assert result.returncode == 2 and "ACCEL=rocm: choose one of cpu cuda12 cuda13 tpu" in result.stderr
    assert result.stdout == ""


def test_every_accelerator_has_its_requirements_at_the_cpu_pins():
    for name in ("cuda12", "cuda13", "tpu"):
        lines = (ROOT / f"requirements-{name}.txt").read_text().splitlines()
        assert "-r requirements.txt" in lines and f"jax[{name}]" in lines  # the version: requirements.txt's pin


@pytest.mark.slow
@no_accelerator
def test_train_warns_when_jax_ignores_a_visible_gpu(tmp_path, data_dir, fake_gpu_path):
    config = make_config(tmp_path, data_dir)
    result = run("train.py", "-c", config, "--fast-dev-run", env={"PATH": fake_gpu_path, "JAX_PLATFORMS": ""})
    assert result.returncode == 0, result.stderr  # the CPU run goes on
    warnings = [line for line in result.stdout.splitlines() if line.startswith("warning:")]
    assert warnings == [
        f"warning: this machine shows an NVIDIA GPU but JAX runs on the CPU only; install JAX for "
        f"it: {sys.executable} -m pip install -r requirements-cuda12.txt"
    ]
    assert "devices: cpu:0;" in result.stdout and "fast dev run passed" in result.stdout
    plain = run("train.py", "-c", config, "--fast-dev-run", env={"JAX_PLATFORMS": ""})
    assert plain.returncode == 0, plain.stderr
    assert "warning:" not in plain.stdout and "devices: cpu:0;" in plain.stdout


def test_no_warning_when_jax_uses_the_accelerator_or_the_cpu_was_chosen(fake_gpu_path):
    assert platform.unused_accelerator({"cpu"}, {"PATH": fake_gpu_path}) is not None
    assert platform.unused_accelerator({"gpu", "cpu"}, {"PATH": fake_gpu_path}) is None
    assert platform.unused_accelerator({"cpu"}, {"PATH": fake_gpu_path, "JAX_PLATFORMS": "cpu"}) is None


# ------------------------------------------------------------------------------- the step as an accelerator gets it
SAMPLES = [ROOT / "config.json", *sorted((ROOT / "configs").glob("*.json"))]


def sample_trainer(path, tmp_path, compute: str):
    """The Trainer of a sample config at one step per call in `compute` precision, on its own training data
    (shipped with the repository; a downloaded data set is stood in for by generated files of its format)."""
    from tests.end_to_end.test_samples_cifar import write_cifar10
    from training.assembly import assemble
    from training.config.settings import Settings
    from training.config.validation import load_config
    from training.trainer import Trainer

    config = load_config(path)
    config["trainer"].update(steps_per_call=1, precision={"compute": compute})
    train = config["data_loader"]["train"]
    if train["name"] == "cifar10":
        write_cifar10(tmp_path / "cifar10", per_file=60)
        train["args"].update(data_dir=str(tmp_path / "cifar10"), download=False, verify=False, validation_size=24)
    run = assemble(config, str(path))
    run.use_data(run.load_data(["train"]))
    return Trainer(run, None, settings=Settings.of(config))


@pytest.mark.slow
@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.stem)
def test_every_sample_step_lowers_for_cuda_and_tpu(path, tmp_path):
    """Each sample's training step as XLA:GPU and TPU would compile it, lowered on this machine: no custom calls
    (host callbacks are custom calls too), no float64, and none of the XLA:CPU kernels (model/kernels: their
    optimization barriers and roundings) whatever JAX's default backend is."""

    for compute in ("float32", "bfloat16"):
        trainer = sample_trainer(path, tmp_path, compute)
        trainer.place_stacks(host_arrays=False)  # as on an accelerator: each stack one packed array
        assert trainer.placement.packing is not None
        template, compiled = trainer.abstract_state, trainer.compiled
        stack = trainer.placement.stack_spec(trainer.accumulate)
        traced = compiled.train.trace(template, compiled.empty_stats(template), stack)
        lowered = {target: traced.lower(lowering_platforms=(target,)) for target in ("cuda", "tpu", "cpu")}  # once each
        for target in ("cuda", "tpu"):
            text = lowered[target].as_text()
            where = f"{path.name}, {compute}, {target}"
            assert "stablehlo.convolution" in text or "stablehlo.dot_general" in text, where
            for mark in ("custom_call", "callback", "f64", "optimization_barrier", "reduce_precision"):
                assert mark not in text, f"{where}: {mark}"
        cpu = lowered["cpu"].as_text()  # the same trace keeps the kernels for the CPU
        assert "custom_call" not in cpu and "f64" not in cpu
        # MFU's count is of the step as an accelerator compiles it: the module lowered for CUDA, here as on a GPU
        # (counted apart, unsharded, on the CPU device: the count an accelerator host makes)
        counted = peaks.step_flops(compiled.call_fn, template, compiled.empty_stats(template), stack)
        cuda = lowered["cuda"].cost_analysis()["flops"]
        # (within a few FLOPs of the sharded trace's: 30 of 7.7 million for tabular_regression)
        assert counted and counted == pytest.approx(cuda, rel=1e-4), (path, counted, cuda)
        assert abs(lowered["tpu"].cost_analysis()["flops"] / counted - 1) < 1e-3, path
