import gzip

import numpy as np
import pytest

from data_loader.data_loaders import mnist
from data_loader.loader import ArrayDataset, DataLoader
from data_loader.sources import mnist as mnist_module
from data_loader.sources.download import download
from data_loader.sources.idx import read_idx, write_idx


def test_idx_round_trip_gz_and_raw(tmp_path):
    rng = np.random.default_rng(0)
    for name, array in (
        ("a.gz", rng.integers(0, 255, (5, 3, 4)).astype(np.uint8)),
        ("b", rng.standard_normal((7, 2)).astype(np.float32)),
        ("c.gz", rng.integers(-5, 5, (9,)).astype(np.int32)),
    ):
        write_idx(tmp_path / name, array)
        back = read_idx(tmp_path / name)
        assert back.dtype == array.dtype and np.array_equal(back, array)


def test_idx_rejects_truncated_and_garbage(tmp_path):
    write_idx(tmp_path / "x", np.zeros((4, 4), np.uint8))
    data = (tmp_path / "x").read_bytes()
    (tmp_path / "t").write_bytes(data[:-3])
    with pytest.raises(ValueError, match="truncated"):
        read_idx(tmp_path / "t")
    (tmp_path / "g.gz").write_bytes(gzip.compress(b"hello world"))
    with pytest.raises(ValueError, match="magic"):
        read_idx(tmp_path / "g.gz")


def test_loader_shapes_padding_and_mask():
    x = np.arange(10, dtype=np.float32)[:, None]
    loader = DataLoader(ArrayDataset(input=x, target=np.arange(10)), batch_size=4, shuffle=True, seed=3)
    batches = list(loader.batches(epoch=0))
    assert len(loader) == len(batches) == 3 and loader.num_examples == 10
    assert all(b["input"].shape == (4, 1) for b in batches)  # fixed shape: one compilation
    assert [b["mask"].sum() for b in batches] == [4, 4, 2]
    seen = np.concatenate([b["target"][b["mask"] > 0] for b in batches])
    assert sorted(seen) == list(range(10))  # every example exactly once among the real entries


def test_loader_drop_last():
    loader = DataLoader(ArrayDataset(input=np.zeros((10, 1))), batch_size=4, drop_last=True)
    batches = list(loader.batches())
    assert len(batches) == len(loader) == 2 and loader.num_examples == 8
    assert all(b["mask"].sum() == 4 for b in batches)


def test_loader_order_is_a_function_of_seed_and_epoch():
    data = ArrayDataset(input=np.arange(50))
    a = DataLoader(data, 8, shuffle=True, seed=1)
    b = DataLoader(data, 8, shuffle=True, seed=1)
    assert np.array_equal(a.order(2), b.order(2))
    assert not np.array_equal(a.order(1), a.order(2))
    assert not np.array_equal(a.order(1), DataLoader(data, 8, shuffle=True, seed=2).order(1))
    assert np.array_equal(DataLoader(data, 8).order(5), np.arange(50))


def test_a_loader_is_iterable_one_epoch_per_loop():
    loader = DataLoader(ArrayDataset(input=np.arange(10.0)[:, None], target=np.arange(10)), 4, shuffle=True, seed=1)
    for epoch in range(3):  # a new epoch's order each loop, as training sees it
        looped = [b["target"] for b in loader]
        assert all(np.array_equal(a, b["target"]) for a, b in zip(looped, loader.batches(epoch), strict=True))
    assert not np.array_equal(looped[0], next(loader.batches(0))["target"])


def test_chunks_stack_and_mark_inactive_padding():
    loader = DataLoader(ArrayDataset(input=np.arange(10, dtype=np.float32)), batch_size=2)
    chunks = list(loader.stacks(epoch=0, steps_per_call=3))
    assert [real for real, _ in chunks] == [3, 2]
    assert all(stack["input"].shape == (3, 2) for _, stack in chunks)
    assert list(chunks[-1][1]["active"]) == [1, 1, 0]
    flat = np.concatenate([s["input"][s["active"] > 0].ravel() for _, s in chunks])
    assert np.array_equal(flat, np.arange(10))


