"""Start a project of your own from this template:

    python new_project.py ../my_project [--name my_project] [--samples mnist,shakespeare_char,...]

The new folder gets the library (`model/`, `training/`, `data_loader/`), the pipeline (`train.py`, `test.py`,
`sample.py`, `sweep.py`, `utils.py`), the export (`inference/`), the tests of all of them, and of the samples only the
chosen ones: their configs, data and end-to-end tests. The first sample's config becomes `config.json`, the one
`make train` trains. Benchmarks, run folders, exports, virtual environments, caches and notes stay behind; the README
keeps what the new project needs. With git installed the folder starts as a repository with one commit.

Standard library only: it runs before anything is installed.
"""
from __future__ import annotations

import argparse
import ast
import difflib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

TEMPLATE = Path(__file__).resolve().parent


class Sample(NamedTuple):
    config: str              # where the template keeps its config
    data: tuple[str, ...]    # the folders under data/ it trains on
    tests: tuple[str, ...]   # its end-to-end tests


# In the order the template lists them; a test file two samples share loses the test functions named after the one
# left out.
SAMPLES = {
    "mnist": Sample("config.json", ("mnist",), ()),
    "shakespeare_char": Sample("configs/shakespeare_char.json", ("tinyshakespeare",),
                               ("tests/test_samples_language_model.py",)),
    "tabular_regression": Sample("configs/tabular_regression.json", ("regression",),
                                 ("tests/test_samples_regression_segmentation.py",)),
    "mnist_segmentation": Sample("configs/mnist_segmentation.json", ("mnist",),
                                 ("tests/test_samples_regression_segmentation.py",)),
    # CIFAR-10 is downloaded on first use (download: true), never shipped
    "cifar10_resnet": Sample("configs/cifar10_resnet.json", (), ("tests/test_samples_cifar.py",)),
}

# Never copied, wherever they are: repositories, environments, caches, tracker output.
SKIP_ANYWHERE = {".git", ".venv", "venv", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache",
                 ".ipynb_checkpoints", "wandb", ".DS_Store"}
# The template's own measurements and tooling, outputs of runs, and what this script writes itself.
SKIP_TOP = {"benchmarks", "saved", "exports", "configs", "data", "config.json", "README.md", "new_project.py"}
SKIP_FILES = {"tests/test_new_project.py", *(test for sample in SAMPLES.values() for test in sample.tests)}
TEXT_SUFFIXES = {".py", ".md", ".json", ".txt", ".ini", ".cfg", ".toml", ".yaml", ".yml", ""}
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")


class ProjectError(Exception):
    """A bad argument or a target that cannot be written: reported as one line."""


def is_notes(name: str) -> bool:
    return Path(name).stem.lower() in ("notes", "note")


def skipped(relative: Path, is_dir: bool) -> bool:
    parts = relative.parts
    if parts[-1] in SKIP_ANYWHERE or parts[-1].endswith((".pyc", ".egg-info")):
        return True
    if len(parts) == 1:
        return parts[0] in SKIP_TOP or is_notes(parts[0])
    # inference/<name>/ folders are exports, not code
    return relative.as_posix() in SKIP_FILES or (is_dir and parts[0] == "inference" and len(parts) == 2)


def left_out_packages(template: Path) -> set[str]:
    """The template's Python packages a project leaves out (benchmarks/): its tests must not import them."""
    return {name for name in SKIP_TOP if (template / name).is_dir() and any((template / name).glob("*.py"))}


def copy_library(template: Path, target: Path) -> None:
    packages = left_out_packages(template)
    for folder, dirs, files in os.walk(template):
        here = Path(folder).relative_to(template)
        dirs[:] = sorted(d for d in dirs if not skipped(here / d, True))
        (target / here).mkdir(exist_ok=True)
        for name in sorted(files):
            if skipped(here / name, False):
                continue
            if here.parts[:1] == ("tests",) and name.endswith(".py"):  # without the tests of what stays behind
                source = drop_tests((Path(folder) / name).read_text(), [], packages)
                if source is not None:
                    (target / here / name).write_text(source)
                continue
            shutil.copy2(Path(folder) / name, target / here / name, follow_symlinks=False)


