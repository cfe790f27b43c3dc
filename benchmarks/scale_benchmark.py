"""Scaling out on simulated devices: step time and per-device memory for 1, 2 and 4 devices, data-parallel
(fsdp 1) and fully sharded (fsdp = devices), and 2 processes x 2 devices joined by jax.distributed on localhost.

    python benchmarks/scale_benchmark.py                   # 3 rounds, 30 timed steps per configuration
    python benchmarks/scale_benchmark.py --rounds 1 --steps 10 --hidden 512

Simulated CPU devices (``--xla_force_host_platform_device_count``) are slices of this machine's CPU: on a 2-core
machine 4 devices share 2 cores, so the step times measure the overhead of splitting a step (partitioning, the
collectives, gloo's TCP between processes), not a speed-up. The memory figures are real: the bytes of parameters
and optimizer state that each device holds, summed over the arrays' addressable shards, and XLA's own count of the
compiled step's temporaries per device.

Each configuration runs in a fresh process (the device count is fixed when JAX starts), rounds interleaved so that
load changes on a shared machine hit them alike; the table reports medians over rounds. The model is the `mlp`
sample (784 -> hidden -> hidden -> 10, AdamW) on random MNIST-shaped data, batch 128.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
BATCH = 128
# (processes, devices per process, fsdp); several processes only where training/processes/ is (a project may leave
# that feature out)
CONFIGS = [(1, 1, 1), (1, 2, 1), (1, 2, 2), (1, 4, 1), (1, 4, 4)]
if (REPO / "training/processes").is_dir():
    CONFIGS += [(2, 2, 1), (2, 2, 4)]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30, help="timed steps per configuration")
    parser.add_argument("--hidden", type=int, default=1024, help="width of the two hidden layers")
    parser.add_argument(
        "--child", nargs=5, metavar=("PROCESSES", "PROCESS_ID", "PORT", "FSDP", "STEPS"), help=argparse.SUPPRESS
    )
    return parser.parse_args(argv)


def child(processes: int, process_id: int, port: int, fsdp: int, steps: int, hidden: int) -> dict:
    """One configuration in this process: build the Trainer, compile, time `steps` steps, measure the memory."""
    from training.devices import mesh

    if processes > 1:
        from training.processes.launch import join

        join(f"localhost:{port}", processes, process_id)
    import jax
    import numpy as np

    from data_loader.loader import ArrayDataset, DataLoader
    from training import startup
    from training.assembly import assemble
    from training.config.validation import validate
    from training.trainer import Trainer

    config = validate(
        {
            "name": "scale",
            "seed": 0,
            "model": {"name": "mlp", "args": {"hidden": [hidden, hidden]}},
            "loss": {"name": "cross_entropy"},
            "metrics": [{"name": "accuracy"}],
            "optimizer": {"name": "adamw", "args": {"lr": 1e-3}},
            "data_loader": {"train": {"name": "mnist", "args": {"data_dir": "unused", "batch_size": BATCH}}},
            "trainer": {"monitor": "off", "steps_per_call": 10, "save_dir": tempfile.mkdtemp()},
            "mesh": {"data": -1, "fsdp": fsdp},
        }
    )
    rng = np.random.default_rng(0)
    n = BATCH * 10
    loader = DataLoader(
        ArrayDataset(input=rng.random((n, 28, 28, 1), np.float32), target=rng.integers(0, 10, n).astype(np.int32)),
        BATCH,
        shuffle=True,
    )
    run = assemble(config)
    run.use_data({"train": loader})
    trainer = Trainer(run, Path(tempfile.mkdtemp()))
    trainer.begin(startup.from_seed(trainer))
    trainer.log_compile()
    held = mesh.device_bytes({name: trainer.train_state[name] for name in ("params", "opt_state")})
    k = trainer.steps_per_call.k
    call = trainer.compiled.train_call(k)
    temp = None
    try:
        temp = call.memory_analysis().temp_size_in_bytes
    except (AttributeError, NotImplementedError):
        pass
    _, stack = next(loader.stacks(0, k, trainer.placement.put_stack))
    totals = trainer.compiled.empty_stats()
    ts = trainer.train_state
    calls = max(1, steps // k)
    ts, totals, logs = call(ts, totals, stack)  # warm-up
    jax.block_until_ready(logs)
    started = time.perf_counter()
    for _ in range(calls):
        ts, totals, logs = call(ts, totals, stack)
    jax.block_until_ready(logs)
    seconds = time.perf_counter() - started
    parameters = sum(leaf.size for leaf in jax.tree.leaves(ts["params"]))
    result = {
        "ms_per_step": 1000 * seconds / (calls * k),
        "state_mb_per_device": max(held.values()) / 2**20,
        "temp_mb_per_device": temp and temp / 2**20,
        "devices": jax.device_count(),
        "mesh": dict(trainer.placement.mesh.shape),
        "parameters": int(parameters),
        "compile_s": trainer.compiled.seconds[k],
    }
    mesh.finish_processes()
    return result


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def measure(processes: int, devices: int, fsdp: int, steps: int, hidden: int) -> dict:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
    port = free_port()
    children = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--hidden",
                str(hidden),
                "--child",
                str(processes),
                str(i),
                str(port),
                str(fsdp),
                str(steps),
            ],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(processes)
    ]
    outputs = [c.communicate(timeout=900) for c in children]
    for c, (_out, err) in zip(children, outputs):
        if c.returncode != 0:
            raise SystemExit(f"error: {processes} x {devices} devices, fsdp {fsdp} failed:\n{err[-3000:]}")
    return json.loads(outputs[0][0].strip().splitlines()[-1])  # process 0's figures (process 1's are alike)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        processes, process_id, port, fsdp, steps = map(int, args.child)
        print(json.dumps(child(processes, process_id, port, fsdp, steps, args.hidden)))
        return 0
    results: dict = {config: [] for config in CONFIGS}
    for round_ in range(args.rounds):
        for config in CONFIGS:
            results[config].append(measure(*config, args.steps, args.hidden))
        print(f"round {round_ + 1}/{args.rounds} done (load average {os.getloadavg()[0]:.1f})", file=sys.stderr)
    first = results[CONFIGS[0]][0]
    print(
        f"mlp {args.hidden} x {args.hidden}, {first['parameters']:,} parameters, AdamW, batch {BATCH}; "
        f"{os.cpu_count()} CPU cores; medians of {args.rounds} round(s) of {args.steps} steps"
    )
    print(
        "| processes x devices | mesh (data x fsdp) | ms per step | params + optimizer MB per device | "
        "step temporaries MB per device |"
    )
    print("| --- | --- | --- | --- | --- |")
    for (processes, devices, _fsdp), runs in results.items():
        ms = statistics.median(r["ms_per_step"] for r in runs)
        state = statistics.median(r["state_mb_per_device"] for r in runs)
        temps = [r["temp_mb_per_device"] for r in runs if r["temp_mb_per_device"] is not None]
        temp = f"{statistics.median(temps):.1f}" if temps else "-"
        mesh = runs[0]["mesh"]
        print(f"| {processes} x {devices} | {mesh['data']} x {mesh['fsdp']} | {ms:.1f} | {state:.2f} | {temp} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
