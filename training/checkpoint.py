"""Checkpoints: arrays by key path in a safetensors file plus a JSON header; written atomically, never pickled.

A checkpoint is a dict of pytrees (``{"params": ..., "state": ..., "opt_state": ..., "rng": ...}``) flattened to
``params.blocks.1.norm.scale``-style names. Reading needs a template tree of the same structure (built from the
config with ``jax.eval_shape``, no compute): every path, shape and dtype is checked against it and all differences
are reported together. Nothing falls back silently to fresh weights.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import jax
import numpy as np

from model.modules.module import key_path_str

FORMAT_VERSION = 1


class CheckpointError(Exception):
    pass


def flatten(tree: Any) -> dict[str, Any]:
    leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {key_path_str(path): leaf for path, leaf in leaves}


def encode(tree: dict, header: dict | None = None) -> bytes:
    """The checkpoint file's bytes: every leaf by key path, and the header as JSON metadata."""
    from safetensors.numpy import save as to_bytes

    arrays = {name: np.asarray(leaf) for name, leaf in flatten(jax.device_get(tree)).items()}
    meta = dict(header or {})
    meta.update(format_version=FORMAT_VERSION, treedef=str(jax.tree_util.tree_structure(tree)))
    return to_bytes(arrays, metadata={"header": json.dumps(meta)})


def write_atomic(path: str | Path, payload: bytes) -> None:
    """Temporary file in the same folder, fsync, rename: a reader sees the old file or the new one, never half."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def save(path: str | Path, tree: dict, header: dict | None = None) -> None:
    write_atomic(path, encode(tree, header))


def read(path: str | Path) -> tuple[dict[str, np.ndarray], dict]:
    """The raw arrays by name and the header."""
    from safetensors import SafetensorError
    from safetensors.numpy import load as from_bytes

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    data = path.read_bytes()
    try:
        arrays = from_bytes(data)
        header_len = int.from_bytes(data[:8], "little")
        meta = json.loads(data[8:8 + header_len]).get("__metadata__", {})
        header = json.loads(meta["header"])
    except (SafetensorError, ValueError, KeyError, UnicodeDecodeError, OverflowError) as error:
        raise CheckpointError(f"{path}: not a readable checkpoint (truncated or corrupt?): {error}") from None
    if header.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{path}: format version {header.get('format_version')}, expected {FORMAT_VERSION}")
    return arrays, header


def restore(path: str | Path, template: dict, only: tuple[str, ...] | None = None,
            exclude: tuple[str, ...] = ()) -> tuple[dict, dict]:
    """Fills `template` (arrays or ShapeDtypeStructs) from the file; `only` restricts to top-level keys. Key paths
    under an `exclude` prefix (``params.head``) keep the template's values, which must then be arrays."""
    arrays, header = read(path)
    if only is not None:
        template = {k: template[k] for k in only}
        arrays = {n: a for n, a in arrays.items() if n.split(".", 1)[0] in only}
    excluded = lambda name: any(name == p or name.startswith(p + ".") for p in exclude)  # noqa: E731
    leaves, treedef = jax.tree_util.tree_flatten_with_path(template)
    likes = {key_path_str(p): like for p, like in leaves}
    unused = [p for p in exclude if not any(n == p or n.startswith(p + ".") for n in likes)]
    if unused:
        layers = sorted({".".join(n.split(".")[:2]) for n in likes})
        raise CheckpointError(f"exclude {unused[0]!r}: no such key path in the model; its layers: {', '.join(layers)}")
    fresh = {n for n in likes if excluded(n)}
    arrays = {n: a for n, a in arrays.items() if not excluded(n)}
    problems = [f"missing {n}" for n in likes if n not in arrays and n not in fresh]
    problems += [f"unexpected {n}" for n in sorted(set(arrays) - set(likes))]
    for name, like in likes.items():
        if name in arrays:
            got = arrays[name]
            if tuple(got.shape) != tuple(like.shape) or got.dtype != np.dtype(like.dtype):
                problems.append(f"{name}: file has {got.dtype}{list(got.shape)}, "
                                f"model expects {np.dtype(like.dtype)}{list(like.shape)}")
    if problems:
        shown = "; ".join(problems[:8]) + (f"; ... {len(problems) - 8} more" if len(problems) > 8 else "")
        raise CheckpointError(f"{path}: does not match the model/optimizer of this config: {shown}")
    values = [likes[n] if n in fresh else arrays[n] for n in likes]
    return jax.tree_util.tree_unflatten(treedef, values), header


def of_run(path: str | Path) -> Path:
    """A checkpoint file itself, or a run folder's best checkpoint (``model_best.params``; its
    ``checkpoint-latest.params`` when the run monitors nothing and so has no best)."""
    path = Path(path)
    if not path.is_dir():
        return path
    best = path / "model_best.params"
    return best if best.is_file() or not (path / "checkpoint-latest.params").is_file() else \
        path / "checkpoint-latest.params"
