"""Images in class folders, ``root/<class>/<image>``, as a classification data set decoded once into a disk cache.

Class names are the folder names (sorted, or the order `classes` gives), images are PNG, JPEG, BMP or WebP files
(read by Pillow, in sub-folders of a class folder too; hidden files and folders are left out). Every image is
converted to gray (`channels` 1, Pillow's "L") or RGB (3; an alpha channel is dropped, a palette expanded) and
resized to `size` (height, width) with Pillow's bilinear filter, which is what ``inference/predict.py`` does to a
file it is given.

Decoding happens once: the uint8 array (N, height, width, channels) of the whole folder goes into a ``.npy`` file
under `cache_dir`, named by a hash of the file list with each file's size and modification time and of the decode
settings (size, channels, filter). A changed, added or removed file gives another hash, so the cache is rebuilt
(images whose entry did not change are copied from the previous cache, not decoded again) and the stale one
removed. Writes are atomic (a temporary file, fsync, rename), and the cache is memory-mapped afterwards: epochs
read it at in-memory speed from the page cache, and a folder larger than memory still trains.

Splits are per class and stable: within each class, files are ranked by a hash of (split_seed, path), the first
round(n * validation_fraction) of each class are the validation split and the next round(n * test_fraction) the test
split (none by default). Adding a file moves at most one other file
between splits, and the split never depends on which files could be decoded. Unreadable or corrupt files stop the
build with their path (`on_error` "fail"), or are left out with a warning that counts and names them ("skip").
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import json
import logging
import multiprocessing
import os
import time
from pathlib import Path

import numpy as np

from data_loader.sources.image_files import open_image
from files import reads
from files.writes import atomic_path, write_atomic
from model.checks import check_range
from signals import stops
from signals.stops import IN_WORKERS

SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp")
SPLITS = ("all", "train", "validation", "test")
ON_ERROR = ("fail", "skip")
DTYPES = ("uint8", "float32")
CACHE_VERSION = 1
RESIZE = "bilinear"  # Pillow's Image.BILINEAR, as inference/predict.py resizes
# a cache's metadata lists every image (its path, size and time; an unreadable one's error): held to the JSON
# bound and a path's length (PATH_MAX) per image, and to the JSON depth bound, like every JSON file read
CACHE_META_BYTES = 4096
CHUNK = 256  # images per task handed to a decoding worker
MIN_FILES_PER_WORKER = 2000  # below this, starting worker processes costs more than it saves

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------------------ the folder
def scan(root: str | Path, classes: list[str] | None = None) -> tuple[list[str], list[Path], np.ndarray]:
    """(class names, image paths, int32 labels): classes in folder-name order (or `classes`' order), files sorted."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such folder (expected class folders: {root}/<class>/<image>)")
    found = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if classes is None:
        classes = found
        if not classes:
            raise ValueError(f"{root}: no class folders (expected {root}/<class>/<image>, e.g. {root}/cat/1.png)")
    else:
        missing = [name for name in classes if name not in found]
        if missing:
            raise ValueError(
                f"{root}: no folder for class {missing[0]!r}; class folders there: {', '.join(found) or 'none'}"
            )
    files, labels = [], []
    for label, name in enumerate(classes):
        folder = root / name
        images = sorted(
            p
            for p in folder.rglob("*")
            if p.suffix.lower() in SUFFIXES
            and p.is_file()
            and not any(part.startswith(".") for part in p.relative_to(folder).parts)
        )
        if not images:
            raise ValueError(
                f"{folder}: an empty class folder (no {', '.join(SUFFIXES)} files); add images to it or remove it"
            )
        files += images
        labels += [label] * len(images)
    return list(classes), files, np.asarray(labels, np.int32)


def split_rows(
    root: Path,
    files: list[Path],
    labels: np.ndarray,
    split: str,
    validation_fraction: float,
    split_seed: int,
    test_fraction: float = 0.0,
) -> np.ndarray:
    """Indices into `files` of the split: per class, the files ranked first by hash(split_seed, path) are held out
    for validation, the next ones for test."""
    if split == "all":
        return np.arange(len(files))
    rank = np.asarray(
        [
            int.from_bytes(
                hashlib.sha256(f"{split_seed}:".encode() + os.fsencode(p.relative_to(root).as_posix())).digest()[:8],
                "little",
            )
            for p in files
        ],
        np.uint64,
    )
    part = np.full(len(files), "train", dtype=object)
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        ranked = members[np.argsort(rank[members], kind="stable")]
        validation = round(len(members) * validation_fraction)
        part[ranked[:validation]] = "validation"
        part[ranked[validation : validation + round(len(members) * test_fraction)]] = "test"
    return np.flatnonzero(part == split)


# -------------------------------------------------------------------------------------------------------- decoding
def decode(path: str | Path, size: tuple[int, int], channels: int) -> np.ndarray:
    """One image file as uint8 (height, width, channels); ValueError naming the file if it cannot be (or if
    open_image refuses it: not a regular file, too many pixels)."""
    from PIL import Image

    try:
        with open_image(path) as image:
            if image.mode in ("P", "PA"):  # a palette (with transparency) expands through RGBA
                image = image.convert("RGBA")
            image = image.convert("L" if channels == 1 else "RGB")
            if image.size != (size[1], size[0]):
                image = image.resize((size[1], size[0]), Image.BILINEAR)
            return np.asarray(image, np.uint8).reshape(size[0], size[1], channels)
    except MemoryError:
        raise
    except Exception as error:  # Pillow raises many kinds for damaged files: each one is the file's fault
        reason = str(error).splitlines()[0].removeprefix(f"{path}: ") if str(error) else type(error).__name__
        reason = reason.replace(f" {str(path)!r}", "").replace(f" {str(path)}", "")  # Pillow names the file too
        raise ValueError(f"{path}: cannot decode it as an image ({reason})") from None


def decode_chunk(paths: list[str], size: tuple[int, int], channels: int) -> tuple[np.ndarray, list[tuple[int, str]]]:
    """(uint8 (len(paths), H, W, C), [(position, error message)]): a worker's task; failed rows stay zero."""
    out = np.zeros((len(paths), size[0], size[1], channels), np.uint8)
    errors = []
    for i, path in enumerate(paths):
        try:
            out[i] = decode(path, size, channels)
        except ValueError as error:
            errors.append((i, str(error)))
    return out, errors


def image_size(path: Path) -> tuple[int, int]:
    """(height, width) of an image file, from its header."""

    try:
        with open_image(path) as image:
            return image.size[1], image.size[0]
    except Exception as error:  # noqa: BLE001 (any failure is the file's)
        raise ValueError(
            f'{path}: cannot read it as an image ({error}); give "size": [height, width] to '
            "choose the size without reading the first image"
        ) from None


def default_workers(num_files: int) -> int:
    """Worker processes for a first decode of `num_files` files: none for small folders or on 1-2 cores (on a 2-core
    machine 2 workers measured slower than decoding in the loading process), else one per core up to 8."""
    cores = os.cpu_count() or 1
    return 0 if num_files < MIN_FILES_PER_WORKER or cores <= 2 else min(cores, 8)


def decode_into(
    out: np.ndarray, paths: list[str], size: tuple[int, int], channels: int, workers: int, stop_on_error: bool
) -> dict[int, str]:
    """Decodes `paths` into rows of `out` (a memory map), in `workers` processes (0: this one); {row: error}."""
    errors: dict[int, str] = {}
    step = CHUNK if workers > 1 else 1  # in this process, a stop signal is heard between any two images
    starts = range(0, len(paths), step)
    if workers <= 1:
        results = (decode_chunk(paths[s : s + step], size, channels) for s in starts)
        pool = None
    else:
        # spawn, not fork: the parent may already run JAX's threads, which a forked child would inherit locked
        pool = concurrent.futures.ProcessPoolExecutor(workers, multiprocessing.get_context("spawn"), *IN_WORKERS)
        results = pool.map(
            decode_chunk, (paths[s : s + CHUNK] for s in starts), [size] * len(starts), [channels] * len(starts)
        )
    try:
        for start, (array, chunk_errors) in zip(starts, results):
            stops.safe_point()  # SIGTERM or Ctrl-C: decoding ends within a chunk (an image in this process)
            out[start : start + len(array)] = array
            errors.update({start + i: message for i, message in chunk_errors})
            if errors and stop_on_error:
                break
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    return errors


# ----------------------------------------------------------------------------------------------------------- cache
def cache_key(root: Path, files: list[Path], size: tuple[int, int], channels: int) -> tuple[str, str, list]:
    """(settings hash, contents hash, entries): the settings name the folder and decode options, the contents add
    every file's relative path, size and modification time."""
    settings = {
        "version": CACHE_VERSION,
        "root": str(root.resolve()),
        "size": list(size),
        "channels": channels,
        "resize": RESIZE,
    }
    entries = []
    for path in files:
        stat = path.stat()
        entries.append([path.relative_to(root).as_posix(), stat.st_size, stat.st_mtime_ns])
    settings_hash = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
    contents_hash = hashlib.sha256(json.dumps([settings, entries]).encode()).hexdigest()[:16]
    return settings_hash, contents_hash, entries


def read_meta(meta_path: Path, images: int) -> dict:
    """A cache's metadata, within the bounds (a ValueError past them: the cache is rebuilt); {} when not an object."""
    meta = reads.read_json(meta_path, "image cache's metadata", reads.MAX_JSON_BYTES + CACHE_META_BYTES * images)
    return meta if isinstance(meta, dict) else {}


def _previous(cache_dir: Path, settings_hash: str, name: str, images: int) -> list[tuple[Path, dict]]:
    """Earlier caches of the same folder and settings (stale now): (their .npy, their metadata)."""
    found = []
    for meta_path in cache_dir.glob(f"{settings_hash}-*.json"):
        if meta_path.stem == name:
            continue
        try:
            found.append((meta_path.with_suffix(".npy"), read_meta(meta_path, images)))
        except (OSError, ValueError):
            found.append((meta_path.with_suffix(".npy"), {}))
    return found


def load_or_build(
    root: Path,
    files: list[Path],
    size: tuple[int, int],
    channels: int,
    cache_dir: Path,
    workers: int | None,
    on_error: str,
) -> tuple[np.ndarray, dict[int, str], dict]:
    """(memory-mapped uint8 images of every file, {row: error} of the unreadable ones, cache info for logs)."""
    settings_hash, contents_hash, entries = cache_key(root, files, size, channels)
    name = f"{settings_hash}-{contents_hash}"
    data_path, meta_path = cache_dir / f"{name}.npy", cache_dir / f"{name}.json"
    shape = (len(files), size[0], size[1], channels)
    if meta_path.is_file() and data_path.is_file():
        try:
            meta = read_meta(meta_path, len(files))
            images = np.load(data_path, mmap_mode="r")
            if meta.get("entries") == entries and images.shape == shape and images.dtype == np.uint8:
                return images, {int(k): v for k, v in meta["errors"].items()}, {"path": data_path, "built": False}
        except (OSError, ValueError, KeyError):
            pass  # damaged: rebuilt below
    created = not cache_dir.exists()
    writing = contextlib.ExitStack()  # the cache's temporary file, renamed to data_path when the block ends
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = str(writing.enter_context(atomic_path(data_path)))
    except OSError as error:
        raise ValueError(
            f"{cache_dir}: cannot write the image cache there ({error.strerror or error}); set "
            '"cache_dir" to a writable folder'
        ) from None
    started = time.perf_counter()
    try:
        with writing:
            out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.uint8, shape=shape)
            todo = list(range(len(files)))
            errors: dict[int, str] = {}
            reused = 0
            previous = _previous(cache_dir, settings_hash, name, len(files))
            for old_data, old_meta in previous:  # unchanged entries come from the stale cache instead of the decoder
                if not todo or not old_meta.get("entries") or not old_data.is_file():
                    continue
                try:
                    old = np.load(old_data, mmap_mode="r")
                except (OSError, ValueError):
                    continue
                if old.shape[1:] != shape[1:]:
                    continue
                where = {tuple(entry): row for row, entry in enumerate(old_meta["entries"])}
                old_errors = old_meta.get("errors", {})
                left = []
                for row in todo:
                    old_row = where.get(tuple(entries[row]))
                    if old_row is None or old_row >= len(old):
                        left.append(row)
                        continue
                    out[row] = old[old_row]
                    if str(old_row) in old_errors:
                        errors[row] = old_errors[str(old_row)]
                reused += len(todo) - len(left)
                todo = left
            count = default_workers(len(todo)) if workers is None else workers
            if todo:
                log.info(
                    f"{root}: decoding {len(todo)} images into the cache {data_path} ({count} worker processes; "
                    "later loads memory-map it)"
                )
                # rows decoded into the cache itself, or (after a change) into a block copied in: in memory when
                # small, else a memory map too, so a build never holds the folder in memory
                if len(todo) == len(files):
                    block = out
                elif len(todo) * int(np.prod(shape[1:])) < (1 << 28):
                    block = np.zeros((len(todo), *shape[1:]), np.uint8)
                else:
                    block = np.lib.format.open_memmap(
                        tmp + ".rows", mode="w+", dtype=np.uint8, shape=(len(todo), *shape[1:])
                    )
                new_errors = decode_into(
                    block, [str(files[r]) for r in todo], size, channels, count, stop_on_error=on_error == "fail"
                )
                if block is not out:
                    out[todo] = block
                del block
                errors.update({todo[i]: message for i, message in new_errors.items()})
            if errors and on_error == "fail":
                raise ValueError(_failure(errors))
            out.flush()
            del out
        meta = {
            "version": CACHE_VERSION,
            "root": str(root.resolve()),
            "size": list(size),
            "channels": channels,
            "resize": RESIZE,
            "entries": entries,
            "errors": {str(k): v for k, v in sorted(errors.items())},
        }
        write_atomic(meta_path, json.dumps(meta).encode())
    except BaseException:
        if created:  # a failed first build leaves no empty cache folder behind
            try:
                cache_dir.rmdir()
            except OSError:
                pass
        raise
    finally:
        Path(tmp + ".rows").unlink(missing_ok=True)
    for old_data, _ in previous:  # stale caches of this folder and settings
        old_data.unlink(missing_ok=True)
        old_data.with_suffix(".json").unlink(missing_ok=True)
    stops.KEPT.append(f"the image cache {data_path}")  # a stop from here on leaves it for the next run
    info = {
        "path": data_path,
        "built": True,
        "decoded": len(todo),
        "reused": reused,
        "workers": count,
        "seconds": time.perf_counter() - started,
    }
    return np.load(data_path, mmap_mode="r"), errors, info


