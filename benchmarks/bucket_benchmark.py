"""A checkpoint's save into a bucket against the local disk: seconds and peak host memory (issue 61).

    python benchmarks/bucket_benchmark.py                  # a ~256 MB state, moto's S3 server on localhost
    python benchmarks/bucket_benchmark.py --mb 64 --saves 2
    python benchmarks/bucket_benchmark.py --smoke          # a 1 MB state, in this process: that it runs

The state is FSDP-like: parameters and Adam's two moments (5 leaves of 4096 x N float32 each), every leaf split over
two CPU devices along its first axis. Each save is the template's own, in either layout a run writes:

  one file  (one process)  the state copied to host, encoded, written atomically (``checkpoint-latest.params``)
  sharded   (several)      each process's pieces in its shard file, then the index naming them (one process here,
                           holding both devices: the files and order of a multi-process save)

and then, into the bucket (``training/buckets/store.py``): the shard file uploaded (streamed, in parts) before the
index, the index put in one conditional request (the commit: a one-file checkpoint is read whole for it), the
previous save's shard objects deleted. The local row is the same save without the copy.

Each (layout, target) runs in a fresh process (``--child``), ``--saves`` saves in a row: the median save's seconds
and the peak RSS (VmHWM, reset before the saves) less the RSS with the state built, i.e. what a save adds on the
host. The server is moto's, in this (the parent) process on localhost: its memory is not counted; its CPU is shared
with the child's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
LAYOUTS, TARGETS = ("one file", "sharded"), ("local disk", "s3 (moto)")
BUCKET = "bench"


def rss(field: str) -> int:
    """This process's VmRSS or VmHWM (peak), bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def state(mb: int):
    """Parameters and two Adam moments, about `mb` MB of float32, each leaf split over the devices (FSDP)."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.array(jax.devices()), ("fsdp",))
    columns = max(1, mb * 2**20 // (3 * 5 * 4096 * 4))
    rng = np.random.default_rng(0)

    def leaves():
        return {
            f"w{i}": jax.device_put(
                rng.standard_normal((4096, columns), dtype=np.float32), NamedSharding(mesh, PartitionSpec("fsdp"))
            )
            for i in range(5)
        }

    return {"params": leaves(), "opt_state": {"mu": leaves(), "nu": leaves()}}


def measure(layout: str, target: str, mb: int, saves: int, folder: Path) -> dict:
    """`saves` saves of a fresh `mb` MB state in `layout` into `target`: their seconds, and what they added to the
    peak RSS."""
    import gc

    from files.writes import LATEST
    from training.devices import mesh
    from training.run import checkpoint, shards

    tree = state(mb)
    mirror = None
    run_dir = folder / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    if target != "local disk":
        from training.buckets import store

        mirror = store.Mirror(run_dir, f"s3://{BUCKET}/{os.getpid()}-{layout.replace(' ', '-')}")
    gc.collect()
    base = rss("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM from here
    times = []
    for step in range(1, saves + 1):
        header = {"epoch": step, "step": step}
        started = time.perf_counter()
        if layout == "one file":
            payload = checkpoint.encode(mesh.to_host(tree), header)
        else:
            part = shards.take(tree)
            payload = shards.write(run_dir, f"step_{step}-bench", part, header, mirror and mirror.publish)
        checkpoint.write_atomic(run_dir / LATEST, payload)
        shards.remove_unreferenced(run_dir)
        if mirror is not None:  # as Checkpoints.save calls it: the payload still held
            mirror.commit(run_dir, [LATEST])
        del payload
        times.append(time.perf_counter() - started)
    size = sum(p.stat().st_size for p in run_dir.rglob("*") if p.is_file())
    return {
        "layout": layout,
        "target": target,
        "state_mb": round(sum(leaf.nbytes for leaf in _leaves(tree)) / 2**20, 1),
        "files_mb": round(size / 2**20, 1),
        "seconds": times,
        "median_s": statistics.median(times),
        "peak_growth_mb": round((rss("VmHWM") - base) / 2**20, 1),
    }


def _leaves(tree):
    import jax

    return jax.tree.leaves(tree)


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def serve() -> tuple[object, dict]:
    """moto's S3 server on a free localhost port, the benchmark's bucket made; the environment pointing at it."""
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    env = {
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench-secret",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
    }
    os.environ.update(env)
    boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"]).create_bucket(Bucket=BUCKET)
    return server, env


def table(rows: list[dict]) -> str:
    lines = [
        "| layout | target | state MB | median save s | saves s | peak RSS growth MB |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        each = ", ".join(f"{t:.2f}" for t in r["seconds"])
        lines.append(f"| {r['layout']} | {r['target']} | {r['state_mb']} | {r['median_s']:.2f} | {each} | "
                     f"{r['peak_growth_mb']} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=256, help="the state's size (parameters and two moments)")
    parser.add_argument("--saves", type=int, default=3, help="saves in a row, per layout and target")
    parser.add_argument("--smoke", action="store_true", help="1 MB, one save each, in this process: that it runs")
    parser.add_argument("--child", nargs=2, metavar=("LAYOUT", "TARGET"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        with tempfile.TemporaryDirectory() as folder:
            print(json.dumps(measure(*args.child, args.mb, args.saves, Path(folder))))
        return 0
    saved = dict(os.environ)
    server, env = serve()
    rows = []
    try:
        for layout in LAYOUTS:
            for target in TARGETS:
                if args.smoke:
                    with tempfile.TemporaryDirectory() as folder:
                        rows.append(measure(layout, target, 1, 1, Path(folder)))
                    continue
                child_env = {**os.environ, **env, "JAX_PLATFORMS": "cpu",
                             "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}  # fmt: skip
                out = subprocess.run(
                    [sys.executable, __file__, "--child", layout, target, "--mb", str(args.mb), "--saves",
                     str(args.saves)],
                    env=child_env, capture_output=True, text=True, check=False,
                )  # fmt: skip
                if out.returncode:
                    print(out.stderr, file=sys.stderr)
                    return 1
                rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    finally:
        server.stop()
        os.environ.clear()
        os.environ.update(saved)
    load = os.getloadavg()[0]
    print(f"{cpu_name()}, {os.cpu_count()} cores, load {load:.2f}; {1 if args.smoke else args.saves} save(s) each")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
