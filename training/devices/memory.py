"""Whether a run can fit: the bytes its training state and a step's batches take on each device (known from
jax.eval_shape before anything is allocated) against the memory the devices have free. Only a lower bound is
compared (the step's temporaries come on top), so a refusal is certain and a pass is no promise."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

# Where the kernel shows this process's cgroups (a line per hierarchy: "ID:controllers:/path") and where the
# hierarchies are mounted: cgroup v2's unified one at the root, v1's memory controller in its own folder.
PROC_CGROUP = "/proc/self/cgroup"
CGROUP_ROOT = "/sys/fs/cgroup"
# (folder under the root, limit file, usage file) of each version; v1 writes "no limit" as a huge page-aligned
# number (2**63 rounded down to a page), which any comparison with real memory leaves aside.
CGROUP_FILES = {
    "v2": ("", "memory.max", "memory.current"),
    "v1": ("memory", "memory.limit_in_bytes", "memory.usage_in_bytes"),
}


def show_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:,.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024


def host_available(
    meminfo: str | Path = "/proc/meminfo", proc_cgroup: str | Path = PROC_CGROUP, cgroup_root: str | Path = CGROUP_ROOT
) -> tuple[int, str] | None:
    """Bytes this process can still take of the machine's memory, and where the figure comes from: the machine's
    available memory, or less where a memory cgroup of this process (``cgroup_available``) holds it to less."""
    found = []
    try:
        for line in Path(meminfo).read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append((int(line.split()[1]) * 1024, "the machine's available memory"))
    except (OSError, ValueError, IndexError):
        try:
            found.append((os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "the machine's free memory"))
        except (OSError, ValueError):
            pass
    cgroup = cgroup_available(proc_cgroup, cgroup_root)
    if cgroup is not None:
        found.append(cgroup)
    return min(found) if found else None


def cgroup_available(
    proc_cgroup: str | Path = PROC_CGROUP, cgroup_root: str | Path = CGROUP_ROOT
) -> tuple[int, str] | None:
    """Bytes this process's memory cgroups leave it (limit less usage), the least of its own group and every group
    above it, or None where none sets a limit. A SLURM job or a ``systemd-run -p MemoryMax=`` puts the process in a
    group of its own, nested below the root, whose limit the root's files do not show: the group comes from
    /proc/self/cgroup, cgroup v2's line ("0::/path") and v1's memory line ("N:...memory...:/path") alike. A group
    whose folder is not there (a container that mounts its own group as the root) is looked for up the tree, so the
    root's files are read at least."""
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        lines = ["0::/"]  # no /proc: the root's own files, as before the process's group was known
    found = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, group = parts
        version = "v2" if controllers == "" else "v1" if "memory" in controllers.split(",") else None
        if version is None:
            continue
        folder, limit_name, usage_name = CGROUP_FILES[version]
        mount = Path(cgroup_root) / folder
        names = [n for n in group.split("/") if n and n not in (".", "..")]
        for depth in range(len(names), -1, -1):  # the process's own group first, then each one above it
            level = mount.joinpath(*names[:depth])
            try:
                limit = (level / limit_name).read_text().strip()
                usage = int((level / usage_name).read_text())
            except (OSError, ValueError):
                continue
            if limit.isdigit():  # "max" (v2): no limit at this level
                where = "/".join(names[:depth]) or "the root"
                found.append((int(limit) - usage, f"the memory limit of this process's cgroup ({where})"))
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


def refusal(parts: dict[str, int], devices, when: str = "before any activation") -> str | None:
    """Why `parts` (bytes per device, by what they are) cannot fit on `devices` (this process's), or None. CPU
    devices share the machine's memory. `when`: what the figures leave out, or say they come from."""
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
                f"needs {show_bytes(need)}{each} {when} ({listed}), more than the "
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


def check_compiled(stats, devices) -> None:
    """A ValueError naming the figures when the compiled training call's own memory (XLA's analysis of the
    executable, per device: `stats` from ``Compiled.memory_analysis()``) exceeds what the `devices` have free. Unlike
    ``check_fits`` this counts the step's temporaries (activations kept for the backward pass, gradients), known only
    once it compiled; outputs written over donated arguments (aliased) are not counted twice, nor the arguments
    themselves: the state is in memory by now (what is free no longer holds it), and ``check_fits`` counted it and
    the batches before it was. None: no figures."""
    if stats is None:
        return
    parts = {
        "outputs": max(stats.output_size_in_bytes - stats.alias_size_in_bytes, 0),
        "temporaries": stats.temp_size_in_bytes,
        "code": stats.generated_code_size_in_bytes,
    }
    reason = refusal(parts, devices, when="by XLA's memory analysis of the compiled training step")
    if reason:
        raise ValueError(
            f"this run {reason}: lower the batch size or trainer.steps_per_call, make the model smaller (model.args) "
            "or split the batch over more devices; nothing was written"
        )


def nbytes(spec) -> int:
    """Bytes of a batch from its spec (any pytree of arrays or ShapeDtypeStructs)."""
    import jax

    return sum(math.prod(leaf.shape) * np.dtype(leaf.dtype).itemsize for leaf in jax.tree.leaves(spec))
