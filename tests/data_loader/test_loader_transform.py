"""The DataLoader's `transform` hook: called per host batch with the epoch, the batch's index and a numpy Generator
seeded by (seed, epoch, index) only, so a random host transform is reproducible and a mid-epoch resume sees the same
numbers as an uninterrupted epoch."""

from __future__ import annotations

import numpy as np

from data_loader.loader import ArrayDataset, DataLoader


def noisy(batch, *, epoch, index, rng):
    """A random host transform: uniform noise added to the input; records what it was given."""
    batch = dict(batch)
    batch["input"] = batch["input"] + rng.uniform(-1, 1, batch["input"].shape).astype(np.float32)
    batch["seen"] = np.full(len(batch["input"]), epoch * 1000 + index, np.int32)
    return batch


def make(seed=0):
    x = np.arange(40, dtype=np.float32).reshape(20, 2)
    return DataLoader(ArrayDataset(input=x, target=np.arange(20)), 6, shuffle=True, seed=seed, transform=noisy)


def test_transform_gets_epoch_index_and_a_reproducible_generator():
    epoch = list(make().batches(3))
    assert [int(b["seen"][0]) for b in epoch] == [3000, 3001, 3002, 3003]
    again = list(make().batches(3))
    for a, b in zip(epoch, again):
        np.testing.assert_array_equal(a["input"], b["input"])
    # the transform saw the padded last batch with its mask (20 = 3 x 6 + 2)
    assert epoch[-1]["mask"].tolist() == [1, 1, 0, 0, 0, 0]

    # other epochs and seeds draw other numbers; the noise is not the shuffling's stream
    def noise(seed, epoch):
        plain = make(seed)
        plain.transform = None
        return np.concatenate(
            [t["input"] - p["input"] for t, p in zip(make(seed).batches(epoch), plain.batches(epoch))]
        )

    n3 = noise(0, 3)
    assert np.all(np.abs(n3) <= 1) and n3.std() > 0.3
    assert not np.allclose(n3, noise(0, 4)) and not np.allclose(n3, noise(1, 3))


def test_a_resumed_epoch_sees_the_same_transformed_batches():
    whole = list(make().batches(2))
    resumed = list(make().batches(2, start=2))
    for a, b in zip(whole[2:], resumed):
        np.testing.assert_array_equal(a["input"], b["input"])
        np.testing.assert_array_equal(a["seen"], b["seen"])
    # and through the prefetching stacks the trainer uses
    stacks = [stack for _, stack in make().stacks(2, 2, start=2)]
    np.testing.assert_array_equal(stacks[0]["input"][0], whole[2]["input"])
