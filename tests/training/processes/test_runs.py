"""Several processes joined by jax.distributed on localhost (training/processes/), proven by simulation on one
machine: CPU devices multiplied with --xla_force_host_platform_device_count, gloo collectives between processes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from tests.end_to_end.test_train import ROOT, run, write_config
from tests.training.test_mesh import assert_close_states, data_dir, devices_env, losses, resume_in_one, tiny_config
from training.run import checkpoint

__all__ = ["data_dir"]  # the fixture, used by name


WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:] or 0)  # this test process's index under xdist
PORT_CLASSES = 8


def not_gloo(text: str) -> list[str]:
    """The lines of `text` but gloo's own connection lines ("[Gloo] Rank 2 is connected to 3 peer ranks. ..."), which
    gloo's threads write in pieces that can interleave: a piece may start a line of its own."""
    return [line for line in text.splitlines() if "[Gloo]" not in line and "peer ranks" not in line]


def free_port() -> int:
    """A port nothing listens on, of this test worker's own class: the coordinators of runs that two workers start
    at the same moment never get the same port (the later one's process 0 would refuse it). Linux hands bind() odd
    ports only (even ones go to connect()), so the class is taken from the port halved."""
    while True:
        with socket.socket() as s:
            s.bind(("localhost", 0))
            port = s.getsockname()[1]
        if (port >> 1) % PORT_CLASSES == WORKER % PORT_CLASSES:
            return port


