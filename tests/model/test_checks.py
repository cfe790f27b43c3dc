"""The numeric range checks of every layer of the project come from model/checks.py; each family keeps the wording
its users have always seen, and a bad value still ends train.py with one `error:` line and nothing written."""

from __future__ import annotations

import pytest

from tests.end_to_end.test_train import data_dir, make_config, refused_in_process  # noqa: F401  (data_dir: the fixture)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"model__args__hidden": [0]}, "model.args.hidden.0: must be an integer from 1 to 16,777,216, got 0"),
        ({"data_loader__train__args__prefetch": 65}, "prefetch: must be an integer from 0 to 64, got 65"),
        ({"optimizer__args__b1": 1.5}, "b1: must be in [0, 1), got 1.5"),
        ({"optimizer__args__eps": 0.0}, "eps: must be > 0, got 0.0"),
        ({"loss__args": {"label_smoothing": 1.0}}, "label_smoothing: must be in [0, 1), got 1.0"),
        (
            {"data_loader__train__augment": [{"name": "flip_horizontal", "args": {"p": 1.5}}]},
            "data_loader.train.augment.0.args.p: must be a number >= 0 and <= 1, got 1.5",
        ),
    ],
)
def test_out_of_range_values_are_refused_in_one_line(tmp_path, data_dir, capsys, monkeypatch, change, message):  # noqa: F811
    line = refused_in_process(["-c", str(make_config(tmp_path, data_dir, **change))], capsys, monkeypatch)
    assert message in line
    assert not (tmp_path / "saved").exists()
