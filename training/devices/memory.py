"""Whether a run can fit: the bytes its training state and a step's batches take on each device (known from
jax.eval_shape before anything is allocated) against the memory the devices have free. Only a lower bound is
compared (the step's temporaries come on top), so a refusal is certain and a pass is no promise."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

# (limit, usage) files of the process's memory cgroup: v2, then v1 (a container's limit is below the machine's)
CGROUP_FILES = (
    ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
    ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
)


def show_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:,.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024


def host_available() -> tuple[int, str] | None:
    """Bytes this process can still take of the machine's memory, and where the figure comes from."""
    found = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append((int(line.split()[1]) * 1024, "the machine's available memory"))
    except (OSError, ValueError, IndexError):
        try:
            found.append((os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "the machine's free memory"))
        except (OSError, ValueError):
            pass
    for limit_file, usage_file in CGROUP_FILES:
        try:
            limit, usage = Path(limit_file).read_text().strip(), int(Path(usage_file).read_text())
        except (OSError, ValueError):
            continue
        if limit.isdigit():
            found.append((int(limit) - usage, "the memory limit of this process's cgroup"))
        break
    return min(found) if found else None


def device_available(device) -> tuple[int, str] | None:
    """Bytes free on an accelerator (its allocator's limit less what is in use); None where it does not say."""
    try:
        stats = device.memory_stats()
    except Exception:  # noqa: BLE001 (a backend without statistics)
        return None
    if not stats or "bytes_limit" not in stats:
        return None
    return stats["bytes_limit"] - stats.get("bytes_in_use", 0), f"{device.device_kind} memory free"


def shard_bytes(tree, sharding) -> int:
    """Bytes one device holds of an abstract tree: `sharding` one for every leaf, or a tree of them."""
    import jax

    leaves = jax.tree.leaves(tree)
    shardings = [sharding] * len(leaves) if hasattr(sharding, "shard_shape") else jax.tree.leaves(sharding)
    return sum(
        math.prod(s.shard_shape(tuple(leaf.shape))) * np.dtype(leaf.dtype).itemsize
        for leaf, s in zip(leaves, shardings)
    )


def refusal(parts: dict[str, int], devices) -> str | None:
    """Why `parts` (bytes per device, by what they are) cannot fit on `devices` (this process's), or None. CPU
    devices share the machine's memory."""
    need = sum(parts.values())
    cpus = [d for d in devices if d.platform == "cpu"]
    pools = ([(need * len(cpus), host_available(), len(cpus))] if cpus else []) + [
        (need, device_available(d), 1) for d in devices if d.platform != "cpu"
    ]
    for total, available, count in pools:
        if available is not None and total > available[0]:
            each = f" on each of {count} devices" if count > 1 else ""
            listed = ", ".join(f"{name} {show_bytes(n)}" for name, n in parts.items() if n)
            return (
                f"needs {show_bytes(need)}{each} before any activation ({listed}), more than the "
                f"{show_bytes(max(available[0], 0))} of {available[1]}"
            )
    return None


def check_fits(template: dict, shardings: dict, batches: str, batch_bytes: int, devices) -> None:
    """A ValueError naming the numbers when a training state (its abstract value `template`, placed by `shardings`)
    with its gradients, plus `batch_bytes` of `batches` per device, exceed what the `devices` have free."""
    held = {key: shard_bytes(value, shardings[key]) for key, value in template.items()}
    parts = {
        "parameters": held["params"],
        "their gradients": held["params"],
        "optimizer state": held["opt_state"],
        "other state": sum(held.values()) - held["params"] - held["opt_state"],
        batches: batch_bytes,
    }
    reason = refusal(parts, devices)
    if reason:
        hint = (
            "lower trainer.accumulate_steps, trainer.steps_per_call or the batch size"
            if max(parts, key=parts.get) == batches
            else "make the model smaller (model.args) or split it over more devices (mesh.fsdp)"
        )
        raise ValueError(f"this run {reason}: {hint}; nothing was written")


def nbytes(spec) -> int:
    """Bytes of a batch from its spec (any pytree of arrays or ShapeDtypeStructs)."""
    import jax

    return sum(math.prod(leaf.shape) * np.dtype(leaf.dtype).itemsize for leaf in jax.tree.leaves(spec))
