"""The language-model sample end to end on a tiny text: real train.py, test.py and sample.py subprocesses; and every
shipped sample config validates and names data that is there."""

from __future__ import annotations

import json

import pytest

from tests.end_to_end.test_train import ROOT, run
from training.config.validation import load_config

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n" * 40


@pytest.mark.slow
def test_char_language_model_trains_samples_and_evaluates(tmp_path):
    text = tmp_path / "input.txt"
    text.write_text(TEXT)
    config = load_config(ROOT / "configs" / "shakespeare_char.json")
    loader = {"name": "char_text", "args": {"path": str(text), "context": 16, "batch_size": 8}}
    config["model"]["args"].update(vocab_size=len(set(TEXT)), context=16, dim=32, depth=1, num_heads=2)
    config["data_loader"] = {
        "train": {**loader, "args": {**loader["args"], "split": "train", "shuffle": True}},
        "validation": {**loader, "args": {**loader["args"], "split": "validation"}},
    }
    config["trainer"].update(epochs=2, save_dir=str(tmp_path / "saved"), log_every=10)
    config["optimizer"]["schedule"]["args"]["warmup_steps"] = {"epochs": 0.2}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    result = run("train.py", "-c", path, "--run-id", "lm")
    assert result.returncode == 0, result.stderr
    run_dir = tmp_path / "saved/shakespeare_char/lm"
    assert "batch: input int32[8, 16], mask float32[8], target int32[8, 16]" in result.stdout
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["val/loss"] < rows[0]["val/loss"] and rows[-1]["val/perplexity"] > 1
    assert json.loads((run_dir / "preprocessing.json").read_text())["vocabulary"] == "".join(sorted(set(TEXT)))

    tested = run("test.py", "--run", run_dir)  # as the Samples section runs it: no test split, so validation's
    assert tested.returncode == 0, tested.stderr
    assert "validation split" in tested.stdout and "task: sequence" in tested.stdout
    assert "token accuracy" in tested.stdout
    assert "confusion matrix" not in tested.stdout

    sampled = run("sample.py", "--run", run_dir, "--prompt", "First", "--tokens", "30", "--temperature", "0")
    assert sampled.returncode == 0, sampled.stderr
    assert sampled.stdout.startswith("First") and len(sampled.stdout.rstrip("\n")) == 35
    bad = run("sample.py", "--run", run_dir, "--prompt", "Zebra")
    assert (
        bad.returncode == 2 and bad.stderr.strip() == "error: --prompt: characters not in the model's vocabulary: 'Zb'"
    )


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "configs").glob("*.json")) + ["../config.json"])
def test_every_sample_config_validates_and_its_data_is_shipped(name):
    config = load_config(ROOT / "configs" / name)
    for spec in config["data_loader"].values():
        args = spec.get("args", {})
        path = args.get("path") or args.get("data_dir")
        if path:
            assert (ROOT / path).exists(), f"{name}: {path} is not in the repository"
