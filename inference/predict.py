"""Run an exported model on files and print what it says, as its task calls for:

    python inference/predict.py exports/jax_mnist/jax_mnist.onnx digit.png other.jpg [--top 3]   # classes
    python inference/predict.py exports/jax_mnist/jax_mnist.tflite batch.npy
    python inference/predict.py exports/regressor/regressor.onnx rows.csv        # raw values per target column
    python inference/predict.py exports/churn/churn.onnx customers.csv --out p.csv [--threshold 0.3]   # labels
    python inference/predict.py exports/shakespeare/shakespeare.onnx --text "ROMEO:" --tokens 100   # text

A model of several named outputs (a multi-task model) prints each output by its own task under its name. A folder
given as input stands for the image files under it (the suffixes the image loaders read), in sorted order;
`--quiet` prints no line per input, for many inputs whose outputs go to `--out`.

Images are resized and normalised as the training data was: the numbers come from `preprocessing.json`, which the
converter writes next to the model (from the run's data pipeline), plus the run's `config.json` for its name. A
.npy file holds inputs as the model takes them, (N, H, W, C) or one (H, W, C) sample, as `load_run(run)(x)` takes
them too; with `--raw`, as the data set's files hold them (pixels of 0..255), prepared by the recorded preprocessing
as images are, as `load_run(run)(x, raw=True)` prepares them. A model of several named inputs
takes .npz files with one such array per input name (`np.savez("x.npz", features=..., image=...)`). A model whose
call declares a padding mask has the named input "mask" (zero on padding): an .npz may hold it beside the input
(`np.savez("x.npz", input=ids, mask=mask)`); where a file gives none, every position is real (a mask of ones).

A .csv file holds raw rows with the training CSV's column names (in any order): empty cells and categorical columns
are filled and one-hot encoded as training learned them (`columns` in preprocessing.json), then standardised. A
multi-label or binary output's labels are those above the decision threshold: the first `threshold` in config.json's
metrics (the one the run was scored at), else 0.5; `--threshold` overrides it.

`--out FILE` also writes the outputs: .npy, .npz (with the inputs' names), .csv (a row per input of vector outputs)
or .png (image outputs, one file per input); a classifier's .csv and .npz hold probabilities and predicted labels.
Inputs far outside the range the model was trained on (`input_range` in preprocessing.json: an image of 0..255 given
to a model trained on 0..1 arrays) get one `warning:` line on stderr.

This file imports only numpy, Pillow (for images) and the runtime the model needs, onnxruntime or ai-edge-litert:
no JAX, no TensorFlow; and the CSV loader's cell rules (data_loader/sources/csv_cells.py, numpy only), which the
export copies beside it. Copied with the export folder, the two are all a deployment machine needs. The converter runs
its parity checks through the same two runner classes.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import stat
import sys
from pathlib import Path

import numpy as np

try:  # in an export folder, the copy beside this file (exporter.write_extras): the script's folder is on sys.path
    import csv_cells
except ModuleNotFoundError:  # in the template: imported as inference.predict, or run as inference/predict.py
    if not __package__:  # a script: the template's root is not on sys.path
        sys.path.append(str(Path(__file__).resolve().parents[1]))
    from data_loader.sources import csv_cells

# The export folder's files next to the model (exporter.write_extras writes them under these names). Named here,
# not imported from training/, because this file ships alone; they are the run folder's names
# (files/writes.py).
CONFIG = "config.json"
PREPROCESSING = "preprocessing.json"
MASK = "mask"  # the named input of a model that declares a padding mask (inference/inputs.py writes it so)
THRESHOLD = 0.5  # a multi-label output counts as predicted above this probability unless the config says otherwise
# The image files the loaders read (data_loader/sources/image_folder.py's SUFFIXES, repeated as this file ships
# alone; a test holds the two equal): what a folder given as input is searched for, and what is read as an image.
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp")

# Bounds on what a file or a flag may ask of this machine: an input file (a .npy, .npz member or .csv read whole),
# an image's pixels (a few kB of PNG can declare gigapixels), runtime threads, generated characters.
MAX_INPUT_BYTES = 1 << 30
MAX_PIXELS = 1 << 27
MAX_THREADS = 256
MAX_TOKENS = 1_000_000
# Every JSON file's bounds (files/reads.py's MAX_JSON_BYTES and MAX_JSON_DEPTH, a test holds them equal): a sparse
# 4 GB preprocessing.json is refused before it is read, absurd nesting before anything walks it.
MAX_JSON_BYTES = 16 << 20
MAX_JSON_DEPTH = 32

ONNX_DTYPES = {
    "tensor(float)": np.float32,
    "tensor(int32)": np.int32,
    "tensor(int64)": np.int64,
    "tensor(float16)": np.float16,
    "tensor(bool)": np.bool_,
    "tensor(uint8)": np.uint8,
}


class Runner:
    """What every runner offers: ``inputs`` (dicts of name, shape with None for a symbolic axis, dtype),
    ``outputs`` (dicts of name and shape), and a call on one array or a dict of named arrays that returns the one
    output, or a dict of the named outputs of a model of several."""

    inputs: list[dict]
    outputs: list[dict]

    @property
    def output_name(self) -> str:
        return ", ".join(o["name"] for o in self.outputs)

    @property
    def output_shape(self) -> tuple:
        return self.outputs[0]["shape"]

    def result(self, arrays: list):
        """The one output, or the named outputs as a dict."""
        return arrays[0] if len(self.outputs) == 1 else {o["name"]: a for o, a in zip(self.outputs, arrays)}

    def named(self, x) -> dict[str, np.ndarray]:
        if not isinstance(x, dict):
            if len(self.inputs) != 1:
                raise ValueError(f"the model takes {len(self.inputs)} named inputs: {self.names()}")
            x = {self.inputs[0]["name"]: x}
        missing = sorted(set(self.names()) - set(x))
        if missing:
            raise ValueError(f"missing inputs {missing}; the model takes {self.names()}")
        return {i["name"]: np.ascontiguousarray(x[i["name"]], i["dtype"]) for i in self.inputs}

    def names(self) -> list[str]:
        return [i["name"] for i in self.inputs]


class OnnxModel(Runner):
    """An .onnx file in onnxruntime (CPU)."""

    def __init__(self, model, threads: int | None = None):
        import onnxruntime as ort

        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
        source = str(model) if isinstance(model, Path) else model
        self.session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
        self.inputs = [
            {
                "name": i.name,
                "shape": tuple(d if isinstance(d, int) else None for d in i.shape),
                "dtype": np.dtype(ONNX_DTYPES[i.type]),
            }
            for i in self.session.get_inputs()
        ]
        self.outputs = [
            {"name": o.name, "shape": tuple(d if isinstance(d, int) else None for d in o.shape)}
            for o in self.session.get_outputs()
        ]

    def __call__(self, x):
        return self.result(self.session.run([o["name"] for o in self.outputs], self.named(x)))


class TFLiteModel(Runner):
    """A .tflite file in LiteRT's interpreter; a dynamic batch axis is resized on demand."""

    def __init__(self, model, threads: int | None = None):
        from ai_edge_litert.interpreter import Interpreter

        source = {"model_path": str(model)} if isinstance(model, Path) else {"model_content": bytes(model)}
        self.interpreter = Interpreter(**source, num_threads=threads)
        details = self.interpreter.get_input_details()
        self.inputs = [
            {
                "name": d["name"],
                "shape": tuple(int(n) if n >= 0 else None for n in d["shape_signature"]),
                "dtype": np.dtype(d["dtype"]),
                "index": d["index"],
            }
            for d in details
        ]
        self.outputs = [
            {
                "name": o["name"],
                "shape": tuple(int(d) if d >= 0 else None for d in o["shape_signature"]),
                "index": o["index"],
            }
            for o in self.interpreter.get_output_details()
        ]
        self._allocated = None

    def __call__(self, x) -> np.ndarray:
        named = self.named(x)
        shapes = tuple(named[i["name"]].shape for i in self.inputs)
        if shapes != self._allocated:
            for i, shape in zip(self.inputs, shapes):
                if None in i["shape"]:
                    self.interpreter.resize_tensor_input(i["index"], list(shape))
            self.interpreter.allocate_tensors()
            self._allocated = shapes
        for i in self.inputs:
            self.interpreter.set_tensor(i["index"], named[i["name"]])
        self.interpreter.invoke()
        return self.result([self.interpreter.get_tensor(o["index"]) for o in self.outputs])