def _failure(errors: dict[int, str]) -> str:
    first = errors[min(errors)]
    more = f" (at least {len(errors) - 1} more unreadable files)" if len(errors) > 1 else ""
    return f'{first}{more}; set "on_error": "skip" to leave unreadable files out'


# --------------------------------------------------------------------------------------------------------- dataset
class ImageFolderDataset:
    """One split of an image folder: `input` uint8 (N, height, width, channels) NHWC (or float32 in [0, 1] with
    `dtype` "float32"), `target` int32 class ids (N,). ``images`` is the cache's memory map, never read whole."""

    def __init__(
        self,
        root,
        split="all",
        size=None,
        channels=3,
        classes=None,
        validation_fraction=0.1,
        split_seed=0,
        on_error="fail",
        cache_dir=None,
        workers=None,
        dtype="uint8",
        test_fraction=0.0,
    ):
        check_settings(
            split, size, channels, classes, validation_fraction, split_seed, on_error, workers, dtype, test_fraction
        )
        root = Path(root)
        self.classes, files, labels = scan(root, classes)
        size = (size, size) if isinstance(size, int) else tuple(size) if size is not None else image_size(files[0])
        cache_dir = Path(cache_dir) if cache_dir is not None else root / ".cache"
        self.images, errors, info = load_or_build(root, files, size, channels, cache_dir, workers, on_error)
        if info["built"]:
            log.info(
                f"{root}: decoded {info['decoded']} images ({info['reused']} reused from a previous cache, "
                f"{info['workers']} worker processes) in {info['seconds']:.1f} s into {info['path']}"
            )
        if errors and on_error == "fail":
            raise ValueError(_failure(errors))
        rows = split_rows(root, files, labels, split, validation_fraction, split_seed, test_fraction)
        self.skipped = 0  # unreadable files of this split, left out
        if errors:
            bad = np.asarray(sorted(errors))
            skipped = np.intersect1d(rows, bad)
            if len(skipped):
                names = "; ".join(errors[int(r)] for r in skipped[:3])
                log.warning(
                    f"{root}: skipped {len(skipped)} unreadable file(s) of the {split} split: {names}"
                    + (" ..." if len(skipped) > 3 else "")
                )
            rows = np.setdiff1d(rows, bad)
            self.skipped = len(skipped)
        if not len(rows):
            raise ValueError(
                f"{root}: the {split} split is empty ({len(files)} files, validation_fraction "
                f"{validation_fraction}, test_fraction {test_fraction})"
            )
        self.rows = rows
        self.labels = labels[rows]
        self.files = [files[r] for r in rows]
        self.size, self.channels, self.dtype = size, channels, dtype

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def preprocessing(self) -> dict:
        """What a user of the trained model needs to turn a file into an input the way training did."""
        return {
            "classes": self.classes,
            "input_size": list(self.size),
            "channels": self.channels,
            "layout": "NHWC",
            "resize": RESIZE,
            "color": "L" if self.channels == 1 else "RGB",
            "pixel_scale": 1.0 / 255.0 if self.dtype == "float32" else 1.0,
        }

    def get_batch(self, indices):
        images = self.images[self.rows[indices]]
        if self.dtype == "float32":
            images = images.astype(np.float32)
            images *= 1.0 / 255.0
        return {"input": images, "target": self.labels[indices]}


