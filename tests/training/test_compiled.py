"""JAX's persistent compilation cache (training/devices/compilation_cache.py), as train.py turns it on: the machine's
folder, never a run's; a second run of the same config compiles nothing and starts at the steps per call the first
one chose; a folder others could write, or one holding what JAX never writes, is not used; a handed run folder's
config cannot point a run at programs of its choosing."""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest

from tests.end_to_end.test_train import data_dir, make_config, run  # noqa: F401
from training.config.file import show
from training.devices import compilation_cache


def entries(folder) -> set[str]:
    return {p.name for p in folder.iterdir() if p.name.endswith("-cache")} if folder.is_dir() else set()


def test_a_second_run_of_the_same_config_compiles_only_auto_s_choice_and_starts_at_it(tmp_path, data_dir):
    """A short first run times its calls, finds that K steps per call would not repay their compile, stays at one
    step per call (one training program compiled) and remembers K; the second run starts at K, untimed, compiles that
    one program and reads every other from the cache."""
    cache = tmp_path / "cache"
    config = make_config(tmp_path, data_dir, trainer__steps_per_call="auto")
    first = run("train.py", "-c", str(config), env={"JAX_COMPILATION_CACHE_DIR": str(cache)})
    assert first.returncode == 0, first.stderr[-3000:]
    kept = entries(cache)
    assert [name for name in kept if "train_call" in name], sorted(kept)
    choices = json.loads((cache / "steps_per_call.json").read_text())
    (chosen,) = choices.values()
    said = first.stderr + first.stdout  # where each program came from: compiled, then kept
    assert "this run stays at one step per call" in said
    assert re.search(r"compiled the training step \(1 step per call[^)]*\) in [\d.]+s \(compiled; kept in the", said)
    assert re.search(r"compiled the evaluation step \(batches of 40\) in [\d.]+s \(compiled; kept in the", said)
    assert "state: fresh state from seed 1 (compiled; kept in the compilation cache)" in said

    second = run("train.py", "-c", str(config), env={"JAX_COMPILATION_CACHE_DIR": str(cache)})
    assert second.returncode == 0, second.stderr[-3000:]
    said = second.stderr + second.stdout
    (added,) = entries(cache) - kept  # the training call at K: every other program came from the cache
    assert "train_call" in added
    assert f'{chosen} step(s) per call, as "auto" chose for this step on these devices' in said
    assert "steps per call (auto): " not in said  # not timed again
    assert re.search(r"compiled the evaluation step \(batches of 40\) in [\d.]+s \(from the compilation cache\)", said)
    assert "state: fresh state from seed 1 (from the compilation cache)" in said


def test_no_cache_when_switched_off_or_unusable_and_a_config_cannot_choose_one(tmp_path, data_dir):
    cache = tmp_path / "cache"
    config = make_config(tmp_path, data_dir, trainer__epochs=1)
    off = {"JAX_COMPILATION_CACHE_DIR": str(cache), "JAX_ENABLE_COMPILATION_CACHE": "false"}
    done = run("train.py", "-c", str(config), env=off)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not cache.exists() and "compilation cache" not in done.stdout + done.stderr
    # the machine's unusable, and a config's own (the key of configs before the cache became the machine's) named
    # beside it: that one is named and not used either, the run goes on without a cache
    asked = make_config(tmp_path, data_dir, trainer__epochs=1, trainer__compilation_cache=str(tmp_path / "asked"))
    done = run("train.py", "-c", str(asked), env={"JAX_COMPILATION_CACHE_DIR": "/proc/no-such-cache"})
    assert done.returncode == 0, done.stderr[-3000:]
    said = done.stdout + done.stderr
    assert "compilation cache off: /proc/no-such-cache: No such file or directory" in said
    assert "Error reading persistent compilation cache" not in said
    assert f"trainer.compilation_cache {show(str(tmp_path / 'asked'))} is not used" in said
    assert not (tmp_path / "asked").exists()