def config_places(samples: list[str]) -> dict[str, str]:
    """Where each chosen sample's config goes: the first is config.json (what `make train` trains), the others
    configs/<sample>.json."""
    return {name: "config.json" if i == 0 else f"configs/{name}.json" for i, name in enumerate(samples)}


def moved_references(text: str, old: str, new: str) -> str:
    """Paths to a config that moved, as the docs and tests spell them."""
    old_parts = " / ".join(f'"{part}"' for part in Path(old).parts)
    new_parts = " / ".join(f'"{part}"' for part in Path(new).parts)
    return text.replace(f"`{old}`", f"`{new}`").replace(old_parts, new_parts)


def imported(node: ast.AST) -> set[str]:
    """The top-level packages imported anywhere inside `node`."""
    names = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Import):
            names |= {a.name.split(".")[0] for a in n.names}
        elif isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
            names.add(n.module.split(".")[0])
    return names


def drop_tests(source: str, fragments: list[str], packages: set[str] = frozenset()) -> str | None:
    """`source` without its top-level functions whose names hold one of `fragments` or that import one of
    `packages`, and without the imports only they used; None when the module itself imports one of `packages`."""
    if not fragments and not packages:
        return source
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    cut = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and (any(f in node.name for f in fragments) or imported(node) & packages):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            cut.update(range(first - 1, node.end_lineno))
        elif not isinstance(node, (ast.FunctionDef, ast.ClassDef)) and imported(node) & packages:
            return None
    if not cut:
        return source
    kept = [line for i, line in enumerate(lines) if i not in cut]
    source = re.sub(r"\n{4,}", "\n\n\n", "".join(kept)).rstrip("\n") + "\n"
    tree = ast.parse(source)
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    lines = source.splitlines(keepends=True)
    for node in reversed(tree.body):
        if isinstance(node, (ast.Import, ast.ImportFrom)) and getattr(node, "module", "") != "__future__":
            names = [a for a in node.names if (a.asname or a.name).split(".")[0] in used]
            if len(names) == len(node.names):
                continue
            start, end = node.lineno - 1, node.end_lineno
            if not names:
                lines[start:end] = []
            elif isinstance(node, ast.ImportFrom):
                listed = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in names)
                lines[start:end] = [f"from {'.' * node.level}{node.module or ''} import {listed}\n"]
    return "".join(lines)


