"""Platform defaults that make training faster where they were measured to, set before JAX starts.

On Linux with JAX's CPU backend (`benchmarks/` measures each of these on and off):

- ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``: every XLA:CPU call allocates its large temporaries afresh and glibc
  serves them with mmap, so each call faults in and zeroes tens of MB again; transparent huge pages cut those faults
  ~20x. glibc reads the variable only when a process starts, so ``apply()`` re-executes the process once with it.
- ``XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type=reduce``: XLA:CPU's YNNPACK fusions only for reductions. Its
  default also fuses matrix products and elementwise code, materialising broadcasts and slices around them (up to
  3x slower here); turning YNNPACK off entirely makes the column sums of bias gradients ~20x slower.

Nothing is changed when JAX will use an accelerator (``JAX_PLATFORMS`` names another platform first, or a GPU/TPU
plugin is installed), when the user already set the variable or flag, or with ``TRAIN_PLATFORM_DEFAULTS=0``.
Stdlib only: this runs before anything imports JAX.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import pkgutil
import sys
import time

SWITCH = "TRAIN_PLATFORM_DEFAULTS"  # "0" turns every default off
_REEXECUTED = "_TRAIN_PLATFORM_REEXECUTED"
_STARTED = "_TRAIN_STARTED_AT"
HUGETLB = "glibc.malloc.hugetlb=1"
# Measured with jaxlib 0.10; XLA aborts on flags it does not know, so other versions get none.
XLA_CPU_FLAGS = {"0.10": ("--xla_cpu_experimental_ynn_fusion_type=reduce",)}
ACCELERATOR_MODULES = ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm60_plugin", "jax_rocm7_plugin", "libtpu")

# Wall-clock start of the run, carried across the re-execution so that start-up time is measured from the command.
STARTED_AT = float(os.environ.get(_STARTED, time.time()))


def cpu_backend_expected(environ=os.environ) -> bool:
    """Whether JAX will run on the CPU: judged without importing JAX (which would fix its flags too early)."""
    platforms = environ.get("JAX_PLATFORMS", "").strip().lower()
    if platforms:
        return platforms.split(",")[0] == "cpu"
    if any(importlib.util.find_spec(name) for name in ACCELERATOR_MODULES):
        return False
    plugins = importlib.util.find_spec("jax_plugins")  # where PJRT plugins (CUDA, ROCm, ...) register themselves
    return plugins is None or not any(pkgutil.iter_modules(plugins.submodule_search_locations or []))


def jaxlib_series() -> str | None:
    try:
        return ".".join(importlib.metadata.version("jaxlib").split(".")[:2])
    except importlib.metadata.PackageNotFoundError:
        return None


def defaults(environ=os.environ, platform: str = sys.platform, cpu: bool | None = None,
             series: str | None = None) -> dict[str, str]:
    """The environment variables to set (name -> new value); empty where nothing applies."""
    if environ.get(SWITCH, "1") == "0" or not platform.startswith("linux"):
        return {}
    if not (cpu_backend_expected(environ) if cpu is None else cpu):
        return {}
    changes = {}
    tunables = environ.get("GLIBC_TUNABLES", "")
    if "glibc.malloc.hugetlb" not in tunables:
        changes["GLIBC_TUNABLES"] = f"{tunables}:{HUGETLB}" if tunables else HUGETLB
    flags = environ.get("XLA_FLAGS", "")
    new_flags = [f for f in XLA_CPU_FLAGS.get(series or jaxlib_series() or "", ())
                 if f.split("=")[0] not in flags]
    if new_flags:
        changes["XLA_FLAGS"] = " ".join([flags, *new_flags]).strip()
    return changes


def apply() -> None:
    """Sets the defaults for this process; re-executes it once if glibc must see a new tunable at start-up."""
    changes = defaults()
    if not changes:
        return
    os.environ.update(changes)
    if "GLIBC_TUNABLES" in changes and not os.environ.get(_REEXECUTED):
        os.environ[_REEXECUTED] = "1"
        os.environ[_STARTED] = repr(STARTED_AT)
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, sys.orig_argv)


def describe(environ=os.environ) -> str:
    """What is in effect, for the run's log."""
    if environ.get(SWITCH, "1") == "0":
        return f"off ({SWITCH}=0)"
    shown = [f"{name}={environ[name]}" for name in ("GLIBC_TUNABLES", "XLA_FLAGS") if environ.get(name)]
    return ", ".join(shown) or "none"
