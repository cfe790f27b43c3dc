"""Batching in-memory datasets: seeded per-epoch shuffling, fixed batch shapes, background prefetch to the device.

A dataset is anything with ``__len__`` and ``get_batch(indices) -> dict`` (vectorised: one fancy index per array, no
per-sample Python). A batch is a pytree of numpy arrays whose first axis is the batch:

    {"input": array or {name: array, ...},   # any dtype and rank, or several named inputs
     "target": array,                        # optional: losses given no target compare with the input
     "mask": array}                          # optional: (B,) per example or per element, e.g. (B, T); 0 = ignore

Every batch has the same shapes and dtypes, so the step compiles once: the last, smaller batch is either dropped
(``drop_last``) or padded with repeated examples whose mask is 0, so sums over the epoch stay exact. ``spec``
describes a batch abstractly (``jax.ShapeDtypeStruct`` leaves): the trainer, ``test.py`` and the export take every
shape and dtype from it, never from literals.

A dataset may also carry ``preprocessing``, a JSON-able dict of what a user of the trained model needs to prepare
inputs and read outputs (class names, per-channel mean/std, a vocabulary); it travels with the run and the export.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import numpy as np

TRANSFORM_STREAM = 0x7472616E  # keeps the transform's random numbers apart from the shuffling's
# Each hand-over between the prefetch thread and the loop costs both threads tens of microseconds of host time (a
# lock, a wake-up, the GIL), more than a small batch takes to make: batches (or stacks) made quicker than
# PREFETCH_GROUP_S are handed over together, within a bound on the memory (on the device, once placed) they hold. A
# batch slower to make than that goes alone, as soon as it is ready.
PREFETCH_GROUP_S = 0.001
PREFETCH_GROUP_ITEMS = 64
PREFETCH_GROUP_BYTES = 4 * 2**20


class Dataset(Protocol):
    def __len__(self) -> int: ...

    def get_batch(self, indices: np.ndarray) -> dict[str, Any]: ...


class ArrayDataset:
    """Arrays (or dicts of arrays) with a shared first axis, e.g. ``ArrayDataset(input=x, target=y)`` or
    ``ArrayDataset(input={"image": x, "features": f}, target=y)``."""

    def __init__(self, preprocessing: dict | None = None, **arrays):
        lengths = {len(a) for a in _leaves(arrays)}
        if len(lengths) != 1:
            raise ValueError(f"arrays have different lengths: {sorted(lengths)}")
        self.arrays = arrays
        self.preprocessing = preprocessing or {}

    def __len__(self) -> int:
        return len(_leaves(self.arrays)[0])

    def get_batch(self, indices):
        return _map(lambda array: array[indices], self.arrays)


def _leaves(tree) -> list:
    return [leaf for value in tree.values() for leaf in _leaves(value)] if isinstance(tree, dict) else [tree]


def _map(fn: Callable, *trees):
    """fn over the leaves of nested dicts (numpy only: the loader never imports JAX)."""
    if len(trees) == 1 and isinstance(trees[0], dict):  # every batch goes through here: the quick way for one
        return {k: _map(fn, v) if isinstance(v, dict) else fn(v) for k, v in trees[0].items()}
    if isinstance(trees[0], dict):
        return {key: _map(fn, *(t[key] for t in trees)) for key in trees[0]}
    return fn(*trees)


def _paths(tree, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(tree, dict):
        return [item for key, value in tree.items() for item in _paths(value, f"{prefix}{key}.")]
    return [(prefix[:-1], tree)]


def check_batch(batch: Any, batch_size: int) -> None:
    """A dataset's batch as the loop needs it: a dict with "input", numeric numpy arrays, batch axis first."""
    if not isinstance(batch, dict) or "input" not in batch:
        keys = sorted(batch) if isinstance(batch, dict) else type(batch).__name__
        raise ValueError(
            f'get_batch must return a dict with an "input" entry (and optionally "target", "mask"), got {keys}'
        )
    for path, leaf in _paths(batch):
        if not isinstance(leaf, np.ndarray) or leaf.dtype.kind not in "biuf":
            what = f"{type(leaf).__name__} of {leaf.dtype}" if isinstance(leaf, np.ndarray) else type(leaf).__name__
            raise ValueError(f"batch entry {path!r}: expected a numeric numpy array, got {what}")
        if leaf.ndim == 0 or len(leaf) != batch_size:
            raise ValueError(
                f"batch entry {path!r}: shape {list(leaf.shape)} does not start with the batch size {batch_size}"
            )


