"""Several processes and sharded parameters (training/devices/distributed.py), proven by simulation on one machine: CPU
devices multiplied with --xla_force_host_platform_device_count, processes joined by jax.distributed on localhost
(gloo collectives)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from data_loader.loader import ArrayDataset, DataLoader
from tests.conftest import make_idx_dataset
from tests.end_to_end.test_train import ROOT, run, write_config
from training.devices import distributed
from training.run import checkpoint
from utils import ConfigError, validate


# ------------------------------------------------------------------------------------------------ without devices
def test_cluster_from_flags_slurm_or_nothing():
    assert distributed.cluster_of(None, None, None, environ={}) == distributed.SINGLE
    cluster = distributed.cluster_of("node7:29500", 4, 3, environ={})
    assert (cluster.process_id, cluster.num_processes, cluster.coordinator, cluster.source) == (
        3,
        4,
        "node7:29500",
        "flags",
    )
    assert distributed.cluster_of("localhost:1234", 1, 0, environ={}) == distributed.SINGLE
    slurm = {
        "SLURM_JOB_ID": "4242",
        "SLURM_PROCID": "1",
        "SLURM_NTASKS": "2",
        "SLURM_STEP_NUM_NODES": "2",
        "SLURM_STEP_NODELIST": "gpu[007-008],cpu1",
        "SLURM_LOCALID": "0",
    }
    cluster = distributed.cluster_of(None, None, None, environ=slurm)
    assert cluster == distributed.Cluster(1, 2, f"gpu007:{61440 + 4242 % 4096}", "slurm", None)
    # several tasks on a node: one device each
    cluster = distributed.cluster_of(
        None, None, None, environ={**slurm, "SLURM_STEP_NUM_NODES": "1", "SLURM_LOCALID": "1"}
    )
    assert cluster.local_device_ids == (1,)
    assert distributed.cluster_of(None, None, None, environ={**slurm, "SLURM_NTASKS": "1"}) == distributed.SINGLE
    batch_shell = {k: v for k, v in slurm.items() if k != "SLURM_STEP_NODELIST"}  # sbatch's script, not srun
    assert distributed.cluster_of(None, None, None, environ=batch_shell) == distributed.SINGLE
    assert distributed.slurm_first_host("node001") == "node001"
    assert distributed.slurm_first_host("a[3,5-9],b2") == "a3"
    assert distributed.cluster_of("auto", None, None, environ={}).source == "auto"


@pytest.mark.parametrize(
    "flags, message",
    [
        (("localhost:1234", 2, None), "missing --process-id"),
        (("localhost", 2, 0), "--coordinator: expected HOST:PORT"),
        (("localhost:99999", 2, 0), "--coordinator: expected HOST:PORT"),
        (("localhost:1234", 2, 2), "--process-id: expected 0 to 1"),
        (("localhost:1234", 0, 0), "--num-processes: expected a number >= 1"),
        (("auto", 2, None), "--coordinator auto detects"),
    ],
)
def test_bad_flags_are_one_clear_error(flags, message):
    with pytest.raises(distributed.DistributedError, match=message):
        distributed.cluster_of(*flags, environ={})


def test_heartbeat_timeout_checked():
    with pytest.raises(distributed.DistributedError, match="--heartbeat-timeout: expected seconds >= 1, got 0"):
        distributed.start("localhost:1234", 2, 0, heartbeat_timeout=0)


def test_train_py_reports_bad_flags_in_one_line(tmp_path):
    result = run("train.py", "-c", tmp_path / "unread.json", "--coordinator", "localhost:1234", "--num-processes", "2")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: several processes need --coordinator HOST:PORT, --num-processes N and --process-id I together; "
        "missing --process-id"
    ]


def minimal_config(**extra) -> dict:
    return {
        "name": "m",
        "model": {"name": "mlp", "args": {"hidden": [8]}},
        "loss": {"name": "cross_entropy"},
        "optimizer": {"name": "sgd", "args": {"lr": 0.1}},
        "trainer": {"monitor": "off"},
        "data_loader": {"train": {"name": "mnist", "args": {"data_dir": "unused"}}},
        **extra,
    }


@pytest.mark.parametrize(
    "mesh, message",
    [
        ({"dta": 2}, "config.json: mesh.dta: unknown mesh axis. Did you mean 'data'? Axes: data, fsdp"),
        ({"fsdp": 0}, "config.json: mesh.fsdp: expected a device count >= 1, or -1"),
        ({"fsdp": 1.5}, "config.json: mesh.fsdp: expected a device count"),
        ({"data": -1, "fsdp": -1}, "config.json: mesh: only one axis may be -1"),
        ([2, 2], "config.json: mesh: expected an object like"),
    ],
)
def test_mesh_section_validated(mesh, message):
    with pytest.raises(ConfigError) as error:
        validate(minimal_config(mesh=mesh))
    assert str(error.value).startswith(message), str(error.value)


def test_mesh_defaults_and_shapes():
    assert validate(minimal_config())["mesh"] == {"data": -1, "fsdp": 1}
    assert validate(minimal_config(mesh={"fsdp": 4}))["mesh"] == {"data": -1, "fsdp": 4}
    assert distributed.mesh_shape({"data": -1, "fsdp": 2}, 8) == (4, 2)
    assert distributed.mesh_shape({"data": 2, "fsdp": -1}, 8) == (2, 4)
    assert distributed.mesh_shape({"data": -1, "fsdp": 1}, 1) == (1, 1)
    with pytest.raises(ValueError, match="mesh.fsdp 3 does not divide the 4 devices in use"):
        distributed.mesh_shape({"data": -1, "fsdp": 3}, 4)
    with pytest.raises(ValueError, match="mesh: data 2 x fsdp 1 = 2 devices, but 4 are in use"):
        distributed.mesh_shape({"data": 2, "fsdp": 1}, 4)


def test_fsdp_rule_largest_divisible_axis_else_replicated():
    from jax.sharding import PartitionSpec as P

    rule = distributed.fsdp_spec
    assert rule((784, 64), 4) == P("fsdp")  # the largest axis
    assert rule((3, 3, 16, 32), 4) == P(None, None, None, "fsdp")
    assert rule((10, 64), 4) == P(None, "fsdp")  # 10 is not divisible: the next largest that is
    assert rule((64, 64), 4) == P("fsdp")  # ties: the first
    assert rule((10,), 4) == P() and rule((), 4) == P() and rule((2,), 4) == P()
    assert rule((784, 64), 1) == P()


def test_process_shares_make_up_each_global_batch():
    """Each process reads only its rows; put together, process by process, they are the one-process batches, the
    padding of the last batch (mask 0) included. spec describes the global batch."""
    data = ArrayDataset(input=np.arange(70, dtype=np.float32).reshape(35, 2), target=np.arange(35))
    whole = DataLoader(data, 8, shuffle=True, seed=3)
    shares = []
    for index in range(4):
        loader = DataLoader(data, 8, shuffle=True, seed=3)
        loader.share = (index, 4)
        assert loader.spec["input"].shape == (8, 2)
        shares.append(list(loader.batches(epoch=2)))
    expected = list(whole.batches(epoch=2))
    assert len(expected) == 5 and all(len(s) == 5 for s in shares)
    for b, batch in enumerate(expected):
        for key in ("input", "target", "mask"):
            np.testing.assert_array_equal(np.concatenate([s[b][key] for s in shares]), batch[key])
    assert expected[-1]["mask"].tolist() == [1, 1, 1, 0, 0, 0, 0, 0]


# ------------------------------------------------------------------------------------- simulated devices, processes
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def devices_env(count: int) -> dict:
    return {"XLA_FLAGS": f"--xla_force_host_platform_device_count={count}", "JAX_PLATFORMS": "cpu"}


def start_processes(count: int, devices: int, *args, heartbeat: int = 60) -> list[subprocess.Popen]:
    """`count` train.py processes joined on localhost, `devices` simulated CPU devices each."""
    port = free_port()
    env = {**os.environ, **devices_env(devices)}
    return [
        subprocess.Popen(
            [
                sys.executable,
                "train.py",
                *map(str, args),
                "--coordinator",
                f"localhost:{port}",
                "--num-processes",
                str(count),
                "--process-id",
                str(i),
                "--heartbeat-timeout",
                str(heartbeat),
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(count)
    ]


def finish(processes, timeout=300) -> list[tuple[int, str, str]]:
    results = []
    for p in processes:
        out, err = p.communicate(timeout=timeout)
        results.append((p.returncode, out, err))
    return results


AGREE_CHILD = textwrap.dedent("""
    import json, sys
    from training.devices import distributed

    port, index = sys.argv[1], int(sys.argv[2])
    distributed.start(f"localhost:{port}", 2, index, heartbeat_timeout=20)
    agreed = distributed.max_over_processes(15 if index == 1 else 0, 1 if index == 0 else 0, 7)
    folder = distributed.share_text("run_dir", "saved/x/run_1" if index == 0 else None)
    distributed.finish()
    print(json.dumps({"agreed": agreed, "folder": folder, "main": distributed.is_main()}))
