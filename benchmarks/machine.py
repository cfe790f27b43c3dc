"""Where a benchmark ran and against what: the CPU by name, its cores and load, and its measured matmul peak.

A throughput means little without the machine it was measured on, and a ratio to the machine's own matrix-product
rate is comparable across machines. ``matmul_peak`` times a square float32 product (best of ``reps``) with JAX,
NumPy and, when it is installed, PyTorch, in the calling process.
"""

from __future__ import annotations

import os
import platform as host
import shutil
import subprocess
import time
from importlib import metadata
from pathlib import Path

PEAK_SIZE = 4096  # the figures: 4096 x 4096 float32, best of 5
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile")  # what decides which kernels XLA and oneDNN pick


def cpu_fields(cpuinfo: str) -> dict:
    """The first processor's "model name", vendor, family, model and flags from /proc/cpuinfo text."""
    fields = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's name as the kernel reports it ("AMD EPYC 9B45", "Intel(R) Xeon(R) ..."), with its vendor's family
    and model numbers (a virtual machine may show only "AMD EPYC") and the vector extensions present."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    fields = cpu_fields(cpuinfo)
    name = fields.get("model name") or lscpu_model() or host.processor() or host.machine()
    details = [f"family {fields['cpu family']} model {fields['model']}"] if "cpu family" in fields else []
    flags = set(fields.get("flags", "").split())
    if flags:
        details.append("+".join(f for f in ISA_FLAGS if f in flags) or "no avx2")
    return f"{name} ({', '.join(details)})" if details else name


def lscpu_model() -> str | None:
    if not shutil.which("lscpu"):
        return None
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    names = [line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")]
    return names[0] if names else None


def load_average() -> str:
    """`uptime`'s three load averages (1, 5, 15 minutes)."""
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def jax_version() -> str:
    """The installed jax and jaxlib, read without importing JAX (a benchmark's parent process stays light)."""
    try:
        return f"jax {metadata.version('jax')} (jaxlib {metadata.version('jaxlib')})"
    except metadata.PackageNotFoundError:
        return "jax not installed"


def describe() -> str:
    """The CPU by name, its cores, and the JAX it runs: the line every benchmark starts with."""
    return f"{cpu_model()}, {os.cpu_count()} cores, {jax_version()}"


def best_rate(fn, flops: float, reps: int) -> float:
    """GFLOP/s of the fastest of ``reps`` calls of ``fn`` (after one warm-up call)."""
    fn()
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return flops / best / 1e9


def matmul_peak(size: int = PEAK_SIZE, reps: int = 5) -> dict:
    """GFLOP/s of a (size x size) @ (size x size) float32 product: "jax", "numpy", and "torch" when importable
    (all cores)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    flops = 2.0 * size**3
    a, b = (np.random.default_rng(i).standard_normal((size, size)).astype(np.float32) for i in (0, 1))
    ja, jb = jax.device_put(a), jax.device_put(b)
    product = jax.jit(jnp.matmul)
    rates = {
        "jax": best_rate(lambda: product(ja, jb).block_until_ready(), flops, reps),
        "numpy": best_rate(lambda: a @ b, flops, reps),
    }
    try:
        import torch
    except ImportError:
        return rates
    torch.set_num_threads(os.cpu_count())
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    rates["torch"] = best_rate(lambda: ta @ tb, flops, reps)
    return rates


def fraction_of_peak(rate: float, flop_per_item: float, peak_gflops: float) -> float:
    """The share of the matmul peak that ``rate`` items/s at ``flop_per_item`` FLOP each amount to."""
    return rate * flop_per_item / (peak_gflops * 1e9)