def test_prefetch_propagates_errors():
    class Broken(ArrayDataset):
        def get_batch(self, indices):
            raise RuntimeError("disk on fire")

    loader = DataLoader(Broken(input=np.zeros(4)), batch_size=2)
    with pytest.raises(RuntimeError, match="disk on fire"):
        list(loader.stacks(0, 1))


def test_mnist_split_is_a_seeded_partition(tiny_mnist):
    train = mnist("train", data_dir=str(tiny_mnist), validation_size=50).dataset
    valid = mnist("validation", data_dir=str(tiny_mnist), validation_size=50).dataset
    test = mnist("test", data_dir=str(tiny_mnist)).dataset
    assert (len(train), len(valid), len(test)) == (250, 50, 100)
    assert train.sample_shape == (28, 28, 1)
    batch = train.get_batch(np.arange(4))
    assert batch["input"].dtype == np.float32 and batch["target"].dtype == np.int32
    raw = read_idx(tiny_mnist / "train-images-idx3-ubyte.gz").reshape(300, -1)
    both = np.concatenate([train.images.reshape(250, -1), valid.images.reshape(50, -1)])
    assert sorted(map(bytes, both)) == sorted(map(bytes, raw))  # disjoint and complete
    other = mnist("validation", data_dir=str(tiny_mnist), validation_size=50, split_seed=1).dataset
    assert not np.array_equal(other.labels, valid.labels)


def test_mnist_missing_files_say_where_to_put_them(tmp_path):
    with pytest.raises(FileNotFoundError, match="Put the four mnist IDX files"):
        mnist("train", data_dir=str(tmp_path / "nowhere"))


def test_mnist_checksum_mismatch_is_refused(tiny_mnist, monkeypatch):
    md5 = dict(mnist_module.SOURCES["mnist"]["md5"])
    md5["train-images-idx3-ubyte.gz"] = "0" * 32
    monkeypatch.setitem(mnist_module.SOURCES, "mnist", {**mnist_module.SOURCES["mnist"], "md5": md5})
    with pytest.raises(ValueError, match="checksum mismatch"):
        mnist("train", data_dir=str(tiny_mnist))


def test_download_verifies_checksum_and_writes_atomically(tmp_path):
    source = tmp_path / "mirror"
    source.mkdir()
    (source / "f.gz").write_bytes(b"payload")
    import hashlib

    good = hashlib.md5(b"payload").hexdigest()
    target = tmp_path / "out"
    with pytest.raises(OSError, match="checksum mismatch"):
        download("f.gz", "0" * 32, [source.as_uri()], target)
    assert list(target.iterdir()) == []  # no partial file left behind
    bad_mirror = (tmp_path / "missing").as_uri()
    path = download("f.gz", good, [bad_mirror, source.as_uri()], target)  # falls through to the next mirror
    assert path.read_bytes() == b"payload"


def test_a_split_smaller_than_one_batch_is_padded_to_the_batch():
    loader = DataLoader(ArrayDataset(input=np.arange(3, dtype=np.float32)[:, None]), batch_size=8)
    (batch,) = list(loader.batches())
    assert batch["input"].shape == (8, 1) and batch["mask"].sum() == 3
    assert sorted(batch["input"][batch["mask"] > 0, 0]) == [0, 1, 2]


def test_a_good_file_of_another_data_set_is_named_as_such(tiny_mnist):
    # the folder holds (tiny) MNIST files registered as the real ones; asking for Fashion-MNIST from that folder must
    # say the folder is wrong, not that the file is corrupt
    with pytest.raises(
        ValueError, match="is the mnist file, not fashion_mnist's: point data_dir at a folder of fashion_mnist files"
    ):
        mnist(data_dir=str(tiny_mnist), dataset="fashion_mnist")