""")


def test_processes_agree_on_stops_and_share_the_run_folder():
    """A stop signal (15) seen by process 1 only and a timed save due on process 0 only become both processes'
    decision; process 0's run folder reaches process 1; both end through the final barrier."""
    port = free_port()
    env = {**os.environ, **devices_env(1)}
    children = [
        subprocess.Popen(
            [sys.executable, "-c", AGREE_CHILD, str(port), str(i)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    outputs = [c.communicate(timeout=120) for c in children]
    for child, (_out, err) in zip(children, outputs):
        assert child.returncode == 0, err
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    assert [r["agreed"] for r in results] == [[15, 1, 7], [15, 1, 7]]
    assert [r["folder"] for r in results] == ["saved/x/run_1", "saved/x/run_1"]
    assert [r["main"] for r in results] == [True, False]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("data") / "mnist"
    make_idx_dataset(folder, n_train=160, n_test=40)
    return folder


def tiny_config(folder: Path, data_dir: Path, validation: bool = True, **changes) -> Path:
    loader = {"name": "mnist", "args": {"data_dir": str(data_dir), "verify": False, "validation_size": 32}}
    config = {
        "name": "tiny",
        "seed": 1,
        "model": {"name": "mlp", "args": {"hidden": [64], "dropout": 0.1}},
        "loss": {"name": "cross_entropy"},
        "metrics": [{"name": "accuracy"}],
        # momentum, not Adam: Adam divides a near-zero gradient by its own size, so the last-bit differences of
        # another summation order (4 devices, 2 processes) grow to ~1e-4 in the weights of a pixel that is ~never lit
        "optimizer": {"name": "sgd", "args": {"lr": 0.05, "momentum": 0.9}},
        "data_loader": {
            "train": {**loader, "args": {**loader["args"], "split": "train", "batch_size": 32, "shuffle": True}},
            "validation": {**loader, "args": {**loader["args"], "split": "validation", "batch_size": 16}},
        },
        "trainer": {
            "epochs": 2,
            "save_dir": str(folder / "saved"),
            "save_period": 1,
            "steps_per_call": 2,
            "monitor": "min val/loss",
            "log_every": 1,
        },
    }
    if not validation:  # one compilation less
        del config["data_loader"]["validation"]
        config["trainer"]["monitor"] = "off"
    return write_config(folder, config, changes)


def assert_close_states(path, want_path, atol=1e-5) -> None:
    got, header = checkpoint.read(path)
    want, want_header = checkpoint.read(want_path)
    assert (header["epoch"], header["step"]) == (want_header["epoch"], want_header["step"])
    assert got.keys() == want.keys() and any(k.startswith("opt_state") for k in got)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=0, atol=atol, err_msg=key)


def losses(run_dir: Path) -> np.ndarray:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return np.array([[r["train/loss"], r["val/loss"], r["train/accuracy"]] for r in rows])


@pytest.mark.slow
def test_two_processes_agree_on_auto_steps_per_call(tmp_path, data_dir):
    """ "auto" is timed by each process on its own: both take the same K at the same call (the larger of their
    choices) and switch to it together mid-epoch, and the run's losses are those of one step per call alone."""
    config = tiny_config(tmp_path, data_dir, trainer__steps_per_call="auto", trainer__epochs=3)
    saved = tmp_path / "saved/tiny"
    results = finish(start_processes(2, 1, "-c", config, "--run-id", "auto"))
    for status, _out, err in results:
        assert status == 0, err
    chosen = [line for line in results[0][1].splitlines() if "steps per call (auto): " in line]
    assert len(chosen) == 1 and "steps per call (auto): 1;" not in chosen[0], results[0][1]
    config = tiny_config(tmp_path, data_dir, trainer__steps_per_call=1, trainer__epochs=3)
    one = run("train.py", "-c", config, "--run-id", "one", env=devices_env(2))
    assert one.returncode == 0, one.stderr
    np.testing.assert_allclose(losses(saved / "auto"), losses(saved / "one"), rtol=0, atol=1e-5)


@pytest.mark.slow
def test_two_processes_equal_four_devices_and_one_device_and_resume_in_one(tmp_path, data_dir):
    """2 processes x 2 devices == 1 process x 4 devices == 1 device (losses and final state within 1e-5); the
    2-process run's checkpoint resumes in one process on one device and ends as the 1-device run."""
    config = tiny_config(tmp_path, data_dir)
    saved = tmp_path / "saved/tiny"
    one = run("train.py", "-c", config, "--run-id", "one", env=devices_env(1))
    assert one.returncode == 0, one.stderr
    four = run("train.py", "-c", config, "--run-id", "four", env=devices_env(4))
    assert four.returncode == 0, four.stderr
    assert "mesh {'data': 4, 'fsdp': 1}" in four.stdout
    results = finish(start_processes(2, 2, "-c", config, "--run-id", "two"))
    for status, _out, err in results:
        assert status == 0, err
    assert "process 0 of 2" in results[0][1] and "mesh {'data': 4, 'fsdp': 1}" in results[0][1]
    # process 1 logs warnings only (gloo's own connection lines aside); process 0 reports the run
    assert [line for line in results[1][1].splitlines() if not line.startswith("[Gloo]")] == []
    two = saved / "two"
    assert sorted(p.name for p in saved.iterdir()) == ["four", "one", "two"]  # one folder for both processes
    for run_dir in (saved / "four", two):
        np.testing.assert_allclose(losses(run_dir), losses(saved / "one"), rtol=0, atol=1e-5)
        for name in ("checkpoint-latest.params", "checkpoint-epoch_1.params", "model_best.params"):
            assert_close_states(run_dir / name, saved / "one" / name)

    # resume: the 2-process run's epoch-1 checkpoint continued by one process on one device
    resumed_dir = saved / "resumed"
    resumed_dir.mkdir()
    (resumed_dir / "config.json").write_text((two / "config.json").read_text())
    (resumed_dir / "checkpoint-latest.params").write_bytes((two / "checkpoint-epoch_1.params").read_bytes())
    (resumed_dir / "metrics.jsonl").write_text((two / "metrics.jsonl").read_text().splitlines()[0] + "\n")
    resumed = run("train.py", "-r", resumed_dir / "checkpoint-latest.params", env=devices_env(1))
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stdout and "1 process, mesh {'data': 1, 'fsdp': 1}" in resumed.stdout
    assert_close_states(resumed_dir / "checkpoint-latest.params", saved / "one" / "checkpoint-latest.params")
    np.testing.assert_allclose(losses(resumed_dir), losses(saved / "one"), rtol=0, atol=1e-5)


FSDP_CHILD = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    import jax
    import numpy as np
    from training.run import checkpoint
    from training.devices import distributed
    from training.trainer import Trainer
    from utils import assemble, load_config

    folder = Path(sys.argv[1])
    out = {}
    for fsdp in (1, 4):
        config = load_config(folder / "config.json", [f"mesh.fsdp={fsdp}"])
        run = assemble(config)
        run.load_data(["train"])
        run_dir = folder / f"fsdp{fsdp}"
        run_dir.mkdir()
        trainer = Trainer(run, run_dir)
        trainer.init_state()
        held = distributed.device_bytes({k: trainer.ts[k] for k in ("params", "opt_state")})
        specs = {k: list(v.sharding.spec) for k, v in trainer.ts["params"]["fc0"].items()}
        trainer.fit()
        after = distributed.device_bytes({k: trainer.ts[k] for k in ("params", "opt_state")})
        np.savez(folder / f"fsdp{fsdp}.npz", **checkpoint.flatten(distributed.to_host(trainer.ts)))
        out[fsdp] = {"max_device_bytes": max(held.values()), "devices": len(held), "after": max(after.values()),
                     "specs": specs, "mesh": dict(trainer.state.mesh.shape)}
    print(json.dumps(out))
""")


@pytest.mark.slow
def test_fsdp4_equals_fsdp1_with_a_quarter_of_the_memory_per_device(tmp_path, data_dir):
    tiny_config(tmp_path, data_dir, validation=False, trainer__epochs=1)
    child = subprocess.run(
        [sys.executable, "-c", FSDP_CHILD, str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, **devices_env(4)},
        timeout=300,
    )
    assert child.returncode == 0, child.stderr
    out = json.loads(child.stdout.strip().splitlines()[-1])
    replicated, sharded = out["1"], out["4"]
    assert replicated["mesh"] == {"data": 4, "fsdp": 1} and sharded["mesh"] == {"data": 1, "fsdp": 4}
    assert sharded["specs"] == {"weight": ["fsdp"], "bias": ["fsdp"]}  # (784, 64): its largest axis
    ratio = replicated["max_device_bytes"] / sharded["max_device_bytes"]
    print(
        f"per-device parameter + optimizer bytes: fsdp 1 {replicated['max_device_bytes']:,}, fsdp 4 "
        f"{sharded['max_device_bytes']:,} ({ratio:.3f}x less)"
    )
    assert 3.9 < ratio <= 4.0, ratio  # only head.bias (10 values) and its momentum stay whole
    assert sharded["after"] == sharded["max_device_bytes"]  # the step keeps the state sharded
    a, b = np.load(tmp_path / "fsdp1.npz"), np.load(tmp_path / "fsdp4.npz")
    assert a.files == b.files and any(k.startswith("opt_state") for k in a.files)
    for key in a.files:
        np.testing.assert_allclose(b[key], a[key], rtol=0, atol=1e-5, err_msg=key)
    # the checkpoint gathered from the shards holds the whole arrays, equal to the state
    saved, _ = checkpoint.read(tmp_path / "fsdp4/checkpoint-latest.params")
    for key in saved:
        np.testing.assert_array_equal(saved[key], b[key], err_msg=key)


@pytest.mark.slow
@pytest.mark.parametrize("victim", [1, 0])
def test_a_dead_process_ends_the_others_in_bounded_time(tmp_path, data_dir, victim):
    """Exactly the outcomes README documents, whichever moment the kill hits: a dead process 1 ends process 0 with
    the watchdog's one line and exit status 1; a dead process 0 (the coordinator) ends process 1 through JAX's own
    abort. The survivor is most often inside a collective that fails at once: its traceback must not come out."""
    config = tiny_config(tmp_path, data_dir, validation=False, trainer__epochs=10**4)
    processes = start_processes(2, 1, "-c", config, "--run-id", "die", heartbeat=4)
    survivor = processes[1 - victim]
    latest = tmp_path / "saved/tiny/die/checkpoint-latest.params"
    deadline = time.monotonic() + 240
    while not latest.is_file():  # training is under way and has written a checkpoint
        assert time.monotonic() < deadline and survivor.poll() is None, finish(processes, 10)
        time.sleep(0.2)
    processes[victim].send_signal(signal.SIGKILL)
    killed = time.monotonic()
    _, err = survivor.communicate(timeout=60)
    took = time.monotonic() - killed
    processes[victim].wait()
    # whatever the survivor was doing (most often waiting in a collective, which fails at once): never a traceback
    assert "Traceback" not in err, err[-3000:]
    if victim == 1:  # the watchdog of process 0: one clear line, exit status 1
        lines = [line for line in err.splitlines() if not line.startswith("[Gloo]")]
        assert survivor.returncode == 1 and len(lines) == 1, err[-3000:]
        assert lines[0].startswith(
            "error: process 1 of 2 gave no sign of life for 4 s: it died or hangs; process 0 stops too (exit status 1)"
        ), err[-3000:]
        assert took < 4 + 10, took
    else:  # the coordinator itself is gone: JAX's agent aborts process 1 at once with its own message
        assert survivor.returncode == -signal.SIGABRT, err[-3000:]
        assert "Terminating process because the JAX distributed service detected fatal errors" in err, err[-3000:]
        assert took < 4, took
    checkpoint.read(latest)  # what is on disk stays readable


@pytest.mark.slow
def test_language_model_two_processes_equal_one_device(tmp_path):
    """The language-model sample's shape of problem (int32 token windows in, a class per position out, per-element
    targets, a causal transformer with dropout) on 2 processes x 2 devices ends as on 1 device (1e-5)."""
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog; " * 40)
    loader = {"name": "char_text", "args": {"path": str(text), "context": 16, "stride": 16}}
    config = {
        "name": "lm",
        "seed": 3,
        "model": {
            "name": "char_transformer",
            "args": {
                "vocab_size": len(set(text.read_text())),
                "context": 16,
                "dim": 16,
                "depth": 1,
                "num_heads": 2,
                "dropout": 0.1,
            },
        },
        "loss": {"name": "cross_entropy"},
        "metrics": [{"name": "perplexity"}],
        "optimizer": {"name": "sgd", "args": {"lr": 0.3, "momentum": 0.9}},
        "data_loader": {
            "train": {**loader, "args": {**loader["args"], "split": "train", "batch_size": 8, "shuffle": True}},
            "validation": {**loader, "args": {**loader["args"], "split": "validation", "batch_size": 4}},
        },
        "trainer": {"epochs": 2, "save_dir": str(tmp_path / "saved"), "steps_per_call": 4, "monitor": "min val/loss"},
    }
    path = write_config(tmp_path, config, {})
    one = run("train.py", "-c", path, "--run-id", "one", env=devices_env(1))
    assert one.returncode == 0, one.stderr
    for status, _out, err in finish(start_processes(2, 2, "-c", path, "--run-id", "two")):
        assert status == 0, err
    saved = tmp_path / "saved/lm"
    rows = lambda name: np.array(
        [
            [r["train/loss"], r["val/loss"], r["val/perplexity"]]
            for r in map(json.loads, (saved / name / "metrics.jsonl").read_text().splitlines())
        ]
    )
    np.testing.assert_allclose(rows("two"), rows("one"), rtol=0, atol=1e-5)
    assert_close_states(saved / "two" / "checkpoint-latest.params", saved / "one" / "checkpoint-latest.params")


EVALUATE = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from data_loader.loader import ArrayDataset, DataLoader
    from training.trainer import Trainer
    from utils import assemble, validate

    def trainer(train_batch):
        config = validate({
            "name": "pad", "seed": 3,
            "model": {"name": "mlp", "args": {"num_classes": 5, "hidden": [16]}},
            "loss": {"name": "cross_entropy"}, "metrics": [{"name": "accuracy"}, {"name": "f1"}],
            "optimizer": {"name": "adam", "args": {"lr": 0.01}},
            "data_loader": {"train": {"name": "mnist"}, "validation": {"name": "mnist"}},
            "trainer": {"epochs": 1, "save_dir": sys.argv[1]},
        })
        rng = np.random.default_rng(0)
        x, y = rng.standard_normal((30, 6)).astype(np.float32), rng.integers(0, 5, 30).astype(np.int32)
        run = assemble(config)
        # 30 examples in batches of 12: 12, 12 and 6 real rows, none a multiple of 8 devices
        run.use_data({"train": DataLoader(ArrayDataset(input=x, target=y), train_batch),
                      "validation": DataLoader(ArrayDataset(input=x, target=y), 12)})
        return Trainer(run, None)

    try:
        trainer(12)
    except ValueError as error:
        print("refused:", error)
    t = trainer(8)
    t.init_state()
    print(json.dumps(t.evaluate(t.valid_loader)))
    """
)


def test_evaluation_batches_are_padded_to_the_devices_and_training_batches_refused(tmp_path):
    """A validation batch of 12 on 8 devices: padded with masked rows, the loss and metrics those of 1 device. A
    training batch of 12 is refused in one line naming the sizes that divide."""
    outputs = {}
    for devices in (1, 8):
        done = subprocess.run(
            [sys.executable, "-c", EVALUATE, str(tmp_path)],
            cwd=ROOT,
            env={**os.environ, **devices_env(devices)},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        outputs[devices] = done.stdout.strip().splitlines()
    assert len(outputs[1]) == 1  # 12 divides over one device
    assert outputs[8][0] == (
        "refused: data_loader.train.args.batch_size 12 must be a multiple of the 8 devices in use: 8 or 16"
    )
    one, eight = json.loads(outputs[1][-1]), json.loads(outputs[8][-1])
    assert one.keys() == eight.keys() and one["loss"] > 0
    for name in one:
        np.testing.assert_allclose(eight[name], one[name], rtol=1e-6, atol=1e-7, err_msg=name)
