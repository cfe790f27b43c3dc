"""Start a project of your own from this template:

    python new_project.py ../my_project [--name my_project] [--samples mnist,shakespeare_char,...]

The new folder gets the library (`model/`, `training/`, `data_loader/`), the pipeline (`train.py`, `test.py`,
`sample.py`, `sweep.py`, `utils.py`), the export (`inference/`), the tests of all of them, and of the samples only the
chosen ones: their configs, data and end-to-end tests. The first sample's config becomes `config.json`, the one
`make train` trains. Benchmarks, run folders, exports, virtual environments, caches and notes stay behind; the README
and docs/ are copied, fitted to the samples kept. With git installed the folder starts as a repository with one commit,
and `.template-commit` names the template commit it came from (docs/new_project.md: taking the template's later fixes).

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
from pathlib import Path
from typing import NamedTuple

from training.files.writes import remove_stale_folders, temporary_folder

TEMPLATE = Path(__file__).resolve().parent


class Sample(NamedTuple):
    config: str  # where the template keeps its config
    data: tuple[str, ...]  # the folders under data/ it trains on
    tests: tuple[str, ...]  # its end-to-end tests


# In the order the template lists them; a test file two samples share loses the test functions named after the one
# left out.
SAMPLES = {
    "mnist": Sample("config.json", ("mnist",), ()),
    "shakespeare_char": Sample(
        "configs/shakespeare_char.json", ("tinyshakespeare",), ("tests/end_to_end/test_samples_language_model.py",)
    ),
    "tabular_regression": Sample(
        "configs/tabular_regression.json",
        ("regression",),
        ("tests/end_to_end/test_samples_regression_segmentation.py",),
    ),
    "mnist_segmentation": Sample(
        "configs/mnist_segmentation.json", ("mnist",), ("tests/end_to_end/test_samples_regression_segmentation.py",)
    ),
    # CIFAR-10 is downloaded on first use (download: true), never shipped
    "cifar10_resnet": Sample("configs/cifar10_resnet.json", (), ("tests/end_to_end/test_samples_cifar.py",)),
    "mnist_multitask": Sample(
        "configs/mnist_multitask.json", ("mnist",), ("tests/end_to_end/test_samples_multitask.py",)
    ),
}

# Never copied, wherever they are: repositories, environments, caches, tracker output.
SKIP_ANYWHERE = {
    ".git",
    ".venv",
    "venv",
    "__pycache__",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    ".ipynb_checkpoints",
    "wandb",
    ".DS_Store",
}
# The template's own measurements and tooling, outputs of runs, and what this script writes itself.
SKIP_TOP = {"benchmarks", "saved", "exports", "configs", "data", "config.json", "README.md", "new_project.py"}
SKIP_FILES = {"tests/end_to_end/test_new_project.py", *(test for sample in SAMPLES.values() for test in sample.tests)}
TEXT_SUFFIXES = {".py", ".md", ".json", ".txt", ".ini", ".cfg", ".toml", ".yaml", ".yml", ""}
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")


class ProjectError(Exception):
    """A bad argument or a target that cannot be written: reported as one line."""


def is_notes(name: str) -> bool:
    return Path(name).stem.lower() in ("notes", "note")


def skipped(relative: Path, is_dir: bool, template: Path = TEMPLATE) -> bool:
    parts = relative.parts
    if parts[-1] in SKIP_ANYWHERE or parts[-1].endswith((".pyc", ".egg-info")):
        return True
    if len(parts) == 1:
        return parts[0] in SKIP_TOP or is_notes(parts[0])
    # inference/<name>/ folders without an __init__.py are exports (an older default place for them), not code
    export = (
        is_dir and parts[0] == "inference" and len(parts) == 2 and not (template / relative / "__init__.py").exists()
    )
    return relative.as_posix() in SKIP_FILES or export


def left_out_packages(template: Path) -> set[str]:
    """The template's Python packages a project leaves out (benchmarks/): its tests must not import them."""
    return {name for name in SKIP_TOP if (template / name).is_dir() and any((template / name).glob("*.py"))}


