"""docs/walkthrough.ipynb run as a user runs it: every cell in a real Jupyter kernel (nbclient, ipykernel), train ->
evaluate -> export -> predict on the tiny data it makes itself."""

from __future__ import annotations

import pytest

from tests.end_to_end.test_train import ROOT

nbclient = pytest.importorskip("nbclient", reason="nbclient and ipykernel come with requirements-dev.txt")
nbformat = pytest.importorskip("nbformat")


KERNEL_MODEL = """
from model.model import mlp
from model.registry import register


@register("model")
def cell_net(num_classes: int = 2):
    return mlp(num_classes, hidden=(8,))


fit({**config, "model": {"name": "cell_net"}, "trainer": {**config["trainer"], "epochs": 1}}, run_dir=WORK / "cell")
refused = subprocess.run([sys.executable, "test.py", "--run", WORK / "cell"], cwd=ROOT, capture_output=True, text=True)
print(f"exit status {refused.returncode}\\n{refused.stderr}", end="")
"""


@pytest.mark.slow
def test_the_walkthrough_notebook_runs_in_a_jupyter_kernel(monkeypatch):
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")  # the kernel inherits the environment
    notebook = nbformat.read(ROOT / "docs" / "walkthrough.ipynb", as_version=4)
    assert all(not cell.get("outputs") for cell in notebook.cells if cell.cell_type == "code")  # stored clean
    # the export cell run again, as a user reruns a notebook: the same-named export is replaced, not refused
    export_cell = next(c for c in notebook.cells if c.cell_type == "code" and "convert_tflite.py" in c.source)
    notebook.cells.append(nbformat.v4.new_code_cell(export_cell.source))
    # and, in the same kernel, a model registered in a cell: its run folder is refused by test.py, in one line
    notebook.cells.append(nbformat.v4.new_code_cell(KERNEL_MODEL))
    # from docs/, where Jupyter opens it
    nbclient.NotebookClient(notebook, timeout=600, resources={"metadata": {"path": str(ROOT / "docs")}}).execute()
    text = lambda cell: "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")  # noqa: E731
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    trained = text(next(c for c in code if "rows = fit(config)" in c.source))
    assert "epoch 1/5" in trained and "epoch 5/5" in trained and "config.json" in trained and "'model'" in trained
    evaluated = text(next(c for c in code if "load_run(run_dir)" in c.source))
    assert "accuracy on 16 images:" in evaluated and "task: classification" in evaluated
    exported, again = (text(c) for c in code if "convert_tflite.py" in c.source)
    assert "largest difference from the JAX model:" in exported and "largest difference from the JAX model:" in again
    refused = text(code[-1]).splitlines()[-2:]  # after the fit's own lines
    assert refused == [
        "exit status 2",
        "error: config.json: model 'cell_net' was registered in a notebook (notebook.json), so only that kernel knows "
        "it: move its function into a file of your own (tasks/<name>/, found by itself) with "
        '@register("model") to use this run here',
    ], refused