def test_a_folder_others_could_write_or_holding_what_jax_never_writes_is_not_used(tmp_path):
    def refusal(folder):
        return compilation_cache.unsafe(folder.resolve())

    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "jit_f-0123-cache").write_bytes(b"x")
    assert refusal(cache) is None
    cache.chmod(0o775)
    assert "is writable by others (mode drwxrwxr-x)" in refusal(cache)
    cache.chmod(0o755)
    os.mkfifo(cache / "jit_g-4567-cache")
    assert refusal(cache) == "1 entry JAX never writes (jit_g-4567-cache is a FIFO): remove them"
    os.unlink(cache / "jit_g-4567-cache")
    (cache / "jit_h-89ab-cache").symlink_to("/dev/zero")
    assert "jit_h-89ab-cache is a link" in refusal(cache)
    os.unlink(cache / "jit_h-89ab-cache")
    with open(cache / "jit_i-cdef-cache", "wb") as big:  # sparse: no disk taken
        big.truncate(compilation_cache.MAX_ENTRY_BYTES + 1)
    assert f"past {compilation_cache.MAX_ENTRY_BYTES}" in refusal(cache)
    os.unlink(cache / "jit_i-cdef-cache")
    if os.getuid() == 0:  # only root can give a file away
        os.chown(cache / "jit_f-0123-cache", 4321, 4321)
        assert "jit_f-0123-cache belongs to another user (uid 4321)" in refusal(cache)
        os.chown(cache, 4321, 4321)
        assert "belongs to another user (uid 4321)" in refusal(cache)


def last_row(run_dir) -> dict:
    return json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])


@pytest.mark.slow
def test_a_handed_run_folder_never_runs_its_compiled_programs(tmp_path, data_dir):
    """A folder whose config names a cache holding another run's program under the very key `-r` computes: the
    program runs where the machine's own cache is that folder (the control: the plant is real), never where only
    the handed config names it."""
    planted = tmp_path / "planted"
    handed = make_config(tmp_path, data_dir, trainer__epochs=1, trainer__steps_per_call=1)
    done = run("train.py", "-c", handed, "--run-id", "handed", env={"JAX_COMPILATION_CACHE_DIR": str(planted)})
    assert done.returncode == 0, done.stderr[-3000:]
    written = tmp_path / "saved/tiny/handed/config.json"
    config = json.loads(written.read_text())
    config["trainer"]["compilation_cache"] = str(planted)  # as the handed folder's author asks
    written.write_text(json.dumps(config))
    other = tmp_path / "other"
    (tmp_path / "o").mkdir()
    changed = make_config(
        tmp_path / "o", data_dir, trainer__epochs=1, trainer__steps_per_call=1, optimizer__args__lr=0.3
    )
    done = run("train.py", "-c", changed, env={"JAX_COMPILATION_CACHE_DIR": str(other)})
    assert done.returncode == 0, done.stderr[-3000:]
    (key,) = [name for name in entries(planted) if "train_call" in name]
    (foreign,) = [name for name in entries(other) if "train_call" in name]
    shutil.copyfile(other / foreign, planted / key)  # another run's program under the handed run's key

    def resume(name: str, machine_cache):
        copy = tmp_path / name
        shutil.copytree(tmp_path / "saved/tiny/handed", copy)
        env = {"JAX_COMPILATION_CACHE_DIR": str(machine_cache)}
        done = run("train.py", "-r", copy / "checkpoint-latest.params", "--epochs", "2", env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        return copy, done.stdout + done.stderr

    control, _ = resume("control", planted)
    own = tmp_path / "own"
    defended, said = resume("defended", own)
    assert f"trainer.compilation_cache {show(str(planted))} is not used" in said
    assert key in entries(own)  # the key the plant sat under, compiled afresh
    assert last_row(defended)["train/loss"] != last_row(control)["train/loss"]


@pytest.mark.slow
def test_a_fifo_under_the_step_s_key_neither_hangs_nor_is_read(tmp_path, data_dir):
    cache = tmp_path / "cache"
    config = make_config(tmp_path, data_dir, trainer__epochs=1, trainer__steps_per_call=1)
    done = run("train.py", "-c", config, env={"JAX_COMPILATION_CACHE_DIR": str(cache)})
    assert done.returncode == 0, done.stderr[-3000:]
    (key,) = [name for name in entries(cache) if "train_call" in name]
    os.unlink(cache / key)
    os.mkfifo(cache / key)
    done = run("train.py", "-c", config, env={"JAX_COMPILATION_CACHE_DIR": str(cache)}, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"compilation cache off: {cache}: 1 entry JAX never writes ({key} is a FIFO)" in done.stdout + done.stderr