def copy_library(template: Path, target: Path) -> None:
    packages = left_out_packages(template)
    for folder, dirs, files in os.walk(template):
        here = Path(folder).relative_to(template)
        dirs[:] = sorted(d for d in dirs if not skipped(here / d, True, template))
        (target / here).mkdir(exist_ok=True)
        for name in sorted(files):
            if skipped(here / name, False, template):
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
            "`python train.py -c configs/<name>.json`.\n"
        )

    kept_data = sorted({folder for s in samples for folder in SAMPLES[s].data})
    left_out = {folder for sample in SAMPLES.values() for folder in sample.data} - set(kept_data)
    (target / "data").mkdir()
    for folder in kept_data:
        shutil.copytree(
            template / "data" / folder, target / "data" / folder, ignore=shutil.ignore_patterns(*SKIP_ANYWHERE, "*.pyc")
        )
    if (template / "data" / "README.md").is_file():
        (target / "data" / "README.md").write_text(data_readme((template / "data" / "README.md").read_text(), left_out))
    (target / "saved").mkdir()
    if (template / "saved" / "README.md").is_file():
        shutil.copy2(template / "saved" / "README.md", target / "saved" / "README.md")

    for test in sorted({t for sample in SAMPLES.values() for t in sample.tests}):
        owners = [s for s, sample in SAMPLES.items() if test in sample.tests]
        if not (template / test).is_file() or not set(owners) & set(samples):
            continue
        source = drop_tests(
            (template / test).read_text(), [s for s in owners if s not in samples], left_out_packages(template)
        )
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
                new = new.replace(
                    by_name,
                    f'(ROOT / ("{place}" if name == "{sample}" else f"configs/{{name}}.json"))'
                    if others
                    else f'(ROOT / "{place}")',
                )
            if new != text:
                path.write_text(new)

    gitignore = target / ".gitignore"
    if gitignore.is_file():
        lines = gitignore.read_text().splitlines(keepends=True)
        gitignore.write_text(
            "".join(line for line in lines if not any(line.strip() == f"!/data/{folder}/" for folder in left_out))
        )


def text_files(root: Path):
    """(path, text) of the project's text files (data sets excluded by size)."""
    for path in sorted(root.rglob("*")):
        if (
            path.is_file()
            and not path.is_symlink()
            and path.suffix in TEXT_SUFFIXES
            and ".git" not in path.relative_to(root).parts
            and path.stat().st_size < 2**20
        ):
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
# Docs about the template itself, not about a project made from it.
TEMPLATE_ONLY_DOCS = ("docs/new_project.md",)
LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")
TABLE_KEY = re.compile(r"\|\s*`([^`]+)`\s*\|")


def readme(text: str, target: Path, name: str, samples: list[str]) -> str:
    """The template's README for the project: its title, and without the table rows of samples left out or of paths
    the project does not have; a kept sample's row names the config where the project has it."""
    places = config_places(samples)
    lines = text.splitlines()
    if lines and lines[0].startswith("# "):
        lines[0] = f"# {name}"
    kept = []
    for line in lines:
        key = TABLE_KEY.match(line)
        if key is not None:
            key = key.group(1)
            if key in SAMPLES:
                if key not in samples:
                    continue
                line = line.replace(f"-c {SAMPLES[key].config}`", f"-c {places[key]}`")
            elif (
                re.fullmatch(r"[\w.-]+(/[\w.-]*)*", key) and ("/" in key or "." in key) and not (target / key).exists()
            ):
                continue
        kept.append(line)
    return "\n".join(kept) + "\n"


def without_dead_links(text: str, folder: Path) -> str:
    """`text` (Markdown in `folder`) with each link to a file that does not exist as plain text; an image, or a list
    item that starts with such a link, is dropped whole."""

    def dead(href: str) -> bool:
        path = href.split("#")[0]
        return bool(path) and "://" not in href and not href.startswith("mailto:") and not (folder / path).exists()

    out, dropping = [], False
    for line in text.splitlines():
        if dropping and line.startswith("  ") and line.strip():
            continue  # the rest of a dropped list item
        dropping = False
        links = [m for m in LINK.finditer(line) if dead(m.group(3))]
        if links and (any(m.group(1) for m in links) or re.match(r"\s*[-*] $", line[: links[0].start()])):
            dropping = True
            continue
        out.append(LINK.sub(lambda m: m.group(2) if not m.group(1) and dead(m.group(3)) else m.group(0), line))
    return "\n".join(out) + "\n"


