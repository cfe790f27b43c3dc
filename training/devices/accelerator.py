"""The JAX build this machine calls for, from what the operating system shows (JAX is not asked, nor installed yet):
the Makefile runs ``python3 -m training.devices.accelerator`` with the system's Python before it installs anything,
and installs ``requirements-<the answer>.txt`` (``requirements.txt`` for "cpu"). Standard library only."""

from __future__ import annotations

import glob
import os
import shutil


def machine_accelerator(environ=os.environ) -> str:
    """The answer: "cuda12" where an NVIDIA driver is visible (``nvidia-smi`` on PATH or /dev/nvidia0), "tpu" on a
    Cloud TPU VM (its chips are /dev/accel0, ... up to TPU v4 and /dev/vfio/0, ... from v5e on), else "cpu". CUDA 13
    (driver 580 or newer) only when asked for: ``make train ACCEL=cuda13``."""
    if shutil.which("nvidia-smi", path=environ.get("PATH")) or os.path.exists("/dev/nvidia0"):
        return "cuda12"
    if glob.glob("/dev/accel[0-9]*") or glob.glob("/dev/vfio/[0-9]*"):
        return "tpu"
    return "cpu"


if __name__ == "__main__":
    print(machine_accelerator())
