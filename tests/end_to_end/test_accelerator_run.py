"""benchmarks/accelerator_run.py's --smoke mode on the CPU, so the accelerator run does not rot between GPU days."""

import os
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
    # two samples (every sample trains in test_samples_devices.py): a table's regression and the language model, the
    # two that compile quickest (config.json's ConvNeXt took 20 s more of this test)
    command = [
        sys.executable,
        str(script),
        "--smoke",
        "--samples",
        "tabular_regression,shakespeare_char",
        "--out",
        str(out),
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in out.read_text().splitlines()[3:]}
    others = {"config"} | {c.stem for c in (ROOT / "configs").glob("*.json")} - {
        "tabular_regression",
        "shakespeare_char",
    }
    assert {"tabular_regression", "shakespeare_char", "gpt2-small (toy)"} <= set(rows), rows
    assert not others & set(rows), rows
    for config in [ROOT / "configs" / "tabular_regression.json", ROOT / "configs" / "shakespeare_char.json"]:
        name = config.stem
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
    cuDNN's reason (no GPU here), both GPT-2 rows and two of its options (an override, XLA flags), and a profile
    whose kernels are named by the HLO they run."""
    out = tmp_path / "gpu.md"
    script = ROOT / "benchmarks" / "gpu_step_benchmark.py"
    command = [sys.executable, str(script), "--smoke", "--steps", "4", "--only", "parity,gpt2,gpt2-options,profile"]
    command += ["--gpt2-options", "vocab-128,triton-gemm-only"]
    done = subprocess.run([*command, "--out", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    assert re.search(r"\| plain bf16 \| dq \| \d\.\d\de-0[234] \|", text), text
    assert "| fused bf16 | failed: " in text
    assert re.search(r"\| template, attention auto \| [\d,]+ \|", text) and "attention plain" in text
    # a row each: the padded vocabulary trained, and jaxlib took the Triton flags (an unknown one aborts)
    for option in ("vocab-128", "triton-gemm-only"):
        assert re.search(rf"\| template, attention auto, {option} \| [\d,]+ \|", text), text
    assert re.search(r"profile of configs/shakespeare_char.json's step \(K = \d+\)", text)
    rows = re.findall(r"^\| (\S+) \| (\S+) \| [\d.]+ \| [\d.]+% \| \d+ \| (.+) \|$", text, flags=re.M)
    assert len(rows) == 10, text
    # each kernel found in the step's HLO; a fusion with what it fuses: its kind, result and ops with their types
    assert all(hlo != "-" for _, _, hlo in rows), rows
    fusions = [hlo for kernel, _, hlo in rows if "fusion" in kernel]
    assert fusions and all(re.match(r"k\w+ -> .+?: [a-z\-]+ [a-z]+\d*", hlo) for hlo in fusions), rows


def test_gpu_step_options_are_known_to_the_installed_jax():
    """Every gpt2 option's environment at once: XLA aborts on a flag it does not know, and JAX refuses an
    optimization level it does not have, so a misspelt option would cost its row on a lent GPU."""
    from benchmarks.gpu_step_benchmark import GPT2_OPTIONS

    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    for _, option_env in GPT2_OPTIONS.values():
        for name, value in option_env.items():
            env[name] = f"{env.get(name, '')} {value}".strip() if name == "XLA_FLAGS" else value
    assert "--xla_gpu" in env["XLA_FLAGS"] and env["JAX_OPTIMIZATION_LEVEL"]
    ask = "import jax; print(jax.jit(lambda x: x + 1)(1), jax.config.jax_optimization_level)"
    done = subprocess.run([sys.executable, "-c", ask], capture_output=True, text=True, env=env)
    assert done.returncode == 0 and done.stdout.split() == ["2", env["JAX_OPTIMIZATION_LEVEL"]], done.stderr[-2000:]


def test_gpu_step_resnet_table_gives_the_ratio_of_each_precision_or_why_not():
    from benchmarks.gpu_step_benchmark import tables

    run = {"images_per_s": 30000.0, "steps_per_call": 32}
    found = {
        "resnet": {
            "float32": {"template": [run], "torch-best": [{"images_per_s": 20000.0, "warm_up_s": 41.5}]},
            "bfloat16": {"bf16": [run]},  # PyTorch not installed: train_benchmark.py leaves its variants out
        }
    }
    text = tables(found, 100)
    assert "| float32 | 30,000 | 20,000 | 1.50 | 32 | 41.5 |" in text, text
    assert "| bfloat16 | 30,000 | not run (no PyTorch) | - | 32 | - |" in text, text
    assert "| float32 | failed: boom |" in tables({"resnet": {"float32": {"error": "boom"}}}, 100)
