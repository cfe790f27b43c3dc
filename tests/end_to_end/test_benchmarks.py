"""benchmarks/' helpers: the machine's description and peak, the report's table, and peers that see what the
template sees. A project made by new_project.py leaves benchmarks/ and this file behind."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from training.config.components import build_optimizer

REPO = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------------------- benchmark helpers
def test_cpu_model_names_the_processor_and_its_vector_extensions():
    from benchmarks.machine import cpu_model

    cpuinfo = (
        "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\n"
        "model name\t: Intel(R) Xeon(R) Platinum 8480C\nflags\t\t: fpu avx2 avx512f amx_tile\n\n"
        "processor\t: 1\nmodel name\t: other\n"
    )
    assert cpu_model(cpuinfo) == "Intel(R) Xeon(R) Platinum 8480C (family 6 model 143, avx2+avx512f+amx_tile)"
    assert cpu_model("model name\t: AMD EPYC\nflags\t: sse2\n") == "AMD EPYC (no avx2)"
    assert cpu_model() and cpu_model() != "x86_64" or sys.platform != "linux"


def test_fraction_of_peak_and_matmul_peak():
    from benchmarks.machine import fraction_of_peak, matmul_peak

    assert fraction_of_peak(4000, 25e6, 200) == pytest.approx(0.5)
    rates = matmul_peak(size=64, reps=1)
    assert {"jax", "numpy"} <= set(rates) and all(r > 0 for r in rates.values())


def test_torch_variant_is_skipped_with_a_note_without_torch(monkeypatch):
    import importlib.util

    from benchmarks import train_benchmark

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    variants, notes = train_benchmark.available(["template", "torch", "flax", "torch-bf16", "bf16", "torch-best"])
    assert variants == ["template", "flax", "bf16"] and len(notes) == 1 and "PyTorch is not installed" in notes[0]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())
    assert train_benchmark.available(["template", "torch"]) == (["template", "torch"], [])
    assert "torch" not in (REPO / "requirements.txt").read_text()


def test_report_gives_every_variant_its_fraction_of_the_peak():
    from benchmarks import train_benchmark

    runs = {
        "template": [
            {
                "images_per_s": 2000.0,
                "seconds": 1.0,
                "data_wait_s": 0.0,
                "compile_s": 1.0,
                "steps_per_call": 10,
                "peak_rss_mb": 1.0,
                "mflop_per_example": 25.0,
            }
        ],
        "torch": [{"images_per_s": 1000.0, "torch": "2", "threads": 2, "params": 3}],
        "torch-best": [{"images_per_s": 4000.0, "torch": "2", "device": "cuda", "warm_up_s": 30.0}],
    }
    table = train_benchmark.report("mnist_cnn", runs, peak=100.0)
    assert "| template | 2,000 | 2,000-2,000 | 1 | 1.00 | - | 50% |" in table
    assert "| torch | 1,000 | 1,000-1,000 | 1 | 2.00 | - | 25% |" in table
    assert "| torch-best | 4,000 | 4,000-4,000 | 1 | 0.50 | - | 100% |" in table
    assert "torch-best: PyTorch 2 on cuda, ten warm-up steps with the compilation 30.0 s" in table


def test_cifar_benchmark_peers_see_what_the_template_sees(tmp_path, monkeypatch):
    # The peers normalise on the host and follow the sample's schedule: both must equal the template's own.
    import numpy as np

    from benchmarks import train_benchmark
    from training.config.validation import build_augment

    monkeypatch.setattr(train_benchmark.tempfile, "gettempdir", lambda: str(tmp_path))
    config = train_benchmark.bench_config("cifar_resnet", steps=2, augment=False)
    data = np.load(config["data_loader"]["train"]["args"]["path"])
    assert data["images"].shape == (256, 32, 32, 3) and data["images"].dtype == np.uint8
    x = data["images"][:8]
    ours = build_augment(config)({"input": x, "target": data["labels"][:8]}, train=False)["input"]
    np.testing.assert_allclose(train_benchmark.host_normalize(config)(x), ours, rtol=1e-5, atol=1e-5)

    for each in (config, train_benchmark.bench_config("mnist_cnn")):  # cosine; warm-up + cosine
        _, schedule = build_optimizer(each, steps_per_epoch=391)
        peer, flax_peer = train_benchmark.peer_schedule(each, 391), train_benchmark.optax_schedule(each, 391)
        for step in (0, 1, 100, 500, 391 * each["trainer"]["epochs"] - 1, 391 * each["trainer"]["epochs"] + 5):
            assert peer(step) == pytest.approx(float(schedule(step)), rel=1e-5, abs=1e-7), (each["name"], step)
            assert float(flax_peer(step)) == pytest.approx(float(schedule(step)), rel=1e-5, abs=1e-7)
    cifar = train_benchmark.bench_config("cifar_resnet", steps=2)
    assert train_benchmark.peer_is_sgd(cifar) and train_benchmark.weight_decay(cifar) == 0.0005
    assert [op["name"] for op in cifar["data_loader"]["train"]["augment"]] == [
        "random_crop",
        "flip_horizontal",
        "normalize",
    ]


def test_the_overhead_benchmark_runs_each_kind_of_variant():
    """benchmarks/overhead_benchmark.py in a few steps: the bare loop, a Trainer variant on a pseudo-terminal (with the
    bare loop in its own process), the loop alone and the placement, so that it keeps working between measurements."""
    import os
    import pty
    import subprocess

    try:
        for fd in pty.openpty():
            os.close(fd)
    except OSError as error:  # a machine without /dev/ptmx
        pytest.skip(f"no pseudo-terminal here: {error}")
    variants = "bare,K=1 log=1+tty,loop,place"
    done = subprocess.run(
        [sys.executable, "benchmarks/overhead_benchmark.py", "--rounds", "1", "--steps", "40", "--variants", variants],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "K=1 log=1+tty" in out and "the loop alone" in out and "placing a stack" in out, out
    row = next(line for line in out.splitlines() if line.startswith("K=1 log=1+tty"))
    assert len(row.split()) == 9, row  # variant (2 words), K, CPU, wall, 2 ratios, 2 same-process ratios


def test_the_cpu_step_benchmark_compares_each_option_set_with_what_the_template_chooses():
    """benchmarks/cpu_step_benchmark.py on the tabular sample in a few steps: one row, its kind of options read from
    the lowered step (an MLP has no convolution), a time and a speed for each variant; then its evaluation step."""
    import subprocess

    command = [sys.executable, "benchmarks/cpu_step_benchmark.py", "--configs", "configs/tabular_regression.json"]
    done = subprocess.run(
        [*command, "--steps", "3", "--rounds", "1"], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    row = next(line for line in done.stdout.splitlines() if line.startswith("| configs/tabular_regression.json"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[1] == "train without convolutions", row
    assert float(cells[2].replace(",", "")) > 0 and all(float(cell) > 0 for cell in cells[3:]), row
    assert len(cells) == 6, row  # sample, kind, the first variant's time, the others' speeds
    done = subprocess.run(
        [*command, "--steps", "2", "--rounds", "1", "--eval"], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    row = next(line for line in done.stdout.splitlines() if line.startswith("| configs/tabular_regression.json"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert len(cells) == 3 and float(cells[1].replace(",", "")) > 0 and float(cells[2]) > 0, row  # before, template


def test_the_cpu_step_benchmark_switches_each_kernel_form_off():
    """--forms on the language model in two steps: the step with the dense layers' weight gradients as autodiff forms
    them, and the template's, each with a figure."""
    import subprocess

    command = [sys.executable, "benchmarks/cpu_step_benchmark.py", "--configs", "configs/shakespeare_char.json"]
    done = subprocess.run(
        [*command, "--steps", "2", "--rounds", "1", "--forms"], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| sample | autodiff-dense, us/step | template |" in done.stdout, done.stdout
    row = next(line for line in done.stdout.splitlines() if line.startswith("| configs/shakespeare_char.json"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert len(cells) == 3 and float(cells[1].replace(",", "")) > 0 and float(cells[2]) > 0, row


@pytest.mark.slow
def test_startup_benchmark_times_every_phase_and_the_second_run_reads_the_cache(tmp_path):
    import subprocess

    from benchmarks.startup_benchmark import PHASES
    from tests.conftest import make_idx_dataset
    from tests.end_to_end.test_train import make_config

    make_idx_dataset(tmp_path / "mnist", n_train=120, n_test=40)
    config = make_config(tmp_path, tmp_path / "mnist")
    done = subprocess.run(
        [sys.executable, "benchmarks/startup_benchmark.py", "--configs", str(config)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {line.split()[0]: line for line in done.stdout.splitlines() if line.startswith("  ")}
    assert set(rows) == {phase.split()[0] for phase in PHASES} | {"total"}, done.stdout
    assert "(compiled; kept in the compilation cache / from the compilation cache)" in rows["compile"]


def test_startup_benchmark_gpt2_is_gpu_step_benchmarks_gpt2_small_at_the_batch_asked():
    """--gpt2 N: the config GPT-2 small's rows on a GPU train (12 layers of 768, 12 heads, 1024 positions, bfloat16),
    validated, at N sequences a training step; the evaluation batch left as it is."""
    from benchmarks.startup_benchmark import gpt2
    from training.config.validation import load_config

    path, overrides = gpt2(1)
    config = load_config(REPO / path, overrides)
    model, train = config["model"]["args"], config["data_loader"]["train"]["args"]
    assert (model["depth"], model["dim"], model["num_heads"], model["context"]) == (12, 768, 12, 1024)
    assert (train["batch_size"], train["context"], config["trainer"]["precision"]["compute"]) == (1, 1024, "bfloat16")
    assert config["data_loader"]["validation"]["args"]["batch_size"] == 64


def test_the_bucket_benchmark_saves_each_layout_locally_and_into_s3(capsys):
    """benchmarks/bucket_benchmark.py --smoke (a 1 MB state, in this process, moto's S3 server on localhost): a row
    for each layout and target, so that it keeps working between measurements."""
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    import importlib.util

    spec = importlib.util.spec_from_file_location("bucket_benchmark", REPO / "benchmarks/bucket_benchmark.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--smoke"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith(("| one file", "| sharded"))]
    assert [r.split(" | ")[:2] for r in rows] == [
        ["| one file", "local disk"], ["| one file", "s3 (moto)"], ["| sharded", "local disk"], ["| sharded", "s3 (moto)"]
    ]  # fmt: skip
