"""predict.py on the inputs a user hands it (issue 58): no rows, a file type the model cannot take, a folder of
images, many inputs; and what its --out CSV holds for whoever opens it next. Each bad input is one `error:` line and
exit status 2."""

from __future__ import annotations

import numpy as np
import pytest

from inference import predict
from tests.end_to_end.test_untrusted_inputs import export, one_line  # noqa: F401 (a tiny ONNX model and x.npy)


@pytest.mark.parametrize("name, raw", [("zero.npy", []), ("zero.npy", ["--raw"]), ("header.csv", [])])
def test_an_input_of_no_rows_is_one_line(export, capsys, name, raw):  # noqa: F811
    """Before: an IndexError traceback from run_batched, with or without --raw."""
    np.save(export / "zero.npy", np.zeros((0, 4), np.float32))
    (export / "header.csv").write_text("a,b,c,d\n")
    line = one_line(capsys, predict.main, export / "tiny.onnx", export / name, *raw)
    assert line == f"error: {export / name}: no examples in it (0 rows); give at least one"
