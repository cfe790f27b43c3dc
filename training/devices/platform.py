"""Platform defaults that make training faster where they were measured to (`benchmarks/train_benchmark.py`,
`benchmarks/cpu_step_benchmark.py`).

On Linux with JAX's CPU backend:

- ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``, set before the process starts: every XLA:CPU call allocates its large
  temporaries afresh and glibc serves them with mmap, so each call faults in and zeroes tens of MB again;
  transparent huge pages cut those faults by an order of magnitude. glibc reads the variable only at start-up, so
  ``apply()``, called first thing in ``train.py``, re-executes the process once with it.
- XLA:CPU options per executable (``xla_options``), jaxlib 0.10 and 0.12: the training step keeps XLA's YNNPACK
  fusions for reductions only (its default also fuses elementwise code and materialises broadcasts and slices around
  it; with none, the column sums of bias gradients are far slower). On jaxlib 0.12 a step with no convolution (a
  transformer's, an MLP's) also has YNNPACK take its matrix products, which paid there and cost the ConvNeXt sample's
  step (``train_kind`` reads the lowered program), and every step, evaluation's too, prefers 512-bit vectors where
  the CPU has them. The evaluation step, where no such sums arise, runs without YNNPACK's fusions (faster for the
  ConvNeXt sample's forward pass). The initialisation, which runs once, is compiled without optimisation where its
  state is small (``INIT_UNOPTIMISED_BYTES``). Figures: benchmarks/README.md.

Nothing is changed when JAX will use an accelerator (``JAX_PLATFORMS`` names another platform first, or a GPU/TPU
plugin is installed), when the user set ``GLIBC_TUNABLES`` or ``XLA_FLAGS`` themselves, or with
``TRAIN_PLATFORM_DEFAULTS=0``. Standard library only: ``apply()`` runs before anything imports JAX.

``unused_accelerator()`` is train.py's warning when JAX ignores the accelerator the machine shows
(``training/devices/accelerator.py``, which also tells the Makefile what to install).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import pkgutil
import sys
import time

from training.devices.accelerator import machine_accelerator

SWITCH = "TRAIN_PLATFORM_DEFAULTS"  # "0" turns every default off
HUGETLB = "glibc.malloc.hugetlb=1"
_REEXECUTED = "_TRAIN_PLATFORM_REEXECUTED"
_STARTED = "_TRAIN_STARTED_AT"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ACCELERATOR_MODULES = ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm60_plugin", "jax_rocm7_plugin", "libtpu")
# XLA rejects options it does not know, so they apply to the jaxlib series they were measured with only.
XLA_CPU_OPTIONS = {
    "0.10": {
        "train": {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_REDUCE"},
        "eval": {"xla_cpu_experimental_ynn_fusion_type": ""},
        "init": {"xla_backend_optimization_level": 0},
    }  # runs once: compiles in 1.0 s instead of 2.5 s
}
# Unfused, the initialisation's run costs about 7 ns per byte of the state it makes (GPT-2 small's 1 GB: 7 s, against
# 0.8 s optimised, every run, the compile cached or not); past this size that outweighs the ~1.5 s its compile saves.
INIT_UNOPTIMISED_BYTES = 64 * 2**20
XLA_CPU_OPTIONS["0.10"]["train without convolutions"] = XLA_CPU_OPTIONS["0.10"]["train"]
# jaxlib 0.12: benchmarks/README.md, "XLA:CPU options by program", has the measurements that decided these.
XLA_CPU_OPTIONS["0.12"] = {
    **XLA_CPU_OPTIONS["0.10"],
    "train": {**XLA_CPU_OPTIONS["0.10"]["train"], "xla_cpu_prefer_vector_width": 512},
    "eval": {**XLA_CPU_OPTIONS["0.10"]["eval"], "xla_cpu_prefer_vector_width": 512},
    "train without convolutions": {
        "xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_DOT,LIBRARY_FUSION_TYPE_REDUCE",
        "xla_cpu_prefer_vector_width": 512,
    },
}

# Wall-clock start of the command, carried across the re-execution: start-up time is measured from here.
STARTED_AT = float(os.environ.get(_STARTED, time.time()))


def enabled(environ=os.environ) -> bool:
    return environ.get(SWITCH, "1") != "0"


def cpu_backend_expected(environ=os.environ) -> bool:
    """Whether JAX will run on the CPU, judged without importing JAX (which would read its flags too early)."""
    platforms = environ.get("JAX_PLATFORMS", "").strip().lower()
    if platforms:
        return platforms.split(",")[0] == "cpu"
    if any(importlib.util.find_spec(name) for name in ACCELERATOR_MODULES):
        return False
    plugins = importlib.util.find_spec("jax_plugins")  # where PJRT plugins (CUDA, ROCm, ...) register themselves
    return plugins is None or not any(pkgutil.iter_modules(plugins.submodule_search_locations or []))


def unused_accelerator(platforms: set[str], environ=os.environ) -> str | None:
    """A warning naming the install that fixes it when the machine shows an accelerator but JAX, given no
    JAX_PLATFORMS, found only CPU devices (``platforms``): its plugin is missing, so the run is on the CPU."""
    wanted = machine_accelerator(environ)
    if wanted == "cpu" or platforms != {"cpu"} or environ.get("JAX_PLATFORMS", "").strip():
        return None
    shown = "a TPU" if wanted == "tpu" else "an NVIDIA GPU"
    requirements = os.path.relpath(os.path.join(REPO, f"requirements-{wanted}.txt"))
    return (
        f"warning: this machine shows {shown} but JAX runs on the CPU only; install JAX for it: "
        f"{sys.executable} -m pip install -r {requirements}"
    )


def process_defaults(environ=os.environ, platform: str = sys.platform, cpu: bool | None = None) -> dict[str, str]:
    """Environment variables to set before the process starts (name -> value); empty where nothing applies."""
    if not enabled(environ) or not platform.startswith("linux") or "GLIBC_TUNABLES" in environ:
        return {}
    if not (cpu_backend_expected(environ) if cpu is None else cpu):
        return {}
    return {"GLIBC_TUNABLES": HUGETLB}


def apply() -> None:
    """Sets the process defaults, re-executing the process once (same interpreter and arguments) if needed."""
    changes = process_defaults()
    if not changes or os.environ.get(_REEXECUTED):
        return
    os.environ.update(changes)
    os.environ[_REEXECUTED] = "1"
    os.environ[_STARTED] = repr(STARTED_AT)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, sys.orig_argv)


def jaxlib_series() -> str | None:
    try:
        return ".".join(importlib.metadata.version("jaxlib").split(".")[:2])
    except importlib.metadata.PackageNotFoundError:
        return None


def xla_options(kind: str, backend: str, environ=os.environ, series: str | None = None) -> dict[str, str]:
    """Compiler options for the ``"train"`` (``train_kind``), ``"eval"`` or ``"init"`` executable on ``backend``."""
    if not enabled(environ) or backend != "cpu" or environ.get("XLA_FLAGS"):
        return {}
    return dict(XLA_CPU_OPTIONS.get(series or jaxlib_series() or "", {}).get(kind, {}))


def init_options(state_bytes: int, backend: str, environ=os.environ) -> dict[str, str]:
    """Compiler options for the initialisation of a state of `state_bytes`: ``"init"``'s below
    INIT_UNOPTIMISED_BYTES, XLA's own above."""
    return xla_options("init", backend, environ) if state_bytes < INIT_UNOPTIMISED_BYTES else {}


def train_kind(lowered, backend: str) -> str:
    """The options' kind for a training step, from its ``jax.stages.Lowered`` program: ``"train"``, or ``"train
    without convolutions"`` where the CPU's step has none."""
    if backend != "cpu" or "stablehlo.convolution" in lowered.as_text():
        return "train"
    return "train without convolutions"


def describe(backend: str, environ=os.environ, train: str = "train") -> str:
    """What is in effect, for the run's log (``train``: the training step's kind of options)."""
    if not enabled(environ):
        return f"off ({SWITCH}=0)"
    parts = [f"GLIBC_TUNABLES={environ['GLIBC_TUNABLES']}"] if environ.get("GLIBC_TUNABLES") else []
    for kind in (train, "eval"):
        if options := xla_options(kind, backend, environ):
            parts.append(f"{kind}: " + ", ".join(f"{k}={v!r}" for k, v in options.items()))
    return "; ".join(parts) or "none"
