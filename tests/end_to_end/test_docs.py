"""The docs lead somewhere: every relative link and anchor exists, and `train.py --list` (where the docs send a reader
for the names of components) prints every registered name."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from training.config import components

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def documents() -> list[Path]:
    found = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return found + [p for p in (ROOT / "benchmarks" / "README.md",) if p.is_file()]


@pytest.mark.parametrize("document", documents(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_lead_to_files_that_exist(document):
    dead = []
    for href in LINK.findall(document.read_text()):
        path = href.split("#")[0]
        if path and "://" not in href and not href.startswith("mailto:") and not (document.parent / path).exists():
            dead.append(href)
    assert not dead, f"{document.relative_to(ROOT)}: links to missing files: {dead}"


def test_anchors_within_the_docs_exist():
    """A link to `file.md#section` (or `#section`) names a heading of that file, as GitHub spells the anchor."""

    def anchors(path: Path) -> set[str]:
        headings = re.findall(r"^#+ (.+)$", path.read_text(), flags=re.M)
        return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}

    dead = []
    for document in documents():
        text = re.sub(r"```.*?```", "", document.read_text(), flags=re.S)  # a "#" in code is not a heading
        for href in LINK.findall(text):
            path, _, anchor = href.partition("#")
            target = (document.parent / path) if path else document
            if (
                anchor
                and "://" not in href
                and target.suffix == ".md"
                and target.is_file()
                and anchor not in anchors(target)
            ):
                dead.append(f"{document.relative_to(ROOT)}: {href}")
    assert not dead, dead


def test_train_py_lists_every_registered_component():
    import subprocess
    import sys

    listed = subprocess.run(
        [sys.executable, "train.py", "--list"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert listed.returncode == 0, listed.stderr
    names = {line.split("(")[0].strip() for line in listed.stdout.splitlines() if line.startswith("  ")}
    for kind in components.COMPONENT_MODULES:
        assert f"{kind}:" in listed.stdout.splitlines()
        assert set(components.available(kind)) <= names, kind
    assert "  huber(*, delta: float = 1.0)  [task: regression]" in listed.stdout.splitlines()
    one = subprocess.run(
        [sys.executable, "train.py", "--list", "schedule"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert one.stdout.splitlines()[0] == "schedule:" and len(one.stdout.splitlines()) == 1 + len(
        components.available("schedule")
    )
    two = subprocess.run(
        [sys.executable, "train.py", "--list", "loss", "metrics"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert [line for line in two.stdout.splitlines() if not line.startswith("  ")] == ["loss:", "metrics:"], two.stderr
    bad = subprocess.run(
        [sys.executable, "train.py", "--list", "loss", "lossses"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert bad.stdout == ""
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        f"error: --list lossses: unknown kind. Did you mean 'loss'? Kinds: {', '.join(components.LISTED)}"
    ]


def test_list_layers_shows_every_layer_class_with_its_arguments_and_what_it_is():
    """Derived from model/modules, nothing typed by hand: each layer class there, its constructor's arguments, and
    a description from its docstring (or its file's)."""
    import inspect

    from training.config.components import layers

    listed = subprocess.run(
        [sys.executable, "train.py", "--list", "layers"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    for name, cls in layers().items():
        row = next(i for i, line in enumerate(lines) if line.startswith(f"  {name}("))
        for argument in list(inspect.signature(cls.__init__).parameters)[1:]:
            if argument not in ("args", "kwargs"):
                assert argument in lines[row], (name, argument)
        assert lines[row + 1].startswith("      ") and "(no docstring)" not in lines[row + 1], name
    assert "causal=False" in lines[next(i for i, line in enumerate(lines) if "TransformerBlock(" in line) + 1]


NAMED_PATH = re.compile(
    r"(?<![\w./-])((?:training|data_loader|model|inference|tests|benchmarks|docs|configs)/[\w/.-]*?\.(?:py|md|json|ipynb))(?!\w)"
)
NAMED_MODULE = re.compile(r"(?<![\w./-])((?:training|data_loader|inference|utils)(?:\.[A-Za-z_]\w*)+)")
# data_loader.<split>.* in prose is a config key, not a module
CONFIG_SECTIONS = {"train", "validation", "test", "name", "args"}


def names_a_thing_that_exists(dotted: str) -> bool:
    """``training.run.checkpoint.CheckpointError``: the longest prefix that is a module, then attributes of it."""
    import importlib

    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        where = ROOT / module.replace(".", "/")
        if where.with_suffix(".py").is_file() or (where / "__init__.py").is_file():
            if parts[cut:] in ([], ["py"]):
                return True
            found = importlib.import_module(module)
            for attribute in parts[cut:]:
                if not hasattr(found, attribute):
                    return False
                found = getattr(found, attribute)
            return True
    return False


def test_every_file_and_module_the_code_and_docs_name_exists():
    """A docstring, comment or doc that names `training/run/folder.py` or ``training.run.checkpoint.read`` names
    something that exists: files move and names change, and the words that pointed at them go stale silently."""
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    if not tracked:
        pytest.skip("not a git checkout")
    stale = []
    for name in tracked:
        path = ROOT / name
        if (
            not name.endswith((".py", ".md", ".ipynb"))
            or not path.is_file()
            or name == "tests/end_to_end/test_new_project.py"
        ):
            continue  # the new-project test names files it makes up
        text = path.read_text(errors="replace")
        for found in NAMED_PATH.findall(text):
            # a test or a benchmark named for a developer may stay behind in a project made with new_project.py
            if not (ROOT / found).exists() and not found.startswith(("tests/", "benchmarks/")):
                stale.append(f"{name}: {found}")
        other_utils = re.search(r"^\s*from \w+ import utils\b", text, flags=re.M)  # e.g. tf2onnx's
        probes = "find_spec(" in text  # a seam that looks for an optional part a project may have left out
        for found in NAMED_MODULE.findall(text):
            parts = found.split(".")
            if (parts[0] == "data_loader" and parts[1] in CONFIG_SECTIONS) or (parts[0] == "utils" and other_utils):
                continue
            if not names_a_thing_that_exists(found) and not probes:
                stale.append(f"{name}: {found}")
    assert not stale, stale
