"""training/compiled.py: JAX's persistent compilation cache, as train.py turns it on, and "auto"'s choice kept beside
it: a second run of the same config compiles nothing and starts at the steps per call the first one chose."""

from __future__ import annotations

import json

from tests.end_to_end.test_train import data_dir, make_config, run  # noqa: F401


def entries(folder) -> set[str]:
    return {p.name for p in folder.iterdir() if p.name.endswith("-cache")} if folder.is_dir() else set()


def test_a_second_run_of_the_same_config_compiles_nothing_and_starts_at_auto_s_choice(tmp_path, data_dir):
    cache = tmp_path / "cache"
    config = make_config(tmp_path, data_dir, trainer__compilation_cache=str(cache), trainer__steps_per_call="auto")
    first = run("train.py", "-c", str(config))
    assert first.returncode == 0, first.stderr[-3000:]
    kept = entries(cache)
    assert any("train_call" in name for name in kept), sorted(kept)
    choices = json.loads((cache / "steps_per_call.json").read_text())
    (chosen,) = choices.values()
    assert "steps per call (auto): " in first.stderr + first.stdout

    second = run("train.py", "-c", str(config))
    assert second.returncode == 0, second.stderr[-3000:]
    said = second.stderr + second.stdout
    assert entries(cache) == kept  # every program of the second run came from the cache
    assert f'{chosen} step(s) per call, as "auto" chose for this step on these devices' in said
    assert "steps per call (auto): " not in said  # not timed again


def test_no_cache_when_switched_off_or_unusable_and_a_bad_value_is_one_line(tmp_path, data_dir):
    cache = tmp_path / "cache"
    config = make_config(tmp_path, data_dir, trainer__compilation_cache=False, trainer__epochs=1)
    done = run("train.py", "-c", str(config), env={"JAX_COMPILATION_CACHE_DIR": str(cache)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert not cache.exists()
    unusable = make_config(tmp_path, data_dir, trainer__compilation_cache="/proc/no-such-cache", trainer__epochs=1)
    done = run("train.py", "-c", str(unusable))
    assert done.returncode == 0, done.stderr[-3000:]
    said = done.stdout + done.stderr
    assert "compilation cache off: /proc/no-such-cache: No such file or directory" in said
    assert "Error reading persistent compilation cache" not in said
    bad = make_config(tmp_path, data_dir, trainer__compilation_cache=3)
    refused = run("train.py", "-c", str(bad))
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "trainer.compilation_cache: expected a folder, false (no cache) or null (the default), got 3" in (
        refused.stderr
    )
