"""Sharded checkpoints: a run of several processes saves without gathering anything to one host.

Every process writes the distinct shards it holds (``addressable_shards`` with ``replica_id`` 0: a replicated leaf
is written once, by the process holding its first copy) into one file of the one-file checkpoint's format,
``shards/<tag>.<process>.shard``, and reports what it wrote (each piece's corner and crc32) through the coordinator's
key-value store. Process 0, once every process has reported, writes the index, a file of that same format at the
checkpoint's name (``checkpoint-latest.params``...) holding the header of today plus ``shards``: the files, and
every leaf's dtype, global shape and pieces. The index's rename is the commit: a save cut short anywhere (a process
killed while writing its file, or before the index) leaves the previous index, and the files it names, in place.
``training/run/checkpoint.py`` reads both kinds.

A shard file is never renamed over one an index names: each save has its own tag (its step and a random word from
process 0). Once an index is committed, process 0 deletes the shard files no index of the run folder names (the
previous save's, and those of a save a kill cut short). An index names its files relative to its folder: copy the
folder whole, or merge the checkpoint into one file to share it:

    python -m training.run.shards --merge saved/NAME/RUN [--out FILE]
"""

from __future__ import annotations

import json
import secrets
import sys
from pathlib import Path

import jax
import numpy as np

from files.writes import UnsafeFile
from training.devices import mesh
from training.run import checkpoint

SHARDS = "shards"


def corner(index: tuple, shape: tuple) -> tuple[list[int], list[int]]:
    """A shard's (start, stop) in its global array, from the slices ``Shard.index`` gives."""
    bounds = [s.indices(n)[:2] for s, n in zip(index, shape)]
    return [a for a, _ in bounds], [b for _, b in bounds]


def take(tree: dict) -> tuple[dict[str, np.ndarray], dict[str, list]]:
    """This process's part of `tree`, copied to host memory (the step's buffers go on with the next step): its
    distinct pieces by name, and every leaf's [dtype, global shape] (the same on every process)."""
    pieces, leaves, shards = {}, {}, []
    for name, leaf in checkpoint.flatten(tree).items():
        if isinstance(leaf, jax.Array):
            leaves[name] = [np.dtype(leaf.dtype).name, list(leaf.shape)]
            for shard in leaf.addressable_shards:
                start, stop = corner(shard.index, leaf.shape)
                if shard.replica_id == 0 and all(a < b for a, b in zip(start, stop)):
                    shards.append((checkpoint.piece_name(name, start), shard.data))
        else:  # a host value (a count, say): the same on every process, written by process 0
            host = np.asarray(leaf)
            leaves[name] = [host.dtype.name, list(host.shape)]
            if jax.process_index() == 0 and host.size:
                pieces[checkpoint.piece_name(name, [0] * host.ndim)] = np.array(host)
    copies = jax.device_get([data for _, data in shards])  # one transfer for all of them
    pieces.update({name: np.array(copy) for (name, _), copy in zip(shards, copies)})
    return pieces, leaves


def new_tag(step: int, count: int) -> str:
    """The tag of a save's files, the same on every process: process 0's, shared (a collective moment: every process
    saves at the same step). ``count``: this run's saves so far, naming the store's key."""
    mine = f"step_{step}-{secrets.token_hex(4)}" if mesh.is_main() else None
    return mesh.share_text(f"checkpoint-{count}", mine)


def gather(name: str, text: str) -> list[str] | None:
    if jax.process_count() == 1:
        return [text]
    return mesh.team.gather_texts(name, text)