CHECK_BYTES = 8 << 20  # what check_values reads at once: enough rows to be vectorised, little memory


def check_values(
    dataset: Dataset, classes: int | None = None, allow_nonfinite: bool = False, labels: str = "target"
) -> None:
    """Every example of `dataset`, read once in blocks through its own ``get_batch``, as the loop would receive it:
    integer targets (``labels``: the batch's entry holding them, ``target.label`` among named targets) are class ids
    in [0, classes) when `classes` is given (the loss's gather would wrap -1 to the
    last class, and read past the end for an id too large), and floating-point inputs and targets are finite unless
    `allow_nonfinite` (a NaN input makes every later loss NaN). ValueError naming the first bad example by its index
    in the split; the caller adds which split. Checked where a data set is loaded, never in the step."""
    n, start, rows = len(dataset), 0, 64
    while start < n:
        indices = np.arange(start, min(n, start + rows))
        batch = dataset.get_batch(indices)
        start += len(indices)
        if not isinstance(batch, dict):
            return  # check_batch names what a batch must be
        for path, leaf in _paths({k: v for k, v in batch.items() if k != "mask"}):
            if not isinstance(leaf, np.ndarray) or len(leaf) != len(indices):
                continue
            if leaf.dtype.kind == "f" and not allow_nonfinite:
                bad = ~np.isfinite(leaf).reshape(len(leaf), -1).all(axis=1)
                if bad.any():
                    row = int(np.argmax(bad))
                    value = leaf[row][~np.isfinite(leaf[row])].flat[0]
                    raise ValueError(
                        f"example {indices[row]}: {path} holds {value} (non-finite values are refused; "
                        "allow_nonfinite: true beside the loader's name lets them through)"
                    )
            if path == labels and classes is not None and leaf.dtype.kind in "iu":
                flat = leaf.reshape(len(leaf), -1)
                bad = ((flat < 0) | (flat >= classes)).any(axis=1)
                if bad.any():
                    row = int(np.argmax(bad))
                    value = flat[row][(flat[row] < 0) | (flat[row] >= classes)][0]
                    raise ValueError(f"example {indices[row]}: class label {value} is outside [0, {classes})")
        size = sum(leaf.nbytes for _, leaf in _paths(batch) if isinstance(leaf, np.ndarray))
        rows = int(np.clip(CHECK_BYTES * len(indices) // max(size, 1), 64, 65536))


class DataLoader:
    """Batches of `dataset` in an order that is a function of (seed, epoch).

    `transform`, if given, is called on every host batch (padding mask included) in the prefetch thread as
    ``transform(batch, epoch=epoch, index=b, rng=rng) -> batch``: `index` is the batch's position in the epoch and
    `rng` a ``numpy.random.Generator`` seeded by (seed, epoch, index) alone, so a random host transform draws the
    same numbers for the same batch in every run, and a run resumed mid-epoch continues exactly. It must keep the
    batch's shapes and dtypes the same from batch to batch (the step compiles once, from the first batch).
    """

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int,
        shuffle: bool = False,
        drop_last: bool = False,
        seed: int = 0,
        transform: Callable[..., dict] | None = None,
        prefetch: int = 2,
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if drop_last and len(dataset) < batch_size:
            raise ValueError(f"drop_last with batch_size {batch_size} leaves no batch of {len(dataset)} examples")
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.seed = seed
        self.transform = transform
        self.prefetch = prefetch
        self.limit = None  # at most this many batches per epoch (train.py's --limit-batches and debug modes)
        self._spec = None
        # (index, count): this process reads rows [index * B / count, (index + 1) * B / count) of every global
        # batch of B (set by the trainer when a run has several processes); spec still describes the global batch
        self.share = (0, 1)
        self.passes = 0  # how many times the loader was iterated (``__iter__``)

    def __iter__(self) -> Iterator[dict]:
        """``for batch in loader``: each loop over the loader is the next epoch (0, then 1, ...), in the order
        training sees that epoch; ``batches(epoch)`` gives any one epoch without counting."""
        self.passes += 1
        return self.batches(self.passes - 1)

    def __len__(self) -> int:
        n = len(self.dataset)
        full = n // self.batch_size if self.drop_last else -(-n // self.batch_size)
        return full if self.limit is None else min(full, self.limit)

    @property
    def num_examples(self) -> int:
        """Examples seen per epoch (the real ones, not the padding)."""
        return len(self) * self.batch_size if self.drop_last else min(len(self.dataset), len(self) * self.batch_size)

    def order(self, epoch: int) -> np.ndarray:
        """The epoch's example order: a function of (seed, epoch) only, so a resumed run sees the same order."""
        n = len(self.dataset)
        if not self.shuffle:
            return np.arange(n)
        return np.random.default_rng([self.seed, epoch]).permutation(n)

    @property
    def spec(self) -> dict:
        """The abstract batch: the first batch's tree with ``jax.ShapeDtypeStruct`` leaves (shapes and dtypes)."""
        if self._spec is None:
            import jax

            self._spec = _map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), next(self.batches(0, whole=True)))
        return self._spec

    @property
    def preprocessing(self) -> dict:
        return dict(getattr(self.dataset, "preprocessing", None) or {})

    def batches(self, epoch: int = 0, start: int = 0, whole: bool = False) -> Iterator[dict]:
        """Host batches of the epoch from batch `start` on (a run resumed mid-epoch), each with a float32 `mask`:
        the dataset's own (per element) times 0 on padding. This process's share of each (``share``) unless
        `whole`."""
        order = self.order(epoch)
        index, count = (0, 1) if whole else self.share
        rows = slice(index * self.batch_size // count, (index + 1) * self.batch_size // count)
        full = _constant(np.ones(self.batch_size, np.float32)[rows])  # every full batch's padding mask
        for b in range(start, len(self)):
            idx = order[b * self.batch_size : (b + 1) * self.batch_size]
            real = len(idx)
            if real < self.batch_size:
                # repeated cyclically: a split smaller than one batch still fills it
                idx = np.concatenate([idx, np.resize(order, self.batch_size - real)])
            idx = idx[rows]
            batch = self.dataset.get_batch(idx)
            if b == start:
                check_batch(batch, len(idx))
            batch = dict(batch)  # the mask is added to a copy, never to the dataset's own dict
            padding = full if real == self.batch_size else (np.arange(self.batch_size) < real).astype(np.float32)[rows]
            mask = batch.get("mask")
            if mask is None:
                batch["mask"] = padding
            else:
                mask = np.asarray(mask, np.float32)
                batch["mask"] = mask * padding.reshape((-1,) + (1,) * (mask.ndim - 1))
            if self.transform is not None:
                rng = np.random.default_rng([self.seed, epoch, b, TRANSFORM_STREAM])
                batch = self.transform(batch, epoch=epoch, index=b, rng=rng)
            yield batch

    def stacks(
        self, epoch: int, steps_per_call: int, put: Callable = lambda b: b, start: int = 0
    ) -> Iterator[tuple[int, dict]]:
        """Stacks of `steps_per_call` batches (leading axis K) placed by `put`, prepared in a background thread.

        The last stack of an epoch is completed with copies of its final batch marked inactive (`active` = 0), so
        every call has the same shapes; the step leaves the training state untouched for inactive entries.
        Yields (number of real steps in the stack, stack).
        """

        def produce():
            batches = self.batches(epoch, start)
            active = _constant(np.ones(steps_per_call, np.float32))  # every full stack's
            while True:
                group = list(itertools.islice(batches, steps_per_call))
                if not group:
                    return
                real = len(group)
                group += [group[-1]] * (steps_per_call - real)
                if steps_per_call == 1:
                    stack = _map(lambda a: a[None], group[0])
                else:
                    stack = _map(lambda *a: np.stack(a), *group)
                stack["active"] = active if real == steps_per_call else (np.arange(steps_per_call) < real) * active
                yield real, put(stack)

        return _prefetch(produce(), self.prefetch)

    def placed(self, epoch: int, put: Callable, rows: int | None = None) -> Iterator:
        """The epoch's batches (``batches``) each placed by `put`, prepared in a background thread as ``stacks``
        prepares stacks (evaluation's); with `rows`, each batch padded to that many rows (of this process's share)
        by repeating it cyclically with a zero mask, so that it divides over the devices and sums are unchanged."""
        return _prefetch((put(_pad_rows(batch, rows or 0)) for batch in self.batches(epoch)), self.prefetch)


def _pad_rows(batch: dict, rows: int) -> dict:
    real = len(batch["mask"])
    if real >= rows:
        return batch
    index = np.arange(rows) % real
    batch = _map(lambda a: a[index], batch)
    keep = (np.arange(rows) < real).astype(np.float32)
    batch["mask"] = batch["mask"] * keep.reshape((-1,) + (1,) * (batch["mask"].ndim - 1))
    return batch


def _constant(array: np.ndarray) -> np.ndarray:
    """An array shared by many batches, made once: read-only, so that a transform writing into it fails loudly."""
    array.flags.writeable = False
    return array


def _nbytes(item) -> int:
    if isinstance(item, (dict, tuple, list)):
        return sum(_nbytes(v) for v in (item.values() if isinstance(item, dict) else item))
    return getattr(item, "nbytes", 0)


def _prefetch(iterator: Iterator, size: int) -> Iterator:
    """Runs `iterator` in a daemon thread, `size` hand-overs ahead, re-raising its errors in the consumer. Items quick
    to make are handed over in groups: up to PREFETCH_GROUP_S of the thread's work, PREFETCH_GROUP_BYTES and
    PREFETCH_GROUP_ITEMS."""
    if size <= 0:
        yield from iterator
        return
    items: queue.Queue = queue.Queue(maxsize=size)
    done = object()
    stop = threading.Event()

    def hand(group: list) -> bool:
        while not stop.is_set():
            try:
                items.put(group, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def work():
        try:
            group, began, item_bytes = [], time.perf_counter(), None
            for item in iterator:
                group.append(item)
                item_bytes = _nbytes(item) if item_bytes is None else item_bytes  # every stack alike
                if (
                    time.perf_counter() - began < PREFETCH_GROUP_S
                    and len(group) < PREFETCH_GROUP_ITEMS
                    and (len(group) + 1) * item_bytes <= PREFETCH_GROUP_BYTES
                ):
                    continue
                if not hand(group):
                    return
                group, began = [], time.perf_counter()
            if group and not hand(group):
                return
            items.put(done)
        except BaseException as error:  # handed to the consumer
            items.put(error)

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    try:
        while True:
            group = items.get()
            if group is done:
                return
            if isinstance(group, BaseException):
                raise group
            yield from group
    finally:
        # joined, not abandoned: a daemon thread still placing arrays on the device while the interpreter shuts
        # down (an error or Ctrl-C ending the run) crashes the process with SIGABRT/SIGSEGV instead of its status
        stop.set()
        while thread.is_alive():
            try:
                items.get(timeout=0.05)
            except queue.Empty:
                pass
