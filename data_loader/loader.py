"""Batching in-memory datasets: seeded per-epoch shuffling, fixed batch shapes, background prefetch to the device.

A dataset is anything with ``__len__`` and ``get_batch(indices) -> dict of numpy arrays`` (vectorised: one fancy
index per array, no per-sample Python). Every batch has the same shape so the step compiles once: the last, smaller
batch is either dropped (``drop_last``) or padded with repeated examples whose ``mask`` is 0, so sums over the epoch
stay exact.
"""
from __future__ import annotations

import queue
import threading
from typing import Callable, Iterator, Protocol

import numpy as np


class Dataset(Protocol):
    def __len__(self) -> int: ...

    def get_batch(self, indices: np.ndarray) -> dict[str, np.ndarray]: ...


class ArrayDataset:
    """Arrays with a shared first axis, e.g. ``ArrayDataset(image=x, label=y)``."""

    def __init__(self, **arrays: np.ndarray):
        lengths = {len(a) for a in arrays.values()}
        if len(lengths) != 1:
            raise ValueError(f"arrays have different lengths: { {k: len(a) for k, a in arrays.items()} }")
        self.arrays = arrays

    def __len__(self) -> int:
        return len(next(iter(self.arrays.values())))

    def get_batch(self, indices):
        return {name: array[indices] for name, array in self.arrays.items()}


class DataLoader:
    def __init__(self, dataset: Dataset, batch_size: int, shuffle: bool = False, drop_last: bool = False,
                 seed: int = 0, transform: Callable[[dict], dict] | None = None, prefetch: int = 2):
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

    def __len__(self) -> int:
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    @property
    def num_examples(self) -> int:
        """Examples seen per epoch (the real ones, not the padding)."""
        return len(self) * self.batch_size if self.drop_last else len(self.dataset)

    def order(self, epoch: int) -> np.ndarray:
        """The epoch's example order: a function of (seed, epoch) only, so a resumed run sees the same order."""
        n = len(self.dataset)
        if not self.shuffle:
            return np.arange(n)
        return np.random.default_rng([self.seed, epoch]).permutation(n)

    def batches(self, epoch: int = 0) -> Iterator[dict[str, np.ndarray]]:
        """Host batches of the epoch, each with a float32 `mask` (0 on padding)."""
        order = self.order(epoch)
        for b in range(len(self)):
            idx = order[b * self.batch_size:(b + 1) * self.batch_size]
            real = len(idx)
            if real < self.batch_size:
                idx = np.concatenate([idx, order[: self.batch_size - real]])
            batch = self.dataset.get_batch(idx)
            mask = np.zeros(self.batch_size, np.float32)
            mask[:real] = 1.0
            batch["mask"] = mask
            if self.transform is not None:
                batch = self.transform(batch)
            yield batch

    def chunks(self, epoch: int, steps_per_call: int, put: Callable = lambda b: b) -> Iterator[tuple[int, dict]]:
        """Stacks of `steps_per_call` batches (leading axis K) placed by `put`, prepared in a background thread.

        The last stack of an epoch is completed with copies of its final batch marked inactive (`active` = 0), so
        every call has the same shapes; the step leaves the training state untouched for inactive entries.
        Yields (number of real steps in the stack, stack).
        """
        def produce():
            batches = self.batches(epoch)
            while True:
                group = [b for _, b in zip(range(steps_per_call), batches)]
                if not group:
                    return
                real = len(group)
                group += [group[-1]] * (steps_per_call - real)
                stack = {k: np.stack([b[k] for b in group]) for k in group[0]}
                stack["active"] = (np.arange(steps_per_call) < real).astype(np.float32)
                yield real, put(stack)

        return _prefetch(produce(), self.prefetch)


def _prefetch(iterator: Iterator, size: int) -> Iterator:
    """Runs `iterator` in a daemon thread, `size` items ahead, re-raising its errors in the consumer."""
    if size <= 0:
        yield from iterator
        return
    items: queue.Queue = queue.Queue(maxsize=size)
    done = object()
    stop = threading.Event()

    def work():
        try:
            for item in iterator:
                while not stop.is_set():
                    try:
                        items.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            items.put(done)
        except BaseException as error:  # handed to the consumer
            items.put(error)

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    try:
        while True:
            item = items.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
