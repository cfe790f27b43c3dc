"""Model FLOP utilisation (MFU): the FLOP/s a run's model performs against the peak of the devices it runs on.

``utilization = XLA's FLOP estimate per training example x examples per second / (peak per device x devices)``, the
definition of PaLM (Chowdhery et al. 2022, appendix B) with XLA's count of the step as lowered (before XLA's passes,
so the model's FLOPs on any backend and device count; ``step_flops``) instead of a formula. The count takes a second
lowering of the step (seconds for a large model, on a worker thread while the step compiles), made only where the
devices' peak is known or when asked (``Trainer(count_flops=True)``): on a CPU there is no MFU to report.
The peaks are the vendors' dense (no structured sparsity) tensor rates per device (one GPU, one TPU chip), in FLOP/s:

- NVIDIA H100 SXM / PCIe / NVL, H200 SXM / NVL: the H100 and H200 datasheets (nvidia.com/en-us/data-center/h100,
  /h200), whose tables give the sparse rates: the dense rate is half;
- NVIDIA A100 (SXM and PCIe, 40 and 80 GB): the A100 datasheet (nvidia.com/en-us/data-center/a100);
- NVIDIA L4: the L4 datasheet (nvidia.com/en-us/data-center/l4);
- Google TPU v4, v5e, v5p, v6e (Trillium): the per-chip bfloat16 figures of cloud.google.com/tpu/docs/v4, /v5e,
  /v5p and /v6e.

"float32" is the rate XLA's default precision gets for float32 matrix products: TF32 tensor cores on these GPUs,
one bfloat16 pass on TPUs (so the bfloat16 rate). A device not in the table (the CPU, any other) has no peak: its
utilization is reported as "unknown".
"""

from __future__ import annotations

import re

import jax

TERA = 1e12

# (pattern on the lowercased device kind, name, {compute dtype: dense peak FLOP/s}); the first match wins, so the
# variants come before their family
PEAKS: tuple[tuple[str, str, dict[str, float]], ...] = (
    (r"h100.*pcie", "H100 PCIe", {"bfloat16": 756.5 * TERA, "float32": 378.0 * TERA}),
    (r"h100.*nvl", "H100 NVL", {"bfloat16": 835.5 * TERA, "float32": 417.5 * TERA}),
    (r"h100", "H100 SXM", {"bfloat16": 989.5 * TERA, "float32": 494.5 * TERA}),
    (r"h200.*nvl", "H200 NVL", {"bfloat16": 835.5 * TERA, "float32": 417.5 * TERA}),
    (r"h200", "H200 SXM", {"bfloat16": 989.5 * TERA, "float32": 494.5 * TERA}),
    (r"a100", "A100", {"bfloat16": 312.0 * TERA, "float32": 156.0 * TERA}),
    (r"\bl4\b", "L4", {"bfloat16": 121.0 * TERA, "float32": 60.0 * TERA}),
    (r"tpu v4", "TPU v4", {"bfloat16": 275.0 * TERA, "float32": 275.0 * TERA}),
    (r"tpu v5 ?(lite|e)", "TPU v5e", {"bfloat16": 197.0 * TERA, "float32": 197.0 * TERA}),
    (r"tpu v5", "TPU v5p", {"bfloat16": 459.0 * TERA, "float32": 459.0 * TERA}),
    (r"tpu v6 ?(lite|e)", "TPU v6e", {"bfloat16": 918.0 * TERA, "float32": 918.0 * TERA}),
)


def peak_flops(device_kind: str, compute: str) -> float | None:
    """One device's dense peak FLOP/s for `compute` ("float32", "bfloat16" or "float16": the tensor cores' half
    precision rate is bfloat16's), or None when the device is not in the table."""
    kind = device_kind.lower()
    for pattern, _, peaks in PEAKS:
        if re.search(pattern, kind):
            return peaks["float32" if compute == "float32" else "bfloat16"]
    return None


def step_flops(fn, *args) -> float | None:
    """XLA's FLOP count of `fn` (a training call) on abstract `args`, as lowered for CUDA before XLA's passes: the
    model's FLOPs for the whole batch, the same on every backend and device count; None where it cannot be had
    (JAX_PLATFORMS without "cpu", a step that does not lower for CUDA here).

    Lowered without shardings on the host's CPU device, since JAX counts a lowered module with the backend it was
    lowered on and only the CPU client implements that count (``Lowered.cost_analysis``; the GPU and TPU plugins do
    not). A compiled program's count is not the model's: on an H100 the compiled GPT-2-small step counted about a
    sixth of the FLOPs of its lowered form (which match 6N + 12LHQT, PaLM's formula), and with several devices it
    counts one device's share plus the partitioner's work. Lowered for CUDA, not the CPU, since model/kernels' XLA:CPU
    formulations do work that is not the model's (ConvNeXt's depthwise convolutions as shifted slices: +24%).
    """
    try:
        plain = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), args)
        with jax.default_device(jax.devices("cpu")[0]):
            lowered = jax.jit(fn).trace(*plain).lower(lowering_platforms=("cuda",))
            return float(lowered.cost_analysis()["flops"])
    except (ImportError, AttributeError, NotImplementedError, RuntimeError, KeyError, TypeError, ValueError):
        return None


def utilization(flops_per_example: float | None, examples_per_s: float, peak_per_device: float | None, devices: int):
    """(model FLOP/s, utilization): the utilization is "unknown" without a peak, both are without a FLOP count."""
    if flops_per_example is None:
        return "unknown", "unknown"
    flops = flops_per_example * examples_per_s
    return flops, ("unknown" if peak_per_device is None else flops / (peak_per_device * devices))