def add_samples(template: Path, target: Path, samples: list[str], name: str) -> None:
    places = config_places(samples)
    for sample, place in places.items():
        text = (template / SAMPLES[sample].config).read_text()
        (target / place).parent.mkdir(exist_ok=True)
        (target / place).write_text(text.replace('"project": "jax-template"', f'"project": "{name}"'))
    (target / "configs").mkdir(exist_ok=True)
    if not any((target / "configs").iterdir()):  # git keeps no empty folder; tests look for configs/
        (target / "configs" / "README.md").write_text(
            "# Configurations\n\nConfigurations besides `config.json` (the one `make train` trains) go here: "
            "`python train.py -c configs/<name>.json`.\n")

    kept_data = sorted({folder for s in samples for folder in SAMPLES[s].data})
    left_out = {folder for sample in SAMPLES.values() for folder in sample.data} - set(kept_data)
    (target / "data").mkdir()
    for folder in kept_data:
        shutil.copytree(template / "data" / folder, target / "data" / folder,
                        ignore=shutil.ignore_patterns(*SKIP_ANYWHERE, "*.pyc"))
    if (template / "data" / "README.md").is_file():
        (target / "data" / "README.md").write_text(data_readme((template / "data" / "README.md").read_text(),
                                                               left_out))
    (target / "saved").mkdir()
    if (template / "saved" / "README.md").is_file():
        shutil.copy2(template / "saved" / "README.md", target / "saved" / "README.md")

    for test in sorted({t for sample in SAMPLES.values() for t in sample.tests}):
        owners = [s for s, sample in SAMPLES.items() if test in sample.tests]
        if not (template / test).is_file() or not set(owners) & set(samples):
            continue
        source = drop_tests((template / test).read_text(), [s for s in owners if s not in samples],
                            left_out_packages(template))
        if source is not None:
            (target / test).write_text(source)

    for sample, place in places.items():
        old = SAMPLES[sample].config
        if old == place or not old.startswith("configs/"):  # "config.json" in the docs means whichever is first
            continue
        for path, text in text_files(target):
            new = moved_references(text, old, place)
            by_name = '(ROOT / "configs" / f"{name}.json")'  # a test that finds a sample's config by its name
            if f'"{sample}"' in new and by_name in new:
                others = [s for s in samples if s != sample and f'"{s}"' in new]
                new = new.replace(by_name, f'(ROOT / ("{place}" if name == "{sample}" else f"configs/{{name}}.json"))'
                                  if others else f'(ROOT / "{place}")')
            if new != text:
                path.write_text(new)

    gitignore = target / ".gitignore"
    if gitignore.is_file():
        lines = gitignore.read_text().splitlines(keepends=True)
        gitignore.write_text("".join(line for line in lines if not any(
            line.strip() == f"!/data/{folder}/" for folder in left_out)))


def text_files(root: Path):
    """(path, text) of the project's text files (data sets excluded by size)."""
    for path in sorted(root.rglob("*")):
        if (path.is_file() and not path.is_symlink() and path.suffix in TEXT_SUFFIXES and ".git" not in
                path.relative_to(root).parts and path.stat().st_size < 2**20):
            try:
                yield path, path.read_text()
            except UnicodeDecodeError:
                continue


def data_readme(text: str, left_out: set[str]) -> str:
    """data/README.md without the paragraphs (and the tables after them) about data left out."""
    blocks, owner = [], None
    for block in re.split(r"\n\s*\n", text.strip()):
        if not block.lstrip().startswith("|"):
            owner = next((f for f in left_out if f"`{f}/" in block), None)
        if owner is None:
            blocks.append(block)
    return "\n\n".join(blocks) + "\n"


# --------------------------------------------------------------------------------------------------------- README
def sections(readme: str) -> dict[str, str]:
    """The template README's level-2 sections by heading."""
    found, heading = {}, None
    for line in readme.splitlines():
        if line.startswith("## "):
            heading = line[3:].strip()
            found[heading] = ""
        elif heading is not None:
            found[heading] += line + "\n"
    return {k: v.strip("\n") for k, v in found.items()}


def section(found: dict[str, str], prefix: str, notes: list[str]) -> str | None:
    heading = next((h for h in found if h.startswith(prefix)), None)
    if heading is None:
        notes.append(f"the template's README.md has no '## {prefix}...' section; the new README leaves it out")
        return None
    return f"## {heading}\n\n{found[heading]}"


def table_rows(text: str) -> list[list[str]]:
    return [[cell.strip() for cell in line.strip().strip("|").split(" | ")]
            for line in text.splitlines() if line.startswith("| ") and not line.startswith("| ---")]


def listed(words: list[str]) -> str:
    return ", ".join(words[:-1]) + " and " + words[-1] if len(words) > 1 else words[0]