def write_docs(template: Path, target: Path, name: str, samples: list[str]) -> None:
    """README.md and docs/ as the template has them, fitted to the project (see `readme`); links that would point
    at files left behind become plain text."""
    for doc in TEMPLATE_ONLY_DOCS:
        (target / doc).unlink(missing_ok=True)
    source = template / "README.md"
    text = source.read_text() if source.is_file() else f"# {name}\n"
    (target / "README.md").write_text(readme(text, target, name, samples))
    for path in [target / "README.md", *sorted((target / "docs").glob("*.md"))]:
        path.write_text(without_dead_links(path.read_text(), path.parent))


# ------------------------------------------------------------------------------------------------------------ git
TEMPLATE_COMMIT = ".template-commit"  # the template commit a project was made from: later fixes start after it


def record_template(template: Path, target: Path, notes: list[str]) -> None:
    """Writes the template's commit to TEMPLATE_COMMIT, the start of the range of template commits the project can
    take later (docs/new_project.md: `git cherry-pick $(cat .template-commit)..template/main`). A template that is
    no repository, or has changes not committed, says so in a note."""
    git = shutil.which("git")
    if git is None:
        return  # git_commit says that git is missing
    head = subprocess.run([git, "rev-parse", "--verify", "-q", "HEAD"], cwd=template, capture_output=True, text=True)
    if head.returncode != 0 or not re.fullmatch(r"[0-9a-f]{40,64}", head.stdout.strip()):
        notes.append(f"{template} is not a git repository with a commit: no {TEMPLATE_COMMIT} to take later fixes from")
        return
    (target / TEMPLATE_COMMIT).write_text(head.stdout.strip() + "\n")
    changed = subprocess.run(
        [git, "status", "--porcelain", "--untracked-files=no"], cwd=template, capture_output=True, text=True
    )
    if changed.stdout.strip():
        notes.append(
            f"git status: the template has changes not committed; {TEMPLATE_COMMIT} names "
            f"{head.stdout.strip()[:12]}, the commit they were made on; a later update takes only committed fixes"
        )


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
        notes.append(
            "git has no user.email: the first commit's author is a placeholder "
            "(git commit --amend --reset-author after setting it)"
        )
    for args in (
        ["init", "-q"],
        ["add", "-A"],
        [*identity, "commit", "-q", "-m", "New project from the JAX training template"],
    ):
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
    hold(target.parent)
    remove_stale_folders(target, "-")  # what a killed new_project.py left
    building = temporary_folder(target, "-")
    try:
        copy_library(template, building)
        add_samples(template, building, samples, name)
        write_docs(template, building, name, samples)
        notes += dangling_references(building)
        record_template(template, building, notes)
        os.rename(building, target)  # over an empty target folder too, in one step
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    git_commit(target, notes)
    return notes


def hold(parent: Path) -> None:
    """Locks the folder the project is made in, for this process (released when it exits): two new_project.py in
    one folder take turns, so neither removes the other's temporary folder as a killed one's. A lock on the folder
    itself (flock on its descriptor), so nothing is written there for it."""
    import fcntl

    fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise ProjectError(
            f"{parent}: another new_project.py is writing a project in it now; try again once it ends"
        ) from None


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
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("target", help="the new project's folder (must not exist, or be empty)")
    parser.add_argument("--name", help="the project's name (default: the folder's name)")
    parser.add_argument(
        "--samples",
        default=",".join(SAMPLES),
        help=f"comma-separated samples to keep; the first one is config.json (default: all: {','.join(SAMPLES)})",
    )
    args = parser.parse_args(argv)
    target = Path(args.target)
    try:
        name = args.name or target.resolve().name
        if not NAME.fullmatch(name):
            raise ProjectError(
                f"--name {name!r}: expected letters, digits, '_', '-' or '.' (up to 100, starting "
                f"with a letter or digit)"
            )
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
    from training.run.cli import command  # standard library only, like this file

    sys.exit(command(main))