def write(run_dir: Path, tag: str, part: tuple[dict, dict], header: dict, publish=None) -> bytes | None:
    """Writes this process's file of the save `tag` and reports it; on process 0, once every process has, returns
    the index's bytes (None on the others). A process that could not write says so in its report, and process 0
    raises an OSError naming it: the index is not written, the previous checkpoint stays the latest. ``publish``:
    called with the file once written, before it is reported (a bucket's run folder uploads it; an OSError is
    reported as a failed write)."""
    pieces, leaves = part
    name = f"{SHARDS}/{tag}.{jax.process_index()}.shard"
    try:
        folder = run_dir / SHARDS
        if folder.is_symlink():  # it would put the shards elsewhere
            raise UnsafeFile(folder, "a symbolic link")
        arrays = {n: checkpoint.little_endian(a) for n, a in pieces.items()}
        # each piece's shape and crc32, which process 0 writes into the index
        described = {n: checkpoint.describe(a, checkpoint.raw_bytes(a))[1:] for n, a in arrays.items()}
        if arrays:  # none: every shard this process holds is a replica of another process's
            folder.mkdir(exist_ok=True)
            checkpoint.save(run_dir / name, arrays, {"epoch": header["epoch"], "step": header["step"], "tag": tag})
            if publish is not None:
                publish(run_dir / name)
        report = json.dumps({"file": name if arrays else None, "pieces": described})
    except OSError as error:
        report = json.dumps({"error": f"{error.filename or name}: {error.strerror or error}"})
        gather(f"checkpoint-{tag}", report)
        raise
    reports = gather(f"checkpoint-{tag}", report)
    if reports is None:
        return None
    files, arrays = [], {leaf: [dtype, shape, []] for leaf, (dtype, shape) in leaves.items()}
    for index, text in enumerate(map(json.loads, reports)):
        if "error" in text:
            raise OSError(f"process {index} could not write its shards ({text['error']})")
        if text["file"] is None:
            continue
        files.append(text["file"])
        for piece, (shape, crc) in text["pieces"].items():
            leaf, _, start = piece.rpartition("@")
            start = [int(n) for n in start.split(",")] if start else []
            arrays[leaf][2].append([len(files) - 1, start, [a + n for a, n in zip(start, shape)], crc])
    shards = {"files": files, "arrays": arrays}
    checkpoint.sharded_leaves(run_dir / "index", shards)  # an index this code would refuse is not written
    return checkpoint.encode({}, {**header, "shards": shards})


def referenced(run_dir: Path) -> set[str]:
    """The shard files the indexes in `run_dir` name (headers only; a one-file checkpoint names none)."""
    from training.run.location import header_of

    names = set()
    for path in run_dir.glob("*.params"):
        try:
            shards = header_of(path).get("shards")
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(shards, dict) and isinstance(shards.get("files"), list):
            names.update(n for n in shards["files"] if isinstance(n, str))
    return names


def remove_unreferenced(run_dir: Path) -> None:
    """Deletes the files of shards/ that no index names: the save an index replaced, or one a kill cut short.
    Only process 0 calls it, after a commit and before the next save's tag exists, so no save is under way."""
    folder = run_dir / SHARDS
    if folder.is_symlink() or not folder.is_dir():
        return
    kept = referenced(run_dir)
    for path in folder.iterdir():
        if f"{SHARDS}/{path.name}" not in kept and not path.is_dir():
            path.unlink(missing_ok=True)


def merge(source: Path, out: Path) -> Path:
    """A sharded checkpoint (an index, or a run folder's best) written as one file: the same header, without the
    index of shards; every shard's checksum verified on the way."""
    arrays, header = checkpoint.read(checkpoint.of_run(source))
    header = {k: v for k, v in header.items() if k not in ("shards", "format_version", "treedef", "arrays")}
    checkpoint.save(out, arrays, header)
    return out


def main(argv: list[str] | None = None) -> int:
    from training.run.cli import ArgumentParser, fail

    parser = ArgumentParser(prog="python -m training.run.shards", description=merge.__doc__)
    parser.add_argument("--merge", required=True, metavar="RUN", help="a run folder or a checkpoint's index")
    parser.add_argument("--out", metavar="FILE", help="where to write it (default: beside it, *-one_file.params)")
    args = parser.parse_args(argv)
    source = checkpoint.of_run(Path(args.merge))
    out = Path(args.out) if args.out else source.with_name(f"{source.stem}-one_file.params")
    try:
        merge(source, out)
    except checkpoint.CheckpointError as error:
        fail(str(error))
    except OSError as error:
        fail(f"cannot write {out}: {error.strerror or error}; nothing was written")
    print(f"{out}: one file of {source}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