def load_model(path: str | Path, threads: int | None = None):
    """An OnnxModel or a TFLiteModel, by the file's suffix; a file its runtime cannot load (not a model, damaged) is
    a ValueError naming it and what the runtime said."""
    path = Path(path)
    runners = {".onnx": OnnxModel, ".tflite": TFLiteModel}
    if path.suffix not in runners:
        raise ValueError(f"{path}: expected a .onnx or .tflite file")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        return runners[path.suffix](path, threads)
    except ImportError:
        raise
    except Exception as error:  # the runtimes' own error types (onnxruntime's InvalidProtobuf, LiteRT's ValueError)
        raise ValueError(f"{path}: the runtime cannot load it as a model ({first_line(error)})") from None


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return (text.splitlines()[0] if text else type(error).__name__)[:300]


def run_batched(model, x, batch_size: int = 256):
    """The model on every row of x (one array or a dict of named arrays): in chunks of its fixed batch (the last one
    zero-padded), or of batch_size. Its output, or a dict of its named outputs."""
    named = x if isinstance(x, dict) else {model.inputs[0]["name"]: x}
    rows = len(next(iter(named.values())))
    fixed = model.inputs[0]["shape"][0]
    step = fixed or batch_size
    outputs = []
    for start in range(0, rows, step):
        chunk = {k: v[start : start + step] for k, v in named.items()}
        n = len(next(iter(chunk.values())))
        if fixed and n < fixed:
            chunk = {k: np.concatenate([v, np.zeros((fixed - n, *v.shape[1:]), v.dtype)]) for k, v in chunk.items()}
        out = model(chunk if isinstance(x, dict) else next(iter(chunk.values())))
        outputs.append({k: v[:n] for k, v in out.items()} if isinstance(out, dict) else out[:n])
    if isinstance(outputs[0], dict):  # named outputs
        return {k: np.concatenate([o[k] for o in outputs]) for k in outputs[0]}
    return np.concatenate(outputs)


