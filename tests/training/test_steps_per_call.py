"""training/steps_per_call.py: where "auto" starts, and the remembered choices' file as someone else may have left it
(the policy's choice itself is tested with the loop, in tests/end_to_end/test_performance.py)."""

from __future__ import annotations

import json
import os
import threading

import pytest

from training.steps_per_call import AUTO_MAX_STEPS, REMEMBERED, StepsPerCall, key_of, remembered, worth_compiling


def policy(setting="auto", steps_per_epoch=100) -> StepsPerCall:
    return StepsPerCall(setting, steps_per_epoch, batch_bytes=1024)


def test_a_fixed_setting_never_measures_and_auto_measures_without_a_remembered_choice(tmp_path):
    fixed = policy(4)
    assert fixed.start("key", tmp_path) == "4 step(s) per call" and not fixed.measuring and fixed.k == 4
    auto = policy()
    assert "times the first" in auto.start("key", tmp_path) and auto.measuring and auto.k == 1
    untimed = policy()  # a step not compiled ahead of time (--detect-nans, --no-jit): one step per call, untimed
    untimed.start("key", tmp_path, measure=False)
    assert not untimed.measuring and untimed.k == 1


def test_a_remembered_choice_is_where_auto_starts_and_a_new_one_is_kept_beside_the_others(tmp_path):
    (tmp_path / REMEMBERED).write_text(json.dumps({"other": 3, "key": 8}))
    auto = policy()
    assert auto.start("key", tmp_path).startswith('8 step(s) per call, as "auto" chose')
    assert auto.k == auto.chosen == 8 and not auto.measuring
    fresh = policy()
    fresh.start("new", tmp_path)
    fresh.remember(5)
    assert json.loads((tmp_path / REMEMBERED).read_text()) == {"other": 3, "key": 8, "new": 5}


def test_a_switch_must_repay_its_compile_within_the_steps_left():
    """8 steps per call save 7/8 of each step's 10 ms of host work: 100 steps left repay 0.8 s of compile, 10 do not."""
    assert worth_compiling(8, 100, 0.01, 0.8) == (True, "")
    worth, why = worth_compiling(8, 10, 0.01, 0.8)
    assert not worth and "8 would save about 0.1s over the 10 step(s) left, less than compiling it (about 0.8s)" in why


@pytest.mark.parametrize("value", [0, -1, AUTO_MAX_STEPS + 1, 101, 2.5, "8", None, True])
def test_a_remembered_value_out_of_range_is_measured_afresh(tmp_path, value):
    """Past the cap, past the epoch (100 steps here), not an integer: measured again, never trusted."""
    (tmp_path / REMEMBERED).write_text(json.dumps({"key": value}))
    auto = policy()
    auto.start("key", tmp_path)
    assert auto.measuring and auto.k == 1


def test_a_remembered_file_someone_else_made_is_ignored_without_blocking(tmp_path):
    """Torn JSON, not an object, nested past the JSON bound, a folder, a FIFO (opening it for reading would wait for a writer), a link to a
    device or an oversized file: each is no choice at all."""
    target = tmp_path / REMEMBERED
    cases = {
        "torn": lambda: target.write_text('{"key": 8'),
        "list": lambda: target.write_text("[8]"),
        "nested 100,000 deep": lambda: target.write_text("[" * 100_000 + "]" * 100_000),  # was a RecursionError
        "folder": lambda: target.mkdir(),
        "fifo": lambda: os.mkfifo(target),
        "link to /dev/zero": lambda: target.symlink_to("/dev/zero"),
        "huge": lambda: target.write_bytes(b" " * (2**20 + 1) + b'{"key": 8}'),
    }
    for name, make in cases.items():
        make()
        result = {}
        reader = threading.Thread(target=lambda: result.update(choices=remembered(target)), daemon=True)
        reader.start()
        reader.join(5)
        assert result.get("choices") == {}, name
        if target.is_dir() and not target.is_symlink():
            target.rmdir()
        else:
            target.unlink()


def test_the_key_names_the_step_not_the_run():
    """Epochs, the run's name, its seed and its logging do not change the step; the model, the batch's shapes and
    the precision do."""
    import jax.numpy as jnp
    from jax import ShapeDtypeStruct

    spec = {"input": ShapeDtypeStruct((8, 4), jnp.float32)}
    config = {"name": "a", "seed": 1, "model": {"name": "mlp"}, "trainer": {"epochs": 3, "precision": None}}
    same = {**config, "name": "b", "seed": 2, "trainer": {"epochs": 9, "log_every": 5, "precision": None}}
    other_model = {**config, "model": {"name": "mlp", "args": {"hidden": [4]}}}
    other_precision = {**config, "trainer": {"epochs": 3, "precision": "bfloat16"}}
    assert key_of(config, spec) == key_of(same, spec)
    assert key_of(config, spec) != key_of(other_model, spec)
    assert key_of(config, spec) != key_of(other_precision, spec)
    assert key_of(config, spec) != key_of(config, {"input": ShapeDtypeStruct((16, 4), jnp.float32)})
