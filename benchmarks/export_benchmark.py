"""Export time per format, and inference latency of each exported artifact against jitted JAX at batch 1 and 64.

    python benchmarks/export_benchmark.py                       # the model of config.json, random weights
    python benchmarks/export_benchmark.py -r saved/<name>/<run_id> --threads 1 --repeats 200

Latency is the median wall time of one call on random inputs after warm-up; every runtime gets the same thread
count (XLA's is set before JAX is imported). Weights do not change latency, so without -r the config's model is
initialised randomly. Prints a Markdown table.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-c", "--config", default=str(REPO / "config.json"), help="config naming the model")
    parser.add_argument("-r", "--run", help="run folder: its config.json and model_best.params")
    parser.add_argument("--input", type=int, nargs="+", default=[28, 28, 1], metavar="DIM", help="sample shape")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--threads", type=int, default=1, help="threads per runtime (default 1)")
    parser.add_argument("--repeats", type=int, default=100, help="timed calls per measurement (default 100)")
    return parser.parse_args(argv)


def median_ms(fn, x, repeats: int) -> float:
    for _ in range(max(3, repeats // 10)):
        fn(x)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false "
                                   f"intra_op_parallelism_threads={args.threads}").strip()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import jax
    import jax.numpy as jnp
    import numpy as np

    from inference.export_jax import JaxModel, export_jax
    from inference.export_onnx import export_onnx, tflite_to_onnx
    from inference.export_tflite import export_tflite
    from inference.predict import OnnxModel, TFLiteModel
    from training import checkpoint
    from utils import build, load_config

    config_path = Path(args.run) / "config.json" if args.run else Path(args.config)
    config = load_config(config_path)
    model = build(config["model"], "model")
    spec = jax.ShapeDtypeStruct((1, *args.input), jnp.float32)
    params, state = model.init(jax.random.PRNGKey(0), spec)
    if args.run:
        tree, _ = checkpoint.restore(Path(args.run) / "model_best.params", {"params": params, "state": state},
                                     only=("params", "state"))
        params, state = tree["params"], tree["state"]

    def fn(x):
        return model(params, state, x, train=False)[0]

    def at(batch):
        return jax.ShapeDtypeStruct((batch, *args.input), jnp.float32)

    # One-off costs kept out of the per-format export times: TensorFlow's import and jax2onnx's first call.
    _, tf_import = timed(lambda: __import__("tensorflow"))
    _, onnx_warmup = timed(lambda: export_onnx(lambda x: x * 2.0, jax.ShapeDtypeStruct((1, 2), jnp.float32)))

    rows = []  # (artifact, export seconds, {batch: runner})
    jax_blob, seconds = timed(lambda: export_jax(fn, spec))
    jax_model = JaxModel(jax_blob)
    fixed = {}
    fixed_seconds = []
    for b in args.batches:
        blob, s = timed(lambda: export_tflite(fn, at(b)))
        fixed[b] = TFLiteModel(blob, args.threads)
        fixed_seconds.append(s)
    dynamic_tflite, dynamic_seconds = timed(lambda: export_tflite(fn, spec, dynamic_batch=True))
    onnx_blob, onnx_seconds = timed(lambda: export_onnx(fn, spec))
    via_blob, via_seconds = timed(lambda: tflite_to_onnx(dynamic_tflite))

    jitted = jax.jit(fn)
    rows.append(("jitted JAX (reference)", None, lambda b: (lambda x: jitted(x).block_until_ready())))
    rows.append(("jax.export artifact (.jax)", seconds, lambda b: jax_model))
    rows.append(("LiteRT, fixed-batch .tflite", statistics.mean(fixed_seconds), lambda b: fixed[b]))
    dynamic_model = TFLiteModel(dynamic_tflite, args.threads)
    rows.append(("LiteRT, dynamic-batch .tflite", dynamic_seconds, lambda b: dynamic_model))
    onnx_model = OnnxModel(onnx_blob, args.threads)
    rows.append(("onnxruntime, jax2onnx .onnx", onnx_seconds, lambda b: onnx_model))
    via_model = OnnxModel(via_blob, args.threads)
    rows.append(("onnxruntime, tf2onnx-from-.tflite .onnx", dynamic_seconds + via_seconds, lambda b: via_model))

    rng = np.random.default_rng(0)
    inputs = {b: rng.standard_normal((b, *args.input)).astype(np.float32) for b in args.batches}
    results = [(name, export_s, {b: median_ms(runner(b), inputs[b], args.repeats) for b in args.batches})
               for name, export_s, runner in rows]

    reference = results[0][2]
    print(f"model {config['model']['name']}, input {list(args.input)}, {args.threads} thread(s), median of "
          f"{args.repeats} calls; one-off: TensorFlow import {tf_import:.1f} s, jax2onnx first call "
          f"{onnx_warmup:.1f} s")
    head = ["artifact", "export (s)"] + [f"batch {b} (ms)" for b in args.batches] + \
        [f"vs JAX at {b}" for b in args.batches]
    print("| " + " | ".join(head) + " |")
    print("| " + " | ".join("---" for _ in head) + " |")
    for name, export_s, latency in results:
        cells = [name, "-" if export_s is None else f"{export_s:.2f}"]
        cells += [f"{latency[b]:.3f}" for b in args.batches]
        cells += [f"{latency[b] / reference[b]:.2f}x" for b in args.batches]
        print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