def check_settings(
    split="all",
    size=None,
    channels=3,
    classes=None,
    validation_fraction=0.1,
    split_seed=0,
    on_error="fail",
    workers=None,
    dtype="uint8",
    test_fraction=0.0,
) -> None:
    """The image folder's settings, checked without reading anything."""
    if split not in SPLITS:
        raise ValueError(f"split: expected one of {', '.join(map(repr, SPLITS))}, got {split!r}")
    if size is not None:
        sizes = [size] if isinstance(size, int) and not isinstance(size, bool) else size
        if (
            not isinstance(sizes, (list, tuple))
            or len(sizes) not in (1, 2)
            or any(isinstance(s, bool) or not isinstance(s, int) or not 1 <= s <= 65535 for s in sizes)
        ):
            raise ValueError(
                f"size: expected [height, width] (or one number for both) of integers from 1 to 65535, got {size!r}"
            )
    if channels not in (1, 3) or isinstance(channels, bool):
        raise ValueError(f"channels: expected 1 (gray) or 3 (RGB), got {channels!r}")
    if classes is not None and (
        not isinstance(classes, (list, tuple))
        or not classes
        or not all(isinstance(c, str) and c for c in classes)
        or len(set(classes)) != len(classes)
    ):
        raise ValueError(f"classes: expected a list of distinct folder names, got {classes!r}")
    for name, value in (("validation_fraction", validation_fraction), ("test_fraction", test_fraction)):
        check_range(value, name, 0, 1, open_high=True)
    if (split == "validation" and validation_fraction == 0) or (split == "test" and test_fraction == 0):
        raise ValueError(f"{split}_fraction: must be above 0 for the {split} split")
    if validation_fraction + test_fraction >= 1:
        raise ValueError(
            f"validation_fraction: {validation_fraction} and test_fraction {test_fraction} leave no images for training"
        )
    if isinstance(split_seed, bool) or not isinstance(split_seed, int) or split_seed < 0:
        raise ValueError(f"split_seed: must be an integer >= 0, got {split_seed!r}")
    if on_error not in ON_ERROR:
        raise ValueError(f'on_error: expected "fail" or "skip", got {on_error!r}')
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or not 0 <= workers <= 256):
        raise ValueError(f"workers: expected null (automatic) or an integer from 0 to 256, got {workers!r}")
    if dtype not in DTYPES:
        raise ValueError(f'dtype: expected "uint8" (pixels as stored) or "float32" (scaled to [0, 1]), got {dtype!r}')
