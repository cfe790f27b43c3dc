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


@pytest.mark.parametrize(
    "text, cell",
    [
        ("=1+1", "'=1+1"),
        ("+1+1", "'+1+1"),
        ("-2+3", "'-2+3"),
        ("@SUM(A1)", "'@SUM(A1)"),
        ("\tx", "'\tx"),
        ("\rx", '"\'\rx"'),
        ('=HYPERLINK("a","b")', '"\'=HYPERLINK(""a"",""b"")"'),
        ("-0.5", "-0.5"),
        ("cat", "cat"),
        ("a,b", '"a,b"'),
    ],
)
def test_a_csv_text_cell_that_a_spreadsheet_would_run_is_escaped(text, cell):
    """Before: each was written as it is, and a spreadsheet ran "=1+1" as a formula."""
    assert predict.csv_cell(text) == cell


def test_out_csv_names_and_labels_open_as_text_numbers_as_numbers(export, capsys, monkeypatch):  # noqa: F811
    """Class names and target names from a handed export are escaped; input names are relative to the working folder
    (as typed), not this machine's absolute paths; a negative output stays a number."""
    monkeypatch.chdir(export)
    rows = np.random.default_rng(2).normal(size=(6, 4)).astype(np.float32)
    np.save(export / "=x.npy", rows)
    (export / "preprocessing.json").write_text('{"classes": ["=1+1", "-dog", "@cat"]}')
    assert predict.main([str(export / "tiny.onnx"), str(export / "=x.npy"), "--out", str(export / "p.csv")]) == 0
    lines = (export / "p.csv").read_text().splitlines()
    assert lines[0] == "input,'=1+1 probability,'-dog probability,'@cat probability,predicted"
    assert [line.split(",")[0] for line in lines[1:]] == [f"'=x.npy[{i}]" for i in range(6)]
    assert {line.split(",")[-1] for line in lines[1:]} <= {"'=1+1", "'-dog", "'@cat"}

    (export / "preprocessing.json").write_text('{"task": "regression", "targets": ["+a", "b", "-c"]}')
    assert predict.main([str(export / "tiny.onnx"), str(export / "=x.npy"), "--out", str(export / "r.csv")]) == 0
    lines = (export / "r.csv").read_text().splitlines()
    assert lines[0] == "input,'+a,b,'-c"
    values = np.array([[float(v) for v in line.split(",")[1:]] for line in lines[1:]])
    assert (values < 0).any()  # written as -0.123, not '-0.123
    capsys.readouterr()