def readme(template: Path, target: Path, name: str, samples: list[str], notes: list[str]) -> str:
    path = template / "README.md"
    found = sections(path.read_text()) if path.is_file() else {}
    places = config_places(samples)
    first = samples[0]
    config_name = re.search(r'"name":\s*"([^"]+)"', (target / "config.json").read_text())
    run = f"saved/{config_name.group(1) if config_name else '<name>'}/<run_id>"
    out = [f"# {name}\n",
           "A JAX training project: layers, losses, metrics, optimizers and schedules written as plain functions over "
           "pytrees (each tested against an independent reference), a JSON-driven training loop with checkpoints "
           "that resume exactly, exports to TFLite and ONNX checked numerically, and the "
           f"{listed([f'`{s}`' for s in samples])} sample{'s' if len(samples) > 1 else ''}.\n",
           "## Set up\n",
           "```bash\n"
           f"make train   # creates .venv, installs requirements.txt, trains the {first} sample "
           "(python train.py -c config.json)\n"
           "make test    # installs requirements-dev.txt (test-only references), runs the tests\n"
           "```\n",
           "`make test-fast` leaves out the end-to-end runs (marked `slow`). Without `make`: `python3 -m venv .venv && "
           ".venv/bin/pip install -r requirements-dev.txt`, then `.venv/bin/python train.py -c config.json` and "
           "`.venv/bin/python -m pytest -q -n 2 tests`.\n",
           f"A run goes to `{run}/`. Evaluate it with `python test.py -r {run}`, export it with "
           f"`python inference/convert_tflite.py -r {run} --name my_model`, search hyperparameters with "
           "`python sweep.py -c config.json --grid KEY.PATH=[...] --sample KEY.PATH=loguniform:LOW:HIGH --trials N`.\n"]

    rows = {}
    samples_section = found.get("Samples", "")
    for row in table_rows(samples_section):
        for sample in samples:
            if len(row) >= 3 and f"-c {SAMPLES[sample].config}`" in row[2]:
                rows[sample] = row
    out.append("## Samples\n")
    out.append("| sample | task | data | command |\n| --- | --- | --- | --- |")
    for sample in samples:
        task, data = rows.get(sample, ["", ""])[:2]
        out.append(f"| {sample} | {task} | {data} | `python train.py -c {places[sample]}` |")
    out.append("")

    folders = section(found, "Folders", notes)
    if folders is not None:
        generated = {
            "config.json": f"the {first} sample's configuration (`make train` trains it); every component is "
                           '`{"name": ..., "args": {...}}`',
            "configs/": ("the other samples: " + ", ".join(f"`{Path(p).name}`" for p in list(places.values())[1:])
                         if len(samples) > 1 else "more configurations: `python train.py -c configs/<name>.json`"),
            "data/": "the samples' data, shipped so they train offline: "
                     + ", ".join(f"`{f}/`" for f in sorted({f for s in samples for f in SAMPLES[s].data}))
                     + " (checksums in `data/README.md`)",
        }
        lines = []
        for line in folders.splitlines():
            cells = table_rows(line)
            if not cells or line.startswith("| path"):
                lines.append(line)
                continue
            path = re.match(r"`([^`]+)`", cells[0][0])
            if path is None or not (target / path.group(1)).exists():
                continue
            if path.group(1) in generated:
                line = f"| `{path.group(1)}` | {generated[path.group(1)]} |"
            lines.append(line)
        out.append("\n".join(lines) + "\n")
    for prefix in ("Adding a", "Your own task"):
        text = section(found, prefix, notes)
        if text is not None:
            out.append(text + "\n")
    text = "\n".join(out)
    anchors = {re.sub(r"[^a-z0-9 _-]", "", h.lower()).replace(" ", "-")
               for h in re.findall(r"^#+ (.+)$", text, flags=re.M)}
    # a link into a section the new README does not have keeps its words
    return re.sub(r"\[([^\]]+)\]\(#([^)]+)\)", lambda m: m.group(0) if m.group(2) in anchors else m.group(1), text)


