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
        os.environ["XLA_FLAGS"] = (
            os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false "
            f"intra_op_parallelism_threads={args.threads}"
        ).strip()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import jax
    import jax.numpy as jnp
    import numpy as np

    from inference.formats.jax_export import JaxModel, export_jax
    from inference.formats.onnx_export import export_onnx
    from inference.formats.tflite import export_tflite, tflite_to_onnx
    from inference.predict import OnnxModel, TFLiteModel
    from inference.trained_run import load_run
    from training.config.components import build
    from training.config.validation import load_config

    spec = jax.ShapeDtypeStruct((1, *args.input), jnp.float32)
    if args.run:
        loaded = load_run(Path(args.run) / "model_best.params", input_spec=spec)
        config, model, params, state = loaded.config, loaded.model, loaded.params, loaded.state
    else:
        config = load_config(Path(args.config))
        model = build(config["model"], "model")
        params, state = model.init(jax.random.PRNGKey(0), spec)

    def fn(x):
        return model(params, state, x, train=False)[0]

    NAMES = ["input"]  # noqa: N806 (one image input)

    def at(batch):
        return jax.ShapeDtypeStruct((batch, *args.input), jnp.float32)

    # One-off costs kept out of the per-format export times: TensorFlow's import and jax2onnx's first call.
    _, tf_import = timed(lambda: __import__("tensorflow"))
    _, onnx_warmup = timed(lambda: export_onnx(lambda x: x * 2.0, [jax.ShapeDtypeStruct((1, 2), jnp.float32)], ["x"]))

    rows = []  # (artifact, export seconds, batch -> callable); a route that fails is listed with its error

    def add(name, export):
        """export() -> (seconds, batch -> callable)."""
        try:
            seconds, runner = export()
        except Exception as error:  # a converter or runtime error: show it in the table, measure the rest
            text = str(error).strip()
            rows.append((name, None, text.splitlines()[0][:100] if text else type(error).__name__))
            return
        rows.append((name, seconds, runner))

    def tflite_fixed():
        models, seconds = {}, []
        for b in args.batches:
            blob, s = timed(lambda: export_tflite(fn, [at(b)], NAMES))
            models[b] = TFLiteModel(blob, args.threads)
            seconds.append(s)
        return statistics.mean(seconds), models.__getitem__

    def single(export_fn, load):
        blob, seconds = timed(export_fn)
        model = load(blob)
        return seconds, lambda b: model

    jitted = jax.jit(fn)
    rows.append(("jitted JAX (reference)", None, lambda b: lambda x: jitted(x).block_until_ready()))
    add("jax.export artifact (.jax)", lambda: single(lambda: export_jax(fn, [spec]), JaxModel))
    add("LiteRT, fixed-batch .tflite", tflite_fixed)
    dynamic = {}  # the dynamic-batch .tflite, which the tf2onnx route converts

    def tflite_dynamic():
        dynamic["tflite"], seconds = timed(lambda: export_tflite(fn, [spec], NAMES, dynamic_batch=True))
        model = TFLiteModel(dynamic["tflite"], args.threads)
        return seconds, lambda b: model

    add("LiteRT, dynamic-batch .tflite", tflite_dynamic)
    add(
        "onnxruntime, jax2onnx .onnx",
        lambda: single(lambda: export_onnx(fn, [spec], NAMES), lambda blob: OnnxModel(blob, args.threads)),
    )
    add(
        "onnxruntime, tf2onnx-from-.tflite .onnx",
        lambda: single(lambda: tflite_to_onnx(dynamic["tflite"], NAMES), lambda blob: OnnxModel(blob, args.threads)),
    )

    rng = np.random.default_rng(0)
    inputs = {b: rng.standard_normal((b, *args.input)).astype(np.float32) for b in args.batches}
    results = [
        (
            name,
            export_s,
            runner
            if isinstance(runner, str)
            else {b: median_ms(runner(b), inputs[b], args.repeats) for b in args.batches},
        )
        for name, export_s, runner in rows
    ]

    reference = results[0][2]
    print(
        f"model {config['model']['name']}, input {list(args.input)}, {args.threads} thread(s), median of "
        f"{args.repeats} calls; one-off: TensorFlow import {tf_import:.1f} s, jax2onnx first call "
        f"{onnx_warmup:.1f} s"
    )
    head = (
        ["artifact", "export (s)"]
        + [f"batch {b} (ms)" for b in args.batches]
        + [f"vs JAX at {b}" for b in args.batches]
    )
    print("| " + " | ".join(head) + " |")
    print("| " + " | ".join("---" for _ in head) + " |")
    for name, export_s, latency in results:
        if isinstance(latency, str):
            print(f"| {name} | failed: {latency} |" + " |" * (len(head) - 2))
            continue
        cells = [name, "-" if export_s is None else f"{export_s:.2f}"]
        cells += [f"{latency[b]:.3f}" for b in args.batches]
        cells += [f"{latency[b] / reference[b]:.2f}x" for b in args.batches]
        print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
