"""Classify images (or a .npy batch) with an exported model and print the top classes:

    python inference/predict.py inference/jax_mnist/jax_mnist.onnx digit.png other.jpg [--top 3]
    python inference/predict.py inference/jax_mnist/jax_mnist.tflite batch.npy

Images are resized and normalised as the training data was: the numbers come from `preprocessing.json`, which the
converter writes next to the model (from the run's data pipeline), plus the run's `config.json` for its name. A
.npy file holds inputs already preprocessed, (N, H, W, C) or one (H, W, C) sample.

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


class OnnxModel:
    """An .onnx file in onnxruntime (CPU); `input_shape` has None for a symbolic axis."""

    def __init__(self, model, threads: int | None = None):
        import onnxruntime as ort

        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
        source = str(model) if isinstance(model, Path) else model
        self.session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
        (inp,), (out,) = self.session.get_inputs(), self.session.get_outputs()
        self.input_name, self.output_name = inp.name, out.name
        self.input_shape = tuple(d if isinstance(d, int) else None for d in inp.shape)
        self.output_shape = tuple(d if isinstance(d, int) else None for d in out.shape)
        self.input_dtype = np.dtype({"tensor(float)": np.float32, "tensor(int32)": np.int32,
                                     "tensor(int64)": np.int64}[inp.type])

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self.session.run([self.output_name], {self.input_name: np.asarray(x, self.input_dtype)})[0]


class TFLiteModel:
    """A .tflite file in LiteRT's interpreter; a dynamic batch axis is resized on demand."""

    def __init__(self, model, threads: int | None = None):
        from ai_edge_litert.interpreter import Interpreter

        source = {"model_path": str(model)} if isinstance(model, Path) else {"model_content": bytes(model)}
        self.interpreter = Interpreter(**source, num_threads=threads)
        (inp,), (out,) = self.interpreter.get_input_details(), self.interpreter.get_output_details()
        self._in, self._out = inp["index"], out["index"]
        self.input_name, self.output_name = inp["name"], out["name"]
        self.input_shape = tuple(int(d) if d >= 0 else None for d in inp["shape_signature"])
        self.output_shape = tuple(int(d) if d >= 0 else None for d in out["shape_signature"])
        self.input_dtype = np.dtype(inp["dtype"])
        self._allocated = None

    def __call__(self, x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, self.input_dtype)
        if x.shape != self._allocated:
            if None in self.input_shape:
                self.interpreter.resize_tensor_input(self._in, list(x.shape))
            self.interpreter.allocate_tensors()
            self._allocated = x.shape
        self.interpreter.set_tensor(self._in, x)
        self.interpreter.invoke()
        return self.interpreter.get_tensor(self._out)


def load_model(path: str | Path, threads: int | None = None):
    """An OnnxModel or a TFLiteModel, by the file's suffix."""
    path = Path(path)
    runners = {".onnx": OnnxModel, ".tflite": TFLiteModel}
    if path.suffix not in runners:
        raise ValueError(f"{path}: expected a .onnx or .tflite file")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    return runners[path.suffix](path, threads)


def run_batched(model, x: np.ndarray, batch_size: int = 256) -> np.ndarray:
    """The model on every row of x: in chunks of its fixed batch (the last one zero-padded), or of batch_size."""
    fixed = model.input_shape[0]
    step = fixed or batch_size
    outputs = []
    for start in range(0, len(x), step):
        chunk = x[start:start + step]
        n = len(chunk)
        if fixed and n < fixed:
            chunk = np.concatenate([chunk, np.zeros((fixed - n, *chunk.shape[1:]), chunk.dtype)])
        outputs.append(model(chunk)[:n])
    return np.concatenate(outputs)


def load_image(path: str | Path, preprocessing: dict, invert: bool = False) -> np.ndarray:
    """An image file as one (H, W, C) float32 sample, normalised as in training."""
    from PIL import Image

    height, width, channels = preprocessing["sample_shape"]
    with Image.open(path) as image:
        image = image.convert("L" if channels == 1 else "RGB").resize((width, height), Image.BILINEAR)
        pixels = np.asarray(image, np.float32).reshape(height, width, channels)
    if invert:  # dark strokes on a light background, the reverse of MNIST
        pixels = 255.0 - pixels
    return (pixels * preprocessing["pixel_scale"] - preprocessing["mean"]) / preprocessing["std"]


def softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="an exported .onnx or .tflite file")
    parser.add_argument("inputs", nargs="+", help="image files (PNG, JPEG, ...) or .npy batches")
    parser.add_argument("--top", type=int, default=3, help="classes to print per input (default 3)")
    parser.add_argument("--invert", action="store_true", help="invert images (dark digit on a light background)")
    parser.add_argument("--threads", type=int, default=None, help="runtime threads (default: the runtime's)")
    args = parser.parse_args(argv)

    model_path = Path(args.model)
    folder = model_path.parent
    preprocessing = read_json(folder / "preprocessing.json")
    try:
        model = load_model(model_path, args.threads)
        names, samples = [], []
        for item in map(Path, args.inputs):
            if item.suffix == ".npy":
                batch = np.load(item)
                batch = batch[None] if batch.ndim == len(model.input_shape) - 1 else batch
                names += [f"{item}[{i}]" for i in range(len(batch))]
                samples += list(batch)
            else:
                if not preprocessing:
                    raise ValueError(f"{folder / 'preprocessing.json'} not found: it says how to prepare images; "
                                     "pass a preprocessed .npy batch instead")
                names.append(str(item))
                samples.append(load_image(item, preprocessing, args.invert))
        x = np.stack(samples).astype(model.input_dtype)
        if x.shape[1:] != model.input_shape[1:]:
            raise ValueError(f"inputs have shape {list(x.shape[1:])} per sample, the model expects "
                             f"{list(model.input_shape[1:])}")
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2

    probabilities = softmax(run_batched(model, x).astype(np.float64))
    classes = preprocessing.get("classes") or [str(i) for i in range(probabilities.shape[-1])]
    title = read_json(folder / "config.json").get("name", model_path.stem)
    print(f"{title}: {model_path.name}, {len(x)} input(s)")
    for name, p in zip(names, probabilities):
        top = np.argsort(-p)[:args.top]
        print(f"{name}: " + ", ".join(f"{classes[c]} ({p[c]:.3f})" for c in top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
