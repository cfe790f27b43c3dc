"""benchmarks/accelerator_run.py's --smoke mode on the CPU, so the accelerator run does not rot between GPU days."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_smoke_run_writes_a_row_per_sample_asked_for_with_its_throughput(tmp_path):
    out = tmp_path / "table.md"
    script = ROOT / "benchmarks" / "accelerator_run.py"
    # two samples (every sample trains in test_samples_devices.py): an image classifier and the language model
    command = [sys.executable, str(script), "--smoke", "--samples", "config,shakespeare_char", "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in out.read_text().splitlines()[3:]}
    others = {c.stem for c in (ROOT / "configs").glob("*.json")} - {"shakespeare_char"}
    assert {"config", "shakespeare_char", "gpt2-small (toy)"} <= set(rows) and not others & set(rows), rows
    for config in [ROOT / "config.json", ROOT / "configs" / "shakespeare_char.json"]:
        name = "config" if config.parent == ROOT else config.stem
        assert name in rows, f"{name}: no row in\n{out.read_text()}"
        # a sample whose data is downloaded (CIFAR-10) may have no network here; every other must have trained
        if '"download": true' not in config.read_text():
            assert re.fullmatch(r"[\d,]+ (examples|tokens)/s", rows[name][2]), rows[name]
            assert rows[name][4].rstrip(" |") == "unknown", rows[name]  # no peak FLOP/s for a CPU
    assert re.fullmatch(r"[\d,]+ tokens/s", rows["gpt2-small (toy)"][2])
    assert "lm_benchmark" not in out.read_text()  # --smoke runs no peers


def test_only_names_its_groups_and_refuses_others():
    script = ROOT / "benchmarks" / "accelerator_run.py"
    done = subprocess.run([sys.executable, str(script), "--only", "samples,bogus"], capture_output=True, text=True)
    assert (
        done.returncode == 2
        and "--only: expected some of samples, gpt2, lm, resnet, overhead, got bogus" in done.stderr
    )
    done = subprocess.run([sys.executable, str(script), "--samples", "config,bogus"], capture_output=True, text=True)
    assert done.returncode == 2 and "--samples: expected some of config, " in done.stderr


@pytest.mark.slow
def test_gpu_step_benchmark_smoke_runs_its_parts_on_the_cpu(tmp_path):
    """benchmarks/gpu_step_benchmark.py on tiny shapes: the plain math's parity row, the fused row failing with
    cuDNN's reason (no GPU here), both GPT-2 rows, and a profile with its kernels."""
    out = tmp_path / "gpu.md"
    script = ROOT / "benchmarks" / "gpu_step_benchmark.py"
    command = [sys.executable, str(script), "--smoke", "--steps", "4", "--only", "parity,gpt2,profile"]
    done = subprocess.run([*command, "--out", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    assert re.search(r"\| plain bf16 \| dq \| \d\.\d\de-0[234] \|", text), text
    assert "| fused bf16 | failed: " in text
    assert re.search(r"\| template, attention auto \| [\d,]+ \|", text) and "attention plain" in text
    assert re.search(r"profile of configs/shakespeare_char.json's step \(K = \d+\)", text)
    assert len(re.findall(r"^\| .+ \| [\d.]+ \| [\d.]+% \|", text, flags=re.M)) == 10, text