def start_processes(
    count: int, devices: int, *args, heartbeat: int = 60, command: tuple = ("train.py",)
) -> list[subprocess.Popen]:
    """`count` train.py processes (or `command`'s) joined on localhost, `devices` simulated CPU devices each."""
    port = free_port()
    env = {**os.environ, **devices_env(devices)}
    return [
        subprocess.Popen(
            [
                sys.executable,
                *command,
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
    """Each process's (exit status, standard output, standard error) once all ended; a process still running after
    `timeout` seconds fails the test with what every process said (all are killed first)."""
    results = []
    for index, p in enumerate(processes):
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for other in processes:
                other.kill()
            said = []
            for i, q in enumerate(processes):
                q_out, q_err = results[i][1:] if i < len(results) else q.communicate()
                said.append(f"process {i} (exit status {q.wait()}):\n{(q_out or '')[-1500:]}{(q_err or '')[-3000:]}")
            pytest.fail(f"process {index} was still running after {timeout} s\n" + "\n".join(said))
        results.append((p.returncode, out, err))
    return results


AGREE_CHILD = textwrap.dedent("""
    import json, sys
    from training.devices import mesh
    from training.processes.launch import join

    port, index = sys.argv[1], int(sys.argv[2])
    join(f"localhost:{port}", 2, index, heartbeat_timeout=20)
    agreed = mesh.max_over_processes(15 if index == 1 else 0, 1 if index == 0 else 0, 7)
    folder = mesh.share_text("run_dir", "saved/x/run_1" if index == 0 else None)
    mesh.finish_processes()
    print(json.dumps({"agreed": agreed, "folder": folder, "main": mesh.is_main()}))
""")


def child_pair(script: str, *args) -> list[tuple[subprocess.Popen, str, str]]:
    """``script`` (Python source) run as processes 0 and 1 of a 2-process job on a free coordinator port, one CPU
    device each: ``script port index *args``; each process with its standard output and error, once both ended."""
    port = free_port()
    env = {**os.environ, **devices_env(1)}
    children = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(port), str(i), *map(str, args)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    return [(child, *child.communicate(timeout=120)) for child in children]


def test_processes_agree_on_stops_and_share_the_run_folder():
    """A stop signal (15) seen by process 1 only and a timed save due on process 0 only become both processes'
    decision; process 0's run folder reaches process 1; both end through the final barrier."""
    ended = child_pair(AGREE_CHILD)
    for child, _out, err in ended:
        assert child.returncode == 0, err
    results = [json.loads(out.strip().splitlines()[-1]) for _, out, _ in ended]
    assert [r["agreed"] for r in results] == [[15, 1, 7], [15, 1, 7]]
    assert [r["folder"] for r in results] == ["saved/x/run_1", "saved/x/run_1"]
    assert [r["main"] for r in results] == [True, False]


@pytest.mark.slow
def test_two_processes_equal_one_device_and_resume_in_one(tmp_path, data_dir):
    """2 processes x 2 devices == 1 device (losses and final state within 1e-5); the 2-process run's checkpoint
    resumes in one process on one device and ends as the 1-device run."""
    config = tiny_config(tmp_path, data_dir)
    saved = tmp_path / "saved/tiny"
    one = run("train.py", "-c", config, "--run-id", "one", env=devices_env(1))
    assert one.returncode == 0, one.stderr
    results = finish(start_processes(2, 2, "-c", config, "--run-id", "two"))
    for status, _out, err in results:
        assert status == 0, err
    assert "process 0 of 2" in results[0][1] and "mesh {'data': 4, 'fsdp': 1}" in results[0][1]
    # process 1 logs warnings only (gloo's own connection lines aside); process 0 reports the run
    assert not_gloo(results[1][1]) == []
    two = saved / "two"
    assert sorted(p.name for p in saved.iterdir()) == ["one", "two"]  # one folder for both processes
    np.testing.assert_allclose(losses(two), losses(saved / "one"), rtol=0, atol=1e-5)
    for name in ("checkpoint-latest.params", "checkpoint-epoch_1.params", "model_best.params"):
        assert_close_states(two / name, saved / "one" / name)
    # several processes save shards beside an index; merged into one file, the checkpoint travels alone
    epoch_1 = two / "checkpoint-epoch_1.params"
    merged = run("-m", "training.run.shards", "--merge", epoch_1, "--out", epoch_1)
    assert merged.returncode == 0, merged.stderr
    resumed_dir = resume_in_one(two, saved / "resumed")
    assert_close_states(resumed_dir / "checkpoint-latest.params", saved / "one" / "checkpoint-latest.params")
    np.testing.assert_allclose(losses(resumed_dir), losses(saved / "one"), rtol=0, atol=1e-5)


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
        lines = not_gloo(err)
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


COUNT_CHILD = textwrap.dedent("""
    import sys
    from training.devices import mesh
    agreed, real = [], mesh.max_over_processes
    def counted(*values):
        agreed.append(values)
        return real(*values)
    mesh.max_over_processes = counted
    import train
    status = train.main(sys.argv[1:])
    print(f"collectives: {len(agreed)}")
    sys.exit(status)
""")


@pytest.mark.slow
def test_processes_agree_at_each_epoch_end_not_at_every_call(tmp_path, data_dir):
    """Agreeing on a stop or a timed save is a blocking collective: two processes agree at each epoch's end and
    every ``AGREE_EVERY_STEPS`` steps' worth of calls (here more than an epoch), not at every call. 2 epochs of 16
    one-step calls: 2 collectives per process (agreeing at every call made 32)."""
    from training.run.stops import AGREE_EVERY_STEPS

    config = tiny_config(
        tmp_path, data_dir, validation=False, trainer__steps_per_call=1, data_loader__train__args__batch_size=8
    )
    calls = (160 - 32) // 8  # the train split (n_train less the validation rows) in batches of 8: one call each
    assert calls < AGREE_EVERY_STEPS
    results = finish(start_processes(2, 1, "-c", config, "--run-id", "count", command=("-c", COUNT_CHILD)))
    for status, out, err in results:
        assert status == 0, err
        assert out.strip().splitlines()[-1] == "collectives: 2", out[-2000:]
    rows = (tmp_path / "saved/tiny/count/metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["step"] for r in rows] == [calls, 2 * calls]


@pytest.mark.slow
def test_two_processes_agree_on_auto_steps_per_call(tmp_path, data_dir, monkeypatch):
    """ "auto" is timed by each process on its own: both take the same K at the same call (the larger of their
    choices) and switch to it together mid-epoch, and the run's losses are those of one step per call alone."""
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "cache"))  # no choice another test's run kept
    config = tiny_config(tmp_path, data_dir, trainer__steps_per_call="auto", trainer__epochs=3)
    saved = tmp_path / "saved/tiny"
    results = finish(start_processes(2, 1, "-c", config, "--run-id", "auto"))
    for status, _out, err in results:
        assert status == 0, err
    chosen = [line for line in results[0][1].splitlines() if "steps per call (auto): " in line]
    assert len(chosen) == 1 and "steps per call (auto): 1;" not in chosen[0], results[0][1]
    # run again, both processes start at the choice the first run kept, untimed, and agree on it
    again = finish(start_processes(2, 1, "-c", config, "--run-id", "again"))
    k = chosen[0].split("steps per call (auto): ")[1].split(";")[0]
    for status, out, err in again:
        assert status == 0, err
        assert "steps per call (auto): " not in out + err
    assert f'{k} step(s) per call, as "auto" chose' in again[0][1] + again[0][2]
    config = tiny_config(tmp_path, data_dir, trainer__steps_per_call=1, trainer__epochs=3)
    one = run("train.py", "-c", config, "--run-id", "one", env=devices_env(2))
    assert one.returncode == 0, one.stderr
    np.testing.assert_allclose(losses(saved / "auto"), losses(saved / "one"), rtol=0, atol=1e-5)
