"""Run an exported model on files and print what it says, as its task calls for:

    python inference/predict.py exports/jax_mnist/jax_mnist.onnx digit.png other.jpg [--top 3]   # classes
    python inference/predict.py exports/jax_mnist/jax_mnist.tflite batch.npy
    python inference/predict.py exports/regressor/regressor.onnx rows.csv        # raw values per target column
    python inference/predict.py exports/shakespeare/shakespeare.onnx --text "ROMEO:" --tokens 100   # text

A model of several named outputs (a multi-task model) prints each output by its own task under its name.

Images are resized and normalised as the training data was: the numbers come from `preprocessing.json`, which the
converter writes next to the model (from the run's data pipeline), plus the run's `config.json` for its name. A
.npy file holds inputs already preprocessed, (N, H, W, C) or one (H, W, C) sample; a model of several named inputs
takes .npz files with one such array per input name (`np.savez("x.npz", features=..., image=...)`).

This file imports only numpy, Pillow (for images) and the runtime the model needs, onnxruntime or ai-edge-litert:
no JAX, no TensorFlow. Copied with the export folder, it is all a deployment machine needs. The converter runs its
parity checks through the same two runner classes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

# The export folder's files next to the model (exporter.write_extras writes them under these names). Named here,
# not imported from training/, because this file ships alone; they are the run folder's names (training/files.py).
CONFIG = "config.json"
PREPROCESSING = "preprocessing.json"

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
    """An OnnxModel or a TFLiteModel, by the file's suffix."""
    path = Path(path)
    runners = {".onnx": OnnxModel, ".tflite": TFLiteModel}
    if path.suffix not in runners:
        raise ValueError(f"{path}: expected a .onnx or .tflite file")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    return runners[path.suffix](path, threads)


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


RESAMPLING = {"nearest": 0, "bilinear": 2, "bicubic": 3, "lanczos": 1, "box": 4, "hamming": 5}  # Pillow's numbers


def load_image(path: str | Path, shape: tuple, preprocessing: dict, invert: bool = False) -> np.ndarray:
    """An image file of any size and mode as one (H, W, C) float32 sample of the model's input shape, prepared as
    the training data was: converted to gray ("L") or RGB (a palette through RGBA, an alpha channel dropped), resized
    with the data's filter (`resize` in preprocessing.json, Pillow's bilinear by default) when its size differs,
    then (pixel * pixel_scale - mean) / std, with a mean and std per channel or one for all."""
    from PIL import Image

    height, width, channels = shape
    resample = preprocessing.get("resize", "bilinear")
    if resample not in RESAMPLING:
        raise ValueError(f"{PREPROCESSING}: resize {resample!r}: expected one of {', '.join(RESAMPLING)}")
    try:
        with Image.open(path) as image:
            if image.mode in ("P", "PA"):  # a palette (with transparency) expands through RGBA, as the loaders do
                image = image.convert("RGBA")
            image = image.convert("L" if channels == 1 else "RGB")
            if image.size != (width, height):
                image = image.resize((width, height), RESAMPLING[resample])
            pixels = np.asarray(image, np.float32).reshape(height, width, channels)
    except OSError as error:  # not an image, or a damaged one: named, not a traceback
        reason = str(error).splitlines()[0] or type(error).__name__
        raise ValueError(f"{path}: cannot read it as an image ({reason})") from None
    if invert:  # dark strokes on a light background, the reverse of MNIST
        pixels = 255.0 - pixels
    return normalised(pixels * np.asarray(preprocessing.get("pixel_scale", 1.0), np.float32), preprocessing)


def normalised(x: np.ndarray, preprocessing: dict) -> np.ndarray:
    mean = np.asarray(preprocessing.get("mean", 0.0), np.float32)
    std = np.asarray(preprocessing.get("std", 1.0), np.float32)
    return ((x - mean) / std).astype(np.float32)


def load_rows(path: Path, preprocessing: dict) -> np.ndarray:
    """A CSV file of raw feature rows (with the training data's column names as its header), standardised as in
    training."""
    import csv

    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header, body = rows[0], [r for r in rows[1:] if r]
    features = preprocessing.get("features") or header
    missing = [c for c in features if c not in header]
    if missing:
        raise ValueError(f"{path}: no column {missing[0]!r}; expected the columns {features}")
    columns = [header.index(c) for c in features]
    try:
        values = np.array([[float(r[c]) for c in columns] for r in body], np.float32)
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None
    return normalised(values, preprocessing)


def softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


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
        "inputs", nargs="*", help="image files (PNG, JPEG, ...), .csv rows, .npy batches, or .npz files of named inputs"
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
    args = parser.parse_args(argv)
    checks = [
        (args.top is not None and args.top < 1, f"--top {args.top}: expected 1 or more"),
        (args.tokens < 0, f"--tokens {args.tokens}: expected 0 or more"),
        (not 0 <= args.temperature < float("inf"), f"--temperature {args.temperature}: expected a number >= 0"),
        (args.threads is not None and args.threads < 1, f"--threads {args.threads}: expected 1 or more"),
    ]
    for bad, message in checks:
        if bad:
            print(f"error: {message}", file=sys.stderr)
            return 2

    model_path = Path(args.model)
    folder = model_path.parent
    preprocessing = read_json(folder / PREPROCESSING)
    task = preprocessing.get("task", "classification")
    try:
        model = load_model(model_path, args.threads)
        if preprocessing.get("vocabulary"):
            if args.text is None:
                raise ValueError("a language model: give --text to continue")
            print(generate(model, preprocessing["vocabulary"], args.text, args.tokens, args.temperature, args.seed))
            return 0
        if not args.inputs:
            raise ValueError("give input files (images, .csv rows, .npy or .npz batches)")
        names, x = read_inputs(model, map(Path, args.inputs), preprocessing, args.invert)
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2

    outputs = run_batched(model, x)
    title = read_json(folder / CONFIG).get("name", model_path.stem)
    if not isinstance(outputs, dict):
        print(f"{title}: {model_path.name}, {len(names)} input(s), task {task}")
        for name, out in zip(names, outputs.astype(np.float64)):
            print(f"{name}: {describe(out, task, preprocessing, args.top)}")
        return 0
    # a model of several named outputs: each by its own task and its own preprocessing (class names, say)
    tasks = preprocessing.get("tasks") or {}
    described = ", ".join(f"{k} ({tasks.get(k, 'other')})" for k in outputs)
    print(f"{title}: {model_path.name}, {len(names)} input(s), outputs {described}")
    for i, name in enumerate(names):
        print(f"{name}:")
        for output, values in outputs.items():
            info = {**preprocessing, **((preprocessing.get("outputs") or {}).get(output) or {})}
            text = describe(values[i].astype(np.float64), tasks.get(output, "other"), info, args.top)
            print(f"  {output}: {text}")
    return 0


def read_inputs(model, paths, preprocessing: dict, invert: bool = False) -> tuple[list[str], dict]:
    """(a name per example, the model's named inputs) from files: images, .csv rows and .npy batches for a model of
    one input; .npz files holding one array per input name (a batch, or one example) for any model."""
    expected = {i["name"]: i for i in model.inputs}
    names, parts = [], []
    for path in paths:
        if path.suffix == ".npz":
            with np.load(path) as archive:
                missing = sorted(set(expected) - set(archive.files))
                if missing:
                    raise ValueError(f"{path}: no array {missing[0]!r}; the model takes {model.names()}")
                named = {k: archive[k] for k in expected}
        elif len(model.inputs) > 1:
            raise ValueError(
                f"{path}: the model takes {len(model.inputs)} named inputs {model.names()}: give .npz "
                "files with one array per name"
            )
        elif path.suffix == ".npy":
            named = {model.inputs[0]["name"]: np.load(path)}
        elif path.suffix == ".csv":
            named = {model.inputs[0]["name"]: load_rows(path, preprocessing)}
        else:
            if not preprocessing:
                raise ValueError(
                    f"{path.parent / PREPROCESSING} not found: it says how to prepare images; "
                    "pass a preprocessed .npy batch instead"
                )
            named = {model.inputs[0]["name"]: load_image(path, model.inputs[0]["shape"][1:], preprocessing, invert)}
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
        single = n == 1 and path.suffix not in (".npy", ".npz", ".csv")
        names += [str(path)] if single else [f"{path}[{i}]" for i in range(n)]
        parts.append(named)
    x = {k: np.concatenate([p[k] for p in parts]).astype(expected[k]["dtype"]) for k in expected}
    return names, x


THRESHOLD = 0.5  # a multi-label output counts as predicted above this probability, as the metrics count it


def describe(output: np.ndarray, task: str, preprocessing: dict, top: int | None) -> str:
    """One example's output in words: top classes; the predicted labels (above THRESHOLD), then the others; a mask's
    share; or raw values."""
    if task == "classification":
        p = softmax(output)
        classes = preprocessing.get("classes") or [str(i) for i in range(len(p))]
        return ", ".join(f"{classes[c]} ({p[c]:.3f})" for c in np.argsort(-p)[: top or 3])
    if task == "multilabel":
        p = 1.0 / (1.0 + np.exp(-output))
        if p.ndim == 1:
            labels = preprocessing.get("classes") or [str(i) for i in range(len(p))]
            order = np.argsort(-p)
            named = lambda cs: ", ".join(f"{labels[c]} ({p[c]:.3f})" for c in cs) or "none"  # noqa: E731
            predicted, others = order[p[order] > THRESHOLD], order[p[order] <= THRESHOLD]
            others = others[: len(others) if top is None else top]
            return f"predicted: {named(predicted)}" + (f"; below {THRESHOLD}: {named(others)}" if len(others) else "")
        return f"{int((p > THRESHOLD).sum())} of {p.size} elements positive (mean probability {p.mean():.3f})"
    names = preprocessing.get("targets") or [f"output {i}" for i in range(output.size)]
    flat = output.reshape(-1)
    if len(flat) <= 8:
        return ", ".join(f"{n} = {v:.6g}" for n, v in zip(names, flat))
    return f"shape {list(output.shape)}, first values {', '.join(f'{v:.4g}' for v in flat[:8])}, ..."


if __name__ == "__main__":
    sys.exit(main())
