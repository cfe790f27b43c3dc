"""predict.py on the inputs a user hands it (issue 58): no rows, a file type the model cannot take, a folder of
images, many inputs; and what its --out CSV holds for whoever opens it next. Each bad input is one `error:` line and
exit status 2."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from data_loader.sources import image_folder, tabular
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


def tiny_image_onnx(path: Path) -> Path:
    """A real ONNX model of (batch, 2, 2, 1) float32 images -> (batch, 3) logits: a Reshape and a MatMul."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weights = numpy_helper.from_array(np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32), "w")
    flat = numpy_helper.from_array(np.array([-1, 4], np.int64), "flat")
    graph = helper.make_graph(
        [
            helper.make_node("Reshape", ["input", "flat"], ["rows"]),
            helper.make_node("MatMul", ["rows", "w"], ["output"]),
        ],
        "tiny_image",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 2, 2, 1])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 3])],
        [weights, flat],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_predict_takes_the_loaders_image_suffixes():
    """Repeated in predict.py, which ships alone: held equal to what the image folder loader reads."""
    assert predict.IMAGE_SUFFIXES == image_folder.SUFFIXES


def test_a_folder_of_images_is_its_image_files_sorted_and_quiet_prints_no_line_per_input(tmp_path, capsys):
    """Before: a folder was "not a regular file" (one line, nothing predicted)."""
    from PIL import Image

    tiny_image_onnx(tmp_path / "tiny.onnx")
    (tmp_path / "preprocessing.json").write_text('{"classes": ["a", "b", "c"], "pixel_scale": 0.00392156862745098}')
    images = tmp_path / "images"
    for name in ("b/2.png", "a/1.JPG", "a/.hidden/3.png", "0.bmp", ".4.png", "c/5.webp"):
        (images / name).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((5, 7), 15 * len(name), np.uint8)).save(images / name, format=None)
    (images / "notes.txt").write_text("not an image")
    assert predict.main([str(tmp_path / "tiny.onnx"), str(images), "--top", "1"]) == 0
    printed = [line.split(": ")[0] for line in capsys.readouterr().out.splitlines()[1:]]
    assert printed == [str(images / name) for name in ("0.bmp", "a/1.JPG", "b/2.png", "c/5.webp")]

    out = tmp_path / "p.csv"
    assert predict.main([str(tmp_path / "tiny.onnx"), str(images), "--quiet", "--out", str(out)]) == 0
    assert capsys.readouterr().out.splitlines() == ["tiny: tiny.onnx, 4 input(s), task classification", f"wrote {out}"]
    assert len(out.read_text().splitlines()) == 5

    (images / "a" / "1.JPG").unlink()
    for name in ("0.bmp", "b/2.png", "c/5.webp"):
        (images / name).unlink()
    line = one_line(capsys, predict.main, tmp_path / "tiny.onnx", images)
    assert line == f"error: {images}: a folder of no image files (.png, .jpg, .jpeg, .bmp, .webp)"


@pytest.mark.parametrize("name", ["notes.txt", "image.png"])
def test_a_file_the_model_cannot_take_is_one_line_naming_what_it_takes(export, capsys, name):  # noqa: F811
    """Before: "not enough values to unpack (expected 3, got 1)" for a .txt given to a model of (N, 4) inputs (a
    text classifier's ids), read as an image of the input's shape."""
    from PIL import Image

    (export / "notes.txt").write_text("some text\n")
    Image.fromarray(np.zeros((4, 4), np.uint8)).save(export / "image.png")
    (export / "preprocessing.json").write_text('{"classes": ["a", "b", "c"]}')
    line = one_line(capsys, predict.main, export / "tiny.onnx", export / name)
    assert line == (
        f"error: {export / name}: not a file this model takes; it takes .csv rows or .npy or .npz arrays of examples "
        "of shape [4]"
    )


@pytest.mark.parametrize("cell", ["nan", "inf", "1e400"])
def test_a_cell_training_refuses_is_refused_by_predict_too(export, capsys, cell):  # noqa: F811
    """Before: predict.py read it (NaN outputs and a warning) where the training loader refused it in one line."""
    path = export / "rows.csv"
    path.write_text(f"a,b,c,d\n1,2,3,4\n1,{cell},3,4\n")
    line = one_line(capsys, predict.main, export / "tiny.onnx", path)
    assert line == f"error: {path}: row 2, column 'b': {cell!r}, not a finite number"
    with pytest.raises(ValueError, match=f"column 'b': {cell!r}, not a finite number$"):
        tabular.CsvDataset(path, "d", validation_fraction=0.0, test_fraction=0.0)