def open_input(path: str | Path, limit: int | None = MAX_INPUT_BYTES, what: str = "an input file"):
    """`path` opened for binary reading if it is a regular file of at most `limit` bytes: opened without blocking (a
    FIFO would wait for a writer forever), checked with fstat on the open file, then read normally. The same check
    as files/reads.py, repeated here because this file ships alone."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{path}: not a regular file (a folder, a FIFO or a device)")
        if limit is not None and info.st_size > limit:
            raise ValueError(f"{path}: {info.st_size:,} bytes, more than the {limit:,} {what} may have")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def eight_bit(image, path):
    """16-bit gray ("I;16", or "I" up to 65535) scaled to 8 bits, v * 255 / 65535 rounded, as the image folder loader
    does (Pillow's conversion to "L" would clip it to white); 32-bit and floating-point pixels refused."""
    from PIL import Image

    if image.mode.startswith("I;16") or image.mode == "I":
        pixels = np.asarray(image)
        if pixels.size and (pixels.min() < 0 or pixels.max() > 65535):
            raise ValueError(f"{path}: 32-bit integer pixels ({pixels.min()}..{pixels.max()}), not 8 or 16 bits")
        return Image.fromarray(((pixels.astype(np.uint32) * 255 + 32767) // 65535).astype(np.uint8), "L")
    if image.mode == "F":
        raise ValueError(f"{path}: floating-point pixels have no range to scale to 8 bits; save it as 8 or 16 bits")
    return image


RESAMPLING = {"nearest": 0, "bilinear": 2, "bicubic": 3, "lanczos": 1, "box": 4, "hamming": 5}  # Pillow's numbers


def load_image(path: str | Path, shape: tuple, preprocessing: dict, invert: bool = False) -> np.ndarray:
    """An image file of any size and mode as one (H, W, C) float32 sample of the model's input shape, prepared as
    the training data was: converted to gray ("L") or RGB (a palette through RGBA, an alpha channel dropped), resized
    with the data's filter (`resize` in preprocessing.json, Pillow's bilinear by default) when its size differs,
    then (pixel * pixel_scale - mean) / std, with a mean and std per channel or one for all."""
    from PIL import Image

    height, width, channels = shape
    resample = preprocessing.get("resize", "bilinear")  # read_preprocessing checked it
    try:
        with open_input(path, None) as f, Image.open(f) as image:
            if image.size[0] * image.size[1] > MAX_PIXELS:  # from the header, before decoding
                raise ValueError(
                    f"{path}: {image.size[0]} x {image.size[1]} pixels, more than the {MAX_PIXELS:,} an image may have"
                )
            if image.mode in ("P", "PA"):  # a palette (with transparency) expands through RGBA, as the loaders do
                image = image.convert("RGBA")
            image = eight_bit(image, path).convert("L" if channels == 1 else "RGB")
            if image.size != (width, height):
                image = image.resize((width, height), RESAMPLING[resample])
            pixels = np.asarray(image, np.float32).reshape(height, width, channels)
    except (OSError, Image.DecompressionBombError) as error:  # not an image, a damaged one, a bomb: named
        reason = str(error).splitlines()[0] or type(error).__name__
        raise ValueError(f"{path}: cannot read it as an image ({reason})") from None
    if invert:  # dark strokes on a light background, the reverse of MNIST
        pixels = 255.0 - pixels
    return normalised(pixels * np.asarray(preprocessing.get("pixel_scale", 1.0), np.float32), preprocessing)


def normalised(x: np.ndarray, preprocessing: dict) -> np.ndarray:
    mean = np.asarray(preprocessing.get("mean", 0.0), np.float32)
    std = np.asarray(preprocessing.get("std", 1.0), np.float32)
    return ((x - mean) / std).astype(np.float32)


def from_raw(x: np.ndarray, preprocessing: dict) -> np.ndarray:
    """An array of numbers as the data set's files hold them (pixels of 0..255, a CSV's columns in their units)
    made what the model takes, by the preprocessing the run recorded: (x * pixel_scale - mean) / std, the data set's
    own scaling and the augmentation's normalisation folded in (preprocessing.json). An array of a run that recorded
    none of them (token ids, numbers used as they are) is what the model takes already. The one rule ``--raw`` and
    ``load_run(...)(x, raw=True)`` both follow."""
    if preprocessing.get("columns"):
        raise ValueError(
            "the run's CSV declares columns (categorical, missing cells): give raw rows as a .csv file, or an array "
            "of the encoded features without --raw"
        )
    if not any(key in preprocessing for key in ("pixel_scale", "mean", "std")):
        return x
    if np.asarray(x).dtype.kind not in "biuf":
        raise ValueError(f"raw inputs of dtype {np.asarray(x).dtype}: expected numbers")
    scale = np.asarray(preprocessing.get("pixel_scale", 1.0), np.float32)
    return normalised(np.asarray(x, np.float32) * scale, preprocessing)


def load_rows(path: Path, preprocessing: dict, warnings: list | None = None) -> np.ndarray:
    """A CSV file of raw rows (with the training data's column names as its header; other columns are ignored)
    prepared as the CSV loader prepared the training data, by its own encoding (csv_cells.encode): each declared
    column's empty cells filled with the value learned in training (and its indicator column), a categorical column
    one-hot over the training categories (one it never had: a row of zeros, named in ``warnings``), then
    standardised."""
    import csv
    import io

    try:
        with open_input(path) as raw, io.TextIOWrapper(raw, "utf-8-sig", newline="") as f:
            rows = list(csv.reader(f))
    except (csv.Error, UnicodeDecodeError) as error:  # a cell past csv's 131,072 characters, not UTF-8 text
        raise ValueError(f"{path}: not a readable CSV file ({first_line(error)})") from None
    if not rows:
        raise ValueError(f"{path}: empty; expected a header of column names, then a row per example")
    header, body = [name.strip() for name in rows[0]], [r for r in rows[1:] if r]
    features = preprocessing.get("features") or header
    missing = [c for c in features if c not in header]
    if missing:
        raise ValueError(f"{path}: no column {missing[0]!r}; expected the columns {features}")
    for line, row in enumerate(body, 2):
        if len(row) != len(header):
            raise ValueError(f"{path}: row {line - 1} has {len(row)} cells, the header has {len(header)} columns")
    declared = preprocessing.get("columns") or {}
    encoded = []
    for name in features:
        cells = [row[header.index(name)].strip() for row in body]
        values, bad, unseen = csv_cells.encode(cells, declared.get(name) or {})
        if bad is not None:  # "nan", "inf", "1e400" too, as training refused them
            cell = cells[bad]
            what = f"{cell!r}, not a finite number" if cell else "an empty cell, which training never filled"
            raise ValueError(f"{path}: row {bad + 1}, column {name!r}: {what}")
        if unseen and warnings is not None:
            warnings.append(
                f"{path}: column {name!r}: {', '.join(map(repr, unseen))} not among the training categories "
                f"({', '.join(declared[name]['categories'])}): encoded as none of them"
            )
        encoded.append(values)
    values = np.concatenate(encoded, axis=1) if encoded else np.zeros((len(body), 0))
    return normalised(values.astype(np.float32), preprocessing)


def softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def is_number(value) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


def is_numbers(value) -> bool:
    return is_number(value) or (type(value) is list and bool(value) and all(map(is_number, value)))


def is_names(value) -> bool:
    return type(value) is list and all(type(v) is str for v in value)


def is_columns(value) -> bool:
    """The CSV loader's record of its declared columns: categories (names), a fill (a number or a category), an
    indicator flag."""

    def fits(learned) -> bool:
        return (
            type(learned) is dict
            and set(learned) <= {"categories", "missing", "fill", "indicator"}
            and is_names(learned.get("categories", []))
            and (is_number(learned["fill"]) or type(learned["fill"]) is str if "fill" in learned else True)
            and type(learned.get("indicator", False)) is bool
        )

    return type(value) is dict and all(fits(learned) for learned in value.values())


# What a preprocessing.json may hold and what each field must be: the file comes with a run folder or an export
# from elsewhere, and every reader (predict.py, sample.py, the export) takes it through read_preprocessing.
PREPROCESSING_FIELDS = {
    "task": (lambda v: type(v) is str, "a string"),
    "classes": (is_names, "a list of class names"),
    "vocabulary": (lambda v: type(v) is str and bool(v), "a string of the vocabulary's characters"),
    "features": (is_names, "a list of column names"),
    "targets": (is_names, "a list of column names"),
    "mean": (is_numbers, "a number or a list of numbers"),
    "std": (lambda v: is_numbers(v) and 0 not in (v if type(v) is list else [v]), "a nonzero number or list of them"),
    "pixel_scale": (is_number, "a number"),
    "resize": (lambda v: v in RESAMPLING, f"one of {', '.join(RESAMPLING)}"),
    "context": (lambda v: type(v) is int and v >= 1, "an integer >= 1"),
    "encoded": (is_names, "a list of column names"),
    "columns": (is_columns, "an object of column name -> what training learned of it"),
}


def load_json(path: Path):
    """A JSON file's value, held to files/reads.py's bounds (repeated here, as this file ships alone): a regular file
    of at most MAX_JSON_BYTES, nested at most MAX_JSON_DEPTH levels. FileNotFoundError when absent; a ValueError
    naming the file for anything else wrong with it."""
    try:
        with open_input(path, MAX_JSON_BYTES, "a JSON file") as f:
            data = f.read(MAX_JSON_BYTES + 1)
        if len(data) > MAX_JSON_BYTES:
            raise ValueError(f"more than the {MAX_JSON_BYTES:,} bytes a JSON file may have")
        value = json.loads(data.decode("utf-8-sig"))
    except FileNotFoundError:
        raise
    except (OSError, ValueError, RecursionError) as error:  # unreadable, not UTF-8, not JSON, nested absurdly deep
        reason = "nested too deep" if isinstance(error, RecursionError) else first_line(error)
        raise ValueError(f"{path}: not a readable JSON file ({reason.removeprefix(f'{path}: ')})") from None
    deepest, stack = 0, [(value, 0)]
    while stack:  # iterative: no nesting can overflow the stack
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        stack.extend((child, depth + 1) for child in children)
    if deepest > MAX_JSON_DEPTH:
        raise ValueError(f"{path}: nested deeper than {MAX_JSON_DEPTH} levels")
    return value


def read_preprocessing(path: Path) -> dict:
    """A run folder's or an export's preprocessing.json, every field it has checked ({} when there is none); what is
    wrong is a ValueError naming the file and the field."""
    try:
        value = load_json(path)
    except FileNotFoundError:
        return {}
    if type(value) is not dict:
        raise ValueError(f"{path}: expected a JSON object of the data's preprocessing, got {type(value).__name__}")
    for name, (accepts, expected) in PREPROCESSING_FIELDS.items():
        if name in value and not accepts(value[name]):
            raise ValueError(f"{path}: {name!r} is {json.dumps(value[name])[:60]}, expected {expected}")
    return value


def read_json(path: Path) -> dict:
    """An optional JSON object (config.json, for the model's name): {} when absent or not an object."""
    try:
        value = load_json(path)
    except (OSError, ValueError):
        return {}
    return value if type(value) is dict else {}


def check_names_fit(model, preprocessing: dict, path: Path) -> None:
    """The names preprocessing.json gives the model's outputs (class names, a vocabulary's characters), one per
    output of each example or position: a list of another length (one class name for a model of two outputs) would
    name the wrong ones or fail mid-output, so it is a ValueError naming the file first."""
    tasks = preprocessing.get("tasks") or {}
    for output in model.outputs:
        several = len(model.outputs) > 1
        info = {**preprocessing, **((preprocessing.get("outputs") or {}).get(output["name"]) or {})}
        task = tasks.get(output["name"], "other") if several else info.get("task", "classification")
        width = output["shape"][-1] if output["shape"] else None
        named = f"output {output['name']!r}" if several else "the model"
        if info.get("vocabulary") and isinstance(width, int) and width != len(info["vocabulary"]):
            raise ValueError(
                f"{path}: a vocabulary of {len(info['vocabulary'])} characters, but {named} gives {width} outputs "
                "per position: is this the model's own preprocessing.json?"
            )
        per_example = task == "classification" or (task == "multilabel" and len(output["shape"]) == 2)
        if per_example and info.get("classes") and isinstance(width, int) and width != len(info["classes"]):
            raise ValueError(
                f"{path}: {len(info['classes'])} class name(s), but {named} gives {width} outputs per example: is "
                "this the model's own preprocessing.json?"
            )


def generate(model, vocabulary: str, prompt: str, tokens: int, temperature: float, seed: int = 0) -> str:
    """Text from an exported causal language model of fixed context: the last `context` characters sit at the start
    of the input, padded on the right, and the next one comes from the logits at the last real position."""
    unknown = sorted(set(prompt) - set(vocabulary))
    if unknown or not prompt:
        raise ValueError(
            f"--text: characters not in the vocabulary: {''.join(unknown)!r}"
            if unknown
            else "--text: give at least one character"
        )
    context = model.inputs[0]["shape"][1]
    batch = model.inputs[0]["shape"][0] or 1
    rng = np.random.default_rng(seed)
    ids = [vocabulary.index(c) for c in prompt]
    for _ in range(tokens):
        recent = ids[-context:]
        window = np.zeros((batch, context), model.inputs[0]["dtype"])
        window[0, : len(recent)] = recent
        logits = model(window)[0, len(recent) - 1].astype(np.float64)
        if temperature == 0:
            ids.append(int(logits.argmax()))
        else:
            p = softmax(logits / temperature)
            ids.append(int(rng.choice(len(p), p=p)))
    return "".join(vocabulary[i] for i in ids)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="an exported .onnx or .tflite file")
    parser.add_argument(
        "inputs",
        nargs="*",
        help="image files (PNG, JPEG, ...) or folders of them, .csv rows, .npy batches, or .npz files of named inputs",
    )
    parser.add_argument(
        "--top",
        type=int,
        default=None,
        help="classes to print per input (default 3); multi-label: labels to print besides the "
        "predicted ones, which are always printed (default: every label)",
    )
    parser.add_argument("--invert", action="store_true", help="invert images (dark digit on a light background)")
    parser.add_argument("--text", help="language model: the text to continue")
    parser.add_argument("--tokens", type=int, default=100, help="language model: characters to generate")
    parser.add_argument("--temperature", type=float, default=0.8, help="language model: 0 = most likely character")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="runtime threads (default: the runtime's)")
    parser.add_argument(
        "--out",
        help="also write the outputs to FILE: .npy (the outputs, a row per input), .npz (outputs and the inputs' "
        "names), .csv (a row per input of vector outputs), .png (image outputs: FILE for one input, FILE_<i>.png each "
        "for several); a classifier's .csv and .npz hold probabilities and predicted labels",
    )
    parser.add_argument(
        "--raw",
        action="store_true",
        help=".npy/.npz arrays hold the inputs as the data set's files do (pixels of 0..255, a CSV's numbers in their "
        "units): the recorded preprocessing is applied, as to images (default: as the model takes them)",
    )
    parser.add_argument(
        "--quiet", action="store_true", help="no line per input: only what was run and the files --out wrote"
    )
    parser.add_argument(
        "--threshold",
        type=float,
        default=None,
        help="multi-label and binary: the probability above which a label is predicted (default: the first "
        "threshold in config.json's metrics, the one the run was scored at, else 0.5)",
    )
    args = parser.parse_args(argv)
    checks = [
        (args.top is not None and args.top < 1, f"--top {args.top}: expected 1 or more"),
        (not 0 <= args.tokens <= MAX_TOKENS, f"--tokens {args.tokens}: expected 0 to {MAX_TOKENS:,}"),
        (not 0 <= args.temperature < float("inf"), f"--temperature {args.temperature}: expected a number >= 0"),
        (
            args.threads is not None and not 1 <= args.threads <= MAX_THREADS,
            f"--threads {args.threads}: expected 1 to {MAX_THREADS}",
        ),
        (not 0 <= args.seed < 2**63, f"--seed {args.seed}: expected an integer from 0 to 2**63 - 1"),
        (
            args.threshold is not None and not 0 < args.threshold < 1,
            f"--threshold {args.threshold}: expected a probability between 0 and 1, exclusive",
        ),
        (
            args.out is not None and Path(args.out).suffix not in OUT_SUFFIXES,
            f"--out {args.out}: expected a {', '.join(OUT_SUFFIXES)} file",
        ),
    ]
    for bad, message in checks:
        if bad:
            print(f"error: {message}", file=sys.stderr)
            return 2

    model_path = Path(args.model)
    folder = model_path.parent
    try:
        preprocessing = read_preprocessing(folder / PREPROCESSING)
        task = preprocessing.get("task", "classification")
        model = load_model(model_path, args.threads)
        check_names_fit(model, preprocessing, folder / PREPROCESSING)
        if preprocessing.get("vocabulary"):
            if args.text is None:
                raise ValueError("a language model: give --text to continue")
            print(generate(model, preprocessing["vocabulary"], args.text, args.tokens, args.temperature, args.seed))
            return 0
        if not args.inputs:
            raise ValueError("give input files (images, .csv rows, .npy or .npz batches)")
        warnings = []
        paths = input_files(map(Path, args.inputs))
        names, x = read_inputs(model, paths, preprocessing, args.invert, warnings, args.raw)
        warnings.append(range_warning(x, preprocessing))
        for warning in filter(None, warnings):
            print(f"warning: {warning}", file=sys.stderr)
        raw = run_batched(model, x)
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except RuntimeError as error:  # the runtime failed on a model it loaded (a damaged one)
        print(f"error: {model_path}: the runtime failed to run it ({first_line(error)})", file=sys.stderr)
        return 2

    config = read_json(folder / CONFIG)
    title = config.get("name", model_path.stem)
    threshold, origin = (args.threshold, "--threshold") if args.threshold is not None else decision_threshold(config)
    tasks = preprocessing.get("tasks") or {}
    written = []
    if args.out is not None:  # before any prediction is printed: outputs the format cannot hold are refused first
        try:
            written = write_outputs(Path(args.out), names, raw, task, preprocessing, threshold)
        except ValueError as error:  # outputs the format cannot hold: nothing written
            print(f"error: {error}", file=sys.stderr)
            return 2
        except OSError as error:
            print(f"error: cannot write {error.filename or args.out} ({error.strerror or error})", file=sys.stderr)
            return 1
    if "multilabel" in (task, *tasks.values()):
        print(f"labels predicted above probability {threshold:g} ({origin})")
    shown = [] if args.quiet else names  # 2,000 inputs with --out need no 2,000 lines
    if not isinstance(raw, dict):
        print(f"{title}: {model_path.name}, {len(names)} input(s), task {task}")
        for name, out in zip(shown, raw.astype(np.float64)):
            print(f"{name}: {describe(out, task, preprocessing, args.top, threshold)}")
    else:  # a model of several named outputs: each by its own task and its own preprocessing (class names, say)
        described = ", ".join(f"{k} ({tasks.get(k, 'other')})" for k in raw)
        print(f"{title}: {model_path.name}, {len(names)} input(s), outputs {described}")
        for i, name in enumerate(shown):
            print(f"{name}:")
            for output, values in raw.items():
                info = {**preprocessing, **((preprocessing.get("outputs") or {}).get(output) or {})}
                text = describe(values[i].astype(np.float64), tasks.get(output, "other"), info, args.top, threshold)
                print(f"  {output}: {text}")
    if written:
        print(f"wrote {written[0]}" + (f" ... {written[-1].name} ({len(written)} files)" if len(written) > 1 else ""))
    return 0


OUT_SUFFIXES = (".npy", ".npz", ".csv", ".png")
RANGE_SLACK = 1.0  # an input may reach this many widths of the training range beyond it before a warning


def range_warning(x, preprocessing: dict) -> str | None:
    """A line when the inputs lie far outside the range the model was trained on (``input_range`` in
    preprocessing.json, from the training data): an image of 0..255 given to a model trained on 0..1."""
    trained = preprocessing.get("input_range")
    if isinstance(x, dict):  # the recorded range is of a single input
        x = next(iter(x.values())) if len(x) == 1 else None
    if not trained or x is None or not np.issubdtype(x.dtype, np.number) or not x.size:
        return None
    lo, hi = trained
    width = max(hi - lo, 1e-12)
    got_lo, got_hi = float(x.min()), float(x.max())
    if got_lo >= lo - RANGE_SLACK * width and got_hi <= hi + RANGE_SLACK * width:
        return None
    return (
        f"the inputs range over {got_lo:.4g}..{got_hi:.4g}, the model was trained on {lo:.4g}..{hi:.4g} "
        f"({PREPROCESSING} input_range): are they prepared as the training data was (pixel_scale, mean, std)?"
    )


def write_outputs(
    path: Path, names: list[str], outputs, task: str, preprocessing: dict, threshold: float = THRESHOLD
) -> list[Path]:
    """The outputs in the file --out names (see its help); each file written whole under a temporary name, then
    renamed into place. Returns the files written. A model of several named outputs (a dict) writes .npz only:
    one array per output name. A classifier's .csv and .npz hold probabilities and the predicted labels (multi-label:
    0/1 per label above ``threshold``), not logits."""
    if isinstance(outputs, dict):
        if path.suffix != ".npz":
            raise ValueError(f"--out {path}: a model of several named outputs writes .npz (an array per output)")
        buffer = io.BytesIO()
        np.savez(buffer, names=np.array(names), **{f"outputs/{k}": v for k, v in outputs.items()})
        return [write_file(path, buffer.getvalue())]
    if path.suffix == ".png":
        return write_images(path, outputs, task, preprocessing)
    decided = decisions(outputs, task, preprocessing, threshold) if path.suffix in (".csv", ".npz") else None
    if decided is not None and path.suffix == ".csv":
        probabilities, labels, label_columns = decided
        columns = [f"{c} probability" for c in label_columns] + (
            label_columns if task == "multilabel" else ["predicted"]
        )
        lines = [",".join(["input", *map(csv_cell, columns)])]
        for n, p, chosen in zip(names, probabilities, labels):
            shown = [str(int(v)) for v in chosen] if task == "multilabel" else [csv_cell(label_columns[chosen])]
            lines.append(",".join([csv_cell(n), *(f"{v:.9g}" for v in p), *shown]))
        return [write_file(path, ("\n".join(lines) + "\n").encode())]
    if path.suffix == ".csv":
        if outputs.ndim > 2:
            raise ValueError(
                f"--out {path}: outputs of shape {list(outputs.shape[1:])} per input are no table row; "
                "write .npy, .npz, or .png for images"
            )
        flat = outputs.reshape(len(outputs), -1)
        columns = preprocessing.get("targets") if task == "regression" else preprocessing.get("classes")
        if not columns or len(columns) != flat.shape[1]:
            columns = [f"output_{i}" for i in range(flat.shape[1])]
        lines = [",".join(["input", *map(csv_cell, columns)])]
        lines += [",".join([csv_cell(n), *(f"{v:.9g}" for v in row)]) for n, row in zip(names, flat)]
        return [write_file(path, ("\n".join(lines) + "\n").encode())]
    buffer = io.BytesIO()
    if path.suffix == ".npy":
        np.save(buffer, outputs)
    elif decided is not None:
        probabilities, labels, label_columns = decided
        extra = {"threshold": np.float64(threshold)} if task == "multilabel" else {}
        np.savez(
            buffer,
            outputs=outputs,
            probabilities=probabilities,
            labels=labels,
            label_names=np.array(label_columns),
            names=np.array(names),
            **extra,
        )
    else:
        np.savez(buffer, outputs=outputs, names=np.array(names))
    return [write_file(path, buffer.getvalue())]


def decisions(outputs: np.ndarray, task: str, preprocessing: dict, threshold: float):
    """(probabilities, labels, label names) of a classifier's vector outputs (N, C): softmax and the argmax class id
    (N,), or, multi-label, sigmoid and 0/1 per label (N, L) above ``threshold``; None for other tasks and shapes."""
    if outputs.ndim != 2 or task not in ("classification", "multilabel"):
        return None
    logits = outputs.astype(np.float64)
    if task == "classification":
        p = softmax(logits)
        classes = preprocessing.get("classes")
        names = (
            [str(c) for c in classes] if classes and len(classes) == p.shape[1] else list(map(str, range(p.shape[1])))
        )
        return p, p.argmax(axis=1), names
    p = sigmoid(logits)
    return p, (p > threshold).astype(np.int8), label_names(preprocessing, p.shape[1])


def csv_cell(text: str) -> str:
    """A text cell of an --out CSV, as a spreadsheet opens it: text starting with = + - @, a tab or a carriage
    return gets a leading ' (OWASP's escape), else a class named "=1+1" would run as a formula; text that is a
    number ("-1") stays as it is. Quoted where it holds a comma, a quote or a line break."""
    if text[:1] in ("=", "+", "-", "@", "\t", "\r") and not is_number_text(text):
        text = "'" + text
    return '"' + text.replace('"', '""') + '"' if any(c in text for c in ',"\n\r') else text


def is_number_text(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def write_images(path: Path, outputs: np.ndarray, task: str, preprocessing: dict) -> list[Path]:
    """One PNG per input: masks (multi-label) as probabilities 0..255, a class per pixel as gray levels, other
    values mapped from the range the model's inputs had in training (an image-to-image model's own scale), else
    from each image's own range."""
    from PIL import Image

    shape = outputs.shape[1:]
    if not (len(shape) == 2 or (len(shape) == 3 and shape[-1] in (1, 3, 4)) or task == "sequence"):
        raise ValueError(
            f"--out {path}: outputs of shape {list(shape)} per input are no image (expected H, W with 1, 3 or 4 "
            "channels); write .npy or .npz"
        )
    values = outputs.astype(np.float64)
    if task == "multilabel":
        values = 1.0 / (1.0 + np.exp(-values))
    elif task == "sequence":  # a class per pixel: its id as a gray level
        values = values.argmax(-1) / max(values.shape[-1] - 1, 1)
    elif preprocessing.get("input_range"):
        lo, hi = preprocessing["input_range"]
        values = (values - lo) / max(hi - lo, 1e-12)
    else:
        lo = values.reshape(len(values), -1).min(axis=1).reshape((-1,) + (1,) * (values.ndim - 1))
        hi = values.reshape(len(values), -1).max(axis=1).reshape((-1,) + (1,) * (values.ndim - 1))
        values = (values - lo) / np.maximum(hi - lo, 1e-12)
    pixels = np.clip(np.rint(values * 255.0), 0, 255).astype(np.uint8)
    if pixels.ndim == 4 and pixels.shape[-1] == 1:
        pixels = pixels[..., 0]
    targets = [path] if len(pixels) == 1 else [path.with_name(f"{path.stem}_{i}.png") for i in range(len(pixels))]
    for target, image in zip(targets, pixels):
        buffer = io.BytesIO()
        Image.fromarray(image).save(buffer, format="PNG")
        write_file(target, buffer.getvalue())
    return targets


def write_file(path: Path, data: bytes) -> Path:
    """``data`` under a temporary name in the target's folder, fsynced, then renamed over the target: a reader finds
    the old file or the new one, never half of one; a link at the target is replaced, never written through."""
    import os
    import tempfile

    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return path


def read_inputs(
    model, paths, preprocessing: dict, invert: bool = False, warnings: list | None = None, raw: bool = False
) -> tuple[list[str], dict]:
    """(a name per example, the model's named inputs) from files: images, .csv rows (raw, as the training CSV held
    them) and .npy batches for a model of one input; .npz files holding one array per input name (a batch, or one
    example) for any model. Arrays are what the model takes, or with ``raw`` what the data set's files hold
    (``from_raw``; a model of one input). What is worth a warning (an unseen category) is added to ``warnings``."""
    expected = {i["name"]: i for i in model.inputs}
    # a padding mask beside other inputs may be left out: then every position is real
    optional = {MASK} if MASK in expected and len(expected) > 1 else set()
    given = [i for i in model.inputs if i["name"] not in optional]
    names, parts = [], []
    for path in paths:
        if path.suffix == ".npz":
            with open_input(path) as f, np.load(f, allow_pickle=False) as archive:
                missing = sorted(set(expected) - set(archive.files) - optional)
                if missing:
                    raise ValueError(f"{path}: no array {missing[0]!r}; the model takes {model.names()}")
                # a compressed member inflates to what it declares (zipfile holds it to that): bounded before
                present = [k for k in expected if k in archive.files]
                declared = sum(archive.zip.getinfo(f"{k}.npy").file_size for k in present)
                if declared > MAX_INPUT_BYTES:
                    raise ValueError(
                        f"{path}: its arrays declare {declared:,} bytes, more than the {MAX_INPUT_BYTES:,} an "
                        "input file may hold"
                    )
                named = {k: archive[k] for k in present}
            if raw and len(given) > 1:
                raise ValueError(f"--raw: the model takes {len(given)} named inputs; give them as it takes them")
            if raw:
                named = {k: from_raw(v, preprocessing) if k == given[0]["name"] else v for k, v in named.items()}
        elif len(given) > 1:
            raise ValueError(
                f"{path}: the model takes {len(model.inputs)} named inputs {model.names()}: give .npz "
                "files with one array per name"
            )
        elif path.suffix == ".npy":
            with open_input(path) as f:
                named = {given[0]["name"]: np.load(f, allow_pickle=False)}
            if raw:
                named = {k: from_raw(v, preprocessing) for k, v in named.items()}
        elif path.suffix == ".csv":
            named = {given[0]["name"]: load_rows(path, preprocessing, warnings)}
        else:
            if path.suffix.lower() not in IMAGE_SUFFIXES or len(given[0]["shape"]) != 4:
                raise ValueError(f"{path}: not a file this model takes; it takes {takes(given[0])}")
            if not preprocessing:
                raise ValueError(
                    f"{path.parent / PREPROCESSING} not found: it says how to prepare images; "
                    "pass a preprocessed .npy batch instead"
                )
            named = {given[0]["name"]: load_image(path, given[0]["shape"][1:], preprocessing, invert)}
        # One example (the sample shape) or a batch of them.
        named = {k: v[None] if v.ndim == len(expected[k]["shape"]) - 1 else v for k, v in named.items()}
        for k, v in named.items():
            if v.shape[1:] != tuple(expected[k]["shape"][1:]):
                raise ValueError(
                    f"{path}: input {k!r} has shape {list(v.shape[1:])} per example, the model expects "
                    f"{list(expected[k]['shape'][1:])}"
                )
        rows = {len(v) for v in named.values()}
        if len(rows) > 1:
            raise ValueError(f"{path}: the arrays hold different numbers of examples {sorted(rows)}")
        (n,) = rows
        if n == 0:  # a header without rows, an empty batch: nothing the model could run on
            raise ValueError(f"{path}: no examples in it (0 rows); give at least one")
        for k in optional - set(named):
            named[k] = np.ones((n, *expected[k]["shape"][1:]), expected[k]["dtype"])
        single = n == 1 and path.suffix not in (".npy", ".npz", ".csv")
        shown = relative(path)
        names += [str(shown)] if single else [f"{shown}[{i}]" for i in range(n)]
        parts.append(named)
    x = {k: np.concatenate([p[k] for p in parts]) for k in expected}
    for k, v in x.items():  # complex numbers would lose their imaginary part, text would fail in the runtime
        if v.dtype.kind not in "biuf":
            what = "complex numbers" if v.dtype.kind == "c" else f"values of dtype {v.dtype}"
            raise ValueError(f"input {k!r}: {what}; the model takes real numbers ({expected[k]['dtype']})")
    for k, v in x.items():  # int64 ids 2**32 + 3 would wrap to 3 as the model's int32: refused, not guessed
        dtype = expected[k]["dtype"]
        if v.dtype.kind in "iu" and dtype.kind in "iu" and v.size:
            info = np.iinfo(dtype)
            if v.min() < info.min or v.max() > info.max:
                raise ValueError(f"input {k!r}: values {v.min()}..{v.max()} do not fit the model's {dtype}")
    return names, {k: v.astype(expected[k]["dtype"]) for k, v in x.items()}


def takes(spec: dict) -> str:
    """The files a model of the one input ``spec`` takes, in words: images where its examples are (H, W, C)."""
    arrays = f".npy or .npz arrays of examples of shape {list(spec['shape'][1:])}"
    if len(spec["shape"]) == 4:
        return f"images ({', '.join(IMAGE_SUFFIXES)}) or {arrays}"
    return f".csv rows or {arrays}"


def input_files(paths) -> list[Path]:
    """The files given, a folder replaced by the image files under it, sorted (hidden ones skipped, as the image
    folder loader skips them)."""
    files = []
    for path in paths:
        if not path.is_dir():
            files.append(path)
            continue
        found = sorted(
            p
            for p in path.rglob("*")
            if p.suffix.lower() in IMAGE_SUFFIXES
            and p.is_file()
            and not any(part.startswith(".") for part in p.relative_to(path).parts)
        )
        if not found:
            raise ValueError(f"{path}: a folder of no image files ({', '.join(IMAGE_SUFFIXES)})")
        files += found
    return files


def relative(path: Path) -> Path:
    """An input's path as its name in the outputs: relative to the working folder where it lies under it (as a user
    types it), so an --out file shared with others does not carry this machine's folders."""
    try:
        return path.absolute().relative_to(Path.cwd())
    except ValueError:
        return path


def decision_threshold(config: dict) -> tuple[float, str]:
    """(the probability above which a sigmoid output is a predicted label, where it comes from): the first
    ``threshold`` the config's metrics name in their args, the one the run was scored at, else THRESHOLD. test.py,
    the export and predict.py all decide labels by it (predict.py's --threshold overrides it)."""
    for i, spec in enumerate(config.get("metrics") or []):
        args = spec.get("args") if isinstance(spec, dict) else None
        if isinstance(args, dict) and "threshold" in args:
            value = args["threshold"]
            if is_number(value) and 0 < value < 1:
                return float(value), f"metrics.{i}.args.threshold"
    return THRESHOLD, "the default"


def label_names(preprocessing: dict, count: int) -> list[str]:
    """The names of a classifier's classes or labels: the data's class names, or a CSV's target columns."""
    for names in (preprocessing.get("classes"), preprocessing.get("targets")):
        if names and len(names) == count:
            return [str(n) for n in names]
    return [str(i) for i in range(count)]


def sigmoid(x: np.ndarray) -> np.ndarray:
    # exp of -|x| only: no overflow at large logits of either sign
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def describe(output: np.ndarray, task: str, preprocessing: dict, top: int | None, threshold: float = THRESHOLD) -> str:
    """One example's output in words: top classes; the predicted labels (above ``threshold``), then the others; a
    mask's share; or raw values."""
    if task == "classification":
        p = softmax(output)
        classes = preprocessing.get("classes") or [str(i) for i in range(len(p))]
        return ", ".join(f"{classes[c]} ({p[c]:.3f})" for c in np.argsort(-p)[: top or 3])
    if task == "multilabel":
        p = sigmoid(output)
        if p.ndim == 1:
            labels = label_names(preprocessing, len(p))
            order = np.argsort(-p)
            named = lambda cs: ", ".join(f"{labels[c]} ({p[c]:.3f})" for c in cs) or "none"  # noqa: E731
            predicted, others = order[p[order] > threshold], order[p[order] <= threshold]
            others = others[: len(others) if top is None else top]
            return f"predicted: {named(predicted)}" + (f"; below {threshold:g}: {named(others)}" if len(others) else "")
        return f"{int((p > threshold).sum())} of {p.size} elements positive (mean probability {p.mean():.3f})"
    names = preprocessing.get("targets") or [f"output {i}" for i in range(output.size)]
    flat = output.reshape(-1)
    if len(flat) <= 8:
        return ", ".join(f"{n} = {v:.6g}" for n, v in zip(names, flat))
    return f"shape {list(output.shape)}, first values {', '.join(f'{v:.4g}' for v in flat[:8])}, ..."


def command(main, argv=None) -> int:
    """training/run/cli.py's ``command``, repeated because this file ships alone: Ctrl-C is one line and status 130, a
    closed pipe (``| head -1``) ends quietly with 141, text the terminal's encoding cannot show is escaped; stdout or
    stderr closed at the start (``>&-``) is one line and 2, stdout that cannot be written (``> /dev/full``) one line
    and 1."""
    closed = [name for name, stream in (("stdout", sys.stdout), ("stderr", sys.stderr)) if stream is None]
    if closed:  # a file opened later would take the closed descriptor's number, and the output meant for it
        message = f"error: {' and '.join(closed)} closed (>&-): give it a file or /dev/null (>/dev/null) instead"
        print(message, file=sys.stderr if sys.stderr is not None else sys.stdout)
        return 2
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    out = sys.stdout = Output(sys.stdout)
    try:
        status = ended(main, argv)
    finally:
        sys.stdout = out.stream
    if out.error is not None:
        reason = out.error.strerror or out.error
        print(f"error: cannot write to standard output ({reason}); what was printed is lost", file=sys.stderr)
        return status or 1
    return status


class Output:
    """sys.stdout while ``command`` runs: a write that fails (a full disk) is kept, not raised from the print, and
    the rest discarded; a closed pipe still raises BrokenPipeError (training/run/cli.py's ``Output``, repeated)."""

    def __init__(self, stream):
        self.stream, self.error = stream, None

    def write(self, text: str) -> int:
        if self.error is None:
            try:
                return self.stream.write(text)
            except BrokenPipeError:
                raise
            except OSError as error:
                self.lost(error)
        return len(text)

    def flush(self) -> None:
        if self.error is None:
            try:
                self.stream.flush()
            except BrokenPipeError:
                raise
            except OSError as error:
                self.lost(error)

    def lost(self, error: OSError) -> None:
        self.error = error
        try:  # what is still buffered would fail again at exit: the descriptor now writes to /dev/null
            os.dup2(os.open(os.devnull, os.O_WRONLY), self.stream.fileno())
        except (OSError, ValueError):  # no descriptor (a capture in a test)
            pass

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


def ended(main, argv) -> int:
    try:
        try:
            return main(argv)
        finally:
            sys.stdout.flush()
    except KeyboardInterrupt:
        print("error: stopped by SIGINT (Ctrl-C)", file=sys.stderr)
        return 130
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(command(main))
