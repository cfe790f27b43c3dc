"""benchmarks/accelerator_run.py's --smoke mode on the CPU, so the accelerator run does not rot between GPU days."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_smoke_run_writes_a_row_per_sample_with_its_throughput(tmp_path):
    out = tmp_path / "table.md"
    script = ROOT / "benchmarks" / "accelerator_run.py"
    done = subprocess.run([sys.executable, str(script), "--smoke", "--out", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in out.read_text().splitlines()[3:]}
    configs = [ROOT / "config.json", *sorted((ROOT / "configs").glob("*.json"))]
    for config in configs:
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