# ------------------------------------------------------------------------------------------------------------ git
def git_commit(target: Path, notes: list[str]) -> bool:
    git = shutil.which("git")
    if git is None:
        notes.append("git is not installed: the folder is not a repository yet")
        return False

    def run(*args):
        return subprocess.run([git, *args], cwd=target, capture_output=True, text=True)

    identity = []
    if not run("config", "user.email").stdout.strip():  # a fresh machine: commit anyway, say how to fix it
        identity = ["-c", "user.name=new_project.py", "-c", "user.email=new_project@localhost"]
        notes.append("git has no user.email: the first commit's author is a placeholder "
                     "(git commit --amend --reset-author after setting it)")
    for args in (["init", "-q"], ["add", "-A"],
                 [*identity, "commit", "-q", "-m", "New project from the JAX training template"]):
        result = run(*args)
        if result.returncode != 0:
            lines = (result.stderr or result.stdout).strip().splitlines() or ["no message"]
            notes.append(f"git {' '.join(args[-3:] if args[0] == '-c' else args)} failed: {lines[-1]}")
            return False
    return True


def dangling_references(target: Path) -> list[str]:
    """Config paths that a copied file names but the project does not have."""
    found = []
    for path, text in text_files(target):
        for match in re.finditer(r'configs/([\w.-]+\.json)|"configs" / "([\w.-]+\.json)"', text):
            config = match.group(1) or match.group(2)
            if not (target / "configs" / config).is_file():
                found.append(f"{path.relative_to(target)} names configs/{config}, which the project does not have")
    return found


# ---------------------------------------------------------------------------------------------------------- main
def create(target: Path, name: str, samples: list[str], template: Path = TEMPLATE) -> list[str]:
    """Writes the project; returns notes for the user. Built in a temporary folder beside the target and renamed at
    the end, so a failure leaves nothing behind."""
    target = target.resolve()
    if target == template or template in target.parents:
        raise ProjectError(f"{target}: inside the template; choose a folder outside it (e.g. ../{name})")
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ProjectError(f"{target}: already exists and is not an empty folder")
    for sample in samples:
        config = template / SAMPLES[sample].config
        if not config.is_file():
            raise ProjectError(f"--samples {sample}: the template has no {SAMPLES[sample].config}")
    target.parent.mkdir(parents=True, exist_ok=True)
    notes = []
    building = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        copy_library(template, building)
        add_samples(template, building, samples, name)
        (building / "README.md").write_text(readme(template, building, name, samples, notes))
        notes += dangling_references(building)
        if target.exists():
            target.rmdir()
        building.rename(target)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    git_commit(target, notes)
    return notes


def parse_samples(text: str) -> list[str]:
    samples = [s.strip() for s in text.split(",") if s.strip()]
    if not samples:
        raise ProjectError(f"--samples: name at least one of {', '.join(SAMPLES)}")
    for sample in samples:
        if sample not in SAMPLES:
            close = difflib.get_close_matches(sample, SAMPLES, n=1)
            hint = f". Did you mean '{close[0]}'?" if close else ""
            raise ProjectError(f"--samples: unknown sample '{sample}'; available: {', '.join(SAMPLES)}{hint}")
    if len(set(samples)) != len(samples):
        raise ProjectError(f"--samples: a sample is named twice in '{text}'")
    return samples


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", help="the new project's folder (must not exist, or be empty)")
    parser.add_argument("--name", help="the project's name (default: the folder's name)")
    parser.add_argument("--samples", default=",".join(SAMPLES),
                        help=f"comma-separated samples to keep; the first one is config.json (default: all: "
                             f"{','.join(SAMPLES)})")
    args = parser.parse_args(argv)
    target = Path(args.target)
    try:
        name = args.name or target.resolve().name
        if not NAME.fullmatch(name):
            raise ProjectError(f"--name {name!r}: expected letters, digits, '_', '-' or '.' (up to 100, starting "
                               f"with a letter or digit)")
        samples = parse_samples(args.samples)
        notes = create(target, name, samples)
    except ProjectError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"error: {error.filename or target}: {error.strerror or error}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    configs = ", ".join(f"{s} ({p})" for s, p in config_places(samples).items())
    print(f"wrote {target}: {configs}\nnext: cd {target} && make train")
    return 0


if __name__ == "__main__":
    sys.exit(main())
