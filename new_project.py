"""Start a project of your own from this template:

    python new_project.py ../my_project [--name my_project] [--samples mnist,shakespeare_char,...]
                                        [--without sweeps,tracking,plots,kernels,processes,tflite,buckets]

A copy of the template, less what the tables below leave out: the samples not named (their configs, data and
end-to-end tests), the optional features named in --without (each a folder, its tests, its entry script and its
requirements file, plus the lines elsewhere marked `[feature: <name>]` and its sections of the sample configs), and
what is the template's own (benchmarks, run folders, exports, caches, this script). The first sample's config becomes
`config.json`, the one `make train` trains. With git installed the folder starts as a repository with one commit, and
`.template-commit` names the template commit it came from (docs/new_project.md: taking the template's later fixes).

Standard library only: it runs before anything is installed.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

from files.writes import remove_folder, remove_stale_folders, temporary_folder
from signals import stops

TEMPLATE = Path(__file__).resolve().parent


class Sample(NamedTuple):
    config: str  # where the template keeps its config
    data: tuple[str, ...]  # the folders under data/ it trains on
    tests: tuple[str, ...]  # its end-to-end tests


SAMPLES = {  # in the order the template lists them
    "mnist": Sample("config.json", ("mnist",), ()),
    "shakespeare_char": Sample(
        "configs/shakespeare_char.json", ("tinyshakespeare",), ("tests/end_to_end/test_samples_language_model.py",)
    ),
    "tabular_regression": Sample(
        "configs/tabular_regression.json", ("regression",), ("tests/end_to_end/test_samples_regression.py",)
    ),
    "mnist_segmentation": Sample(
        "configs/mnist_segmentation.json", ("mnist",), ("tests/end_to_end/test_samples_segmentation.py",)
    ),
    # CIFAR-10 is downloaded on first use (download: true), never shipped
    "cifar10_resnet": Sample("configs/cifar10_resnet.json", (), ("tests/end_to_end/test_samples_cifar.py",)),
    "mnist_multitask": Sample(
        "configs/mnist_multitask.json", ("mnist",), ("tests/end_to_end/test_samples_multitask.py",)
    ),
    "churn": Sample("configs/churn.json", ("churn",), ("tests/end_to_end/test_samples_churn.py",)),
}

# Each optional feature: the paths it alone owns. Everything else that names it is one line (or, in the docs, one
# block) marked `[feature: <name>]`, which a project without it drops: `grep -rn "\[feature: sweeps\]" .` lists them.
FEATURES = {
    "sweeps": (
        "sweep.py",
        "training/sweeps",
        "tests/end_to_end/test_sweep.py",
        "requirements-sweeps-postgres.txt",
        "docs/sweeps.md",
    ),
    "tracking": ("training/tracking", "tests/training/tracking"),
    "plots": ("training/plots", "tests/training/plots"),
    "kernels": ("model/kernels", "tests/model/kernels"),
    # several processes: jax.distributed, its watchdog, SLURM
    "processes": ("training/processes", "tests/training/processes"),
    # the TFLite route: without it the export writes ONNX (by jax2onnx) and the JAX artifact
    "tflite": ("inference/formats/tflite", "tests/inference/tflite", "requirements-litert.txt"),
    # trainer.save_dir in an S3 or GCS bucket (fsspec, s3fs, gcsfs), and runs read from their URL
    "buckets": ("training/buckets", "tests/training/buckets", "requirements-buckets.txt", "docs/buckets.md"),
}
# `[feature: plots, sweeps]`: a line both need, dropped only when both are left out
MARK = re.compile(r"\[feature: (\w+(?:, \w+)*)\]( begin| end)?")
# The top-level config sections a feature adds (its folder's config.py: SECTIONS): a project without it has them in
# no sample config, and its train.py refuses them as unknown sections.
SECTIONS = {"tracking": ("wandb", "tensorboard")}

# Never copied: the template's own measurements and tooling, outputs of runs, what the samples place themselves,
# and, wherever they are, repositories, environments, caches and tracker output.
TEMPLATE_ONLY = {
    "benchmarks",
    "tests/end_to_end/test_benchmarks.py",
    "tests/end_to_end/test_accelerator_run.py",
    "new_project.py",
    "tests/end_to_end/test_new_project.py",
    "docs/new_project.md",
    "saved",
    "exports",
    "configs",
    "data",
    "config.json",
}
SKIP_ANYWHERE = {".git", ".venv", "venv", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache",
                 ".import_linter_cache", ".ipynb_checkpoints", "wandb", ".DS_Store"}  # fmt: skip
TEXT_SUFFIXES = {".py", ".md", ".json", ".txt", ".ini", ".cfg", ".toml", ".yaml", ".yml", ""}
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")
TABLE_KEY = re.compile(r"\|\s*`([^`]+)`\s*\|")
TEMPLATE_COMMIT = ".template-commit"  # the template commit a project was made from: later fixes start after it


class ProjectError(Exception):
    """A bad argument or a target that cannot be written: reported as one line."""


def left_out(samples: list[str], without: list[str]) -> set[str]:
    """The template's paths (files or folders, relative) the project does not get."""
    paths = set(TEMPLATE_ONLY) | {p for f in without for p in FEATURES[f]}
    return paths | {t for s, sample in SAMPLES.items() if s not in samples for t in sample.tests}


def copy_tree(template: Path, target: Path, leave_out: set[str]) -> None:
    for folder, dirs, files in os.walk(template):
        here = Path(folder).relative_to(template)

        def keep(name: str) -> bool:
            # inference/<name>/ folders without an __init__.py are exports (an older default place), not code
            export = here.parts == ("inference",) and (Path(folder) / name).is_dir()
            return not (
                name in SKIP_ANYWHERE
                or name.endswith((".pyc", ".egg-info"))
                or Path(name).stem.lower() in ("notes", "note")
                or (here / name).as_posix() in leave_out
                or export
                and not (Path(folder) / name / "__init__.py").exists()
            )

        dirs[:] = sorted(filter(keep, dirs))
        if here.parts:  # not the top, made already: a stop's undo may have removed it (files.writes.remove_folder)
            (target / here).mkdir()
        for name in filter(keep, files):
            shutil.copy2(Path(folder) / name, target / here / name, follow_symlinks=False)


def text_files(root: Path):
    """(path, text) of the project's text files (data sets excluded by size)."""
    for path in sorted(root.rglob("*")):
        if path.is_symlink() or not path.is_file() or path.suffix not in TEXT_SUFFIXES:
            continue
        if path.stat().st_size < 2**20 and ".git" not in path.relative_to(root).parts:
            try:
                yield path, path.read_text()
            except UnicodeDecodeError:
                continue


def without_features(text: str, without: list[str]) -> str:
    """`text` less its lines marked `[feature: <name>]` for a feature left out, and the blocks between
    `[feature: <name>] begin` and `[feature: <name>] end`; a mark naming several features goes when all of them do."""
    kept, dropping = [], None
    for line in text.splitlines(keepends=True):
        mark = MARK.search(line)
        if dropping:
            dropping = None if mark and mark.group(1) == dropping and mark.group(2) == " end" else dropping
        elif mark and all(name in without for name in mark.group(1).split(", ")):
            dropping = mark.group(1) if mark.group(2) == " begin" else None
        else:
            kept.append(line)
    return "".join(kept)


def config_places(samples: list[str]) -> dict[str, str]:
    """The first chosen sample's config is config.json (what `make train` trains), the others configs/<sample>.json."""
    return {name: "config.json" if i == 0 else f"configs/{name}.json" for i, name in enumerate(samples)}


def moved(text: str, places: dict[str, str]) -> str:
    """Paths to a sample config that moved, as the docs (configs/<name>.json) and tests (`"configs" / "x.json"`) name
    them."""
    for sample, place in places.items():
        old = SAMPLES[sample].config
        if old != place and old.startswith("configs/"):
            quoted = lambda path: " / ".join(f'"{part}"' for part in path.split("/"))  # noqa: E731
            text = text.replace(f"`{old}`", f"`{place}`").replace(f"-c {old}", f"-c {place}")
            text = text.replace(quoted(old), quoted(place))
    return text


def without_sections(text: str, sections) -> str:
    """A config's JSON text less its top-level `sections`, the rest as it was written (each top-level key starts a
    line of its own at two spaces in the samples; any other layout is written anew)."""
    config = json.loads(text)
    if not set(sections) & set(config):
        return text
    kept, dropping = [], False
    for line in text.splitlines(keepends=True):
        top = re.match(r'  "([^"]+)":', line)
        dropping = bool(top) and top[1] in sections or dropping and not top and line.strip() != "}"
        kept += [] if dropping else [line]
    new = re.sub(r",(\s*)\}\s*$", r"\1}\n", "".join(kept))  # the last section kept ends the object
    expected = {key: value for key, value in config.items() if key not in sections}
    try:
        return new if json.loads(new) == expected else json.dumps(expected, indent=2) + "\n"
    except ValueError:
        return json.dumps(expected, indent=2) + "\n"


def add_samples(template: Path, target: Path, samples: list[str], name: str, without=()) -> None:
    dropped_sections = [section for feature in without for section in SECTIONS.get(feature, ())]
    for sample, place in config_places(samples).items():
        (target / place).parent.mkdir(exist_ok=True)
        text = without_sections((template / SAMPLES[sample].config).read_text(), dropped_sections)
        (target / place).write_text(text.replace('"project": "jax-template"', f'"project": "{name}"'))
    (target / "configs").mkdir(exist_ok=True)
    if not any((target / "configs").iterdir()):  # git keeps no empty folder; tests look for configs/
        (target / "configs" / "README.md").write_text(
            "# Configurations\n\nConfigurations besides `config.json` (the one `make train` trains) go here: "
            "`python train.py -c configs/<name>.json`.\n"
        )
    kept = {folder for s in samples for folder in SAMPLES[s].data}
    dropped = {folder for sample in SAMPLES.values() for folder in sample.data} - kept
    (target / "data").mkdir()
    for folder in sorted(kept):
        ignore = shutil.ignore_patterns(*SKIP_ANYWHERE, "*.pyc")
        shutil.copytree(template / "data" / folder, target / "data" / folder, ignore=ignore)
    if (template / "data" / "README.md").is_file():  # without the paragraphs (and their tables) about data left out
        blocks, owner = [], None
        for block in re.split(r"\n\s*\n", (template / "data" / "README.md").read_text().strip()):
            if not block.lstrip().startswith("|"):
                owner = next((f for f in dropped if f"`{f}/" in block), None)
            blocks += [block] if owner is None else []
        (target / "data" / "README.md").write_text("\n\n".join(blocks) + "\n")
    (target / "saved").mkdir()
    if (template / "saved" / "README.md").is_file():
        shutil.copy2(template / "saved" / "README.md", target / "saved" / "README.md")
    if (target / ".gitignore").is_file():
        unignored = {f"!/data/{folder}/" for folder in dropped}
        lines = (target / ".gitignore").read_text().splitlines(keepends=True)
        (target / ".gitignore").write_text("".join(line for line in lines if line.strip() not in unignored))


def fit_docs(target: Path, name: str, samples: list[str]) -> None:
    """The README's title is the project's name, and its table rows of samples left out, or of paths the project
    does not have, go; in README.md and docs/, a link to a file the project does not have becomes plain text (an
    image, or a list item that starts with such a link, is dropped whole)."""
    lines = ((target / "README.md").read_text() if (target / "README.md").is_file() else f"# {name}\n").splitlines()
    if lines and lines[0].startswith("# "):
        lines[0] = f"# {name}"

    def gone(line: str) -> bool:  # a table row of a sample left out, or of a path (`a/b`, `x.py`) not here
        key = TABLE_KEY.match(line)
        key = key and key[1]
        path = key and re.fullmatch(r"[\w.-]+(/[\w.-]*)*", key) and re.search(r"[/.]", key)
        return bool(key) and (key in SAMPLES and key not in samples or bool(path) and not (target / key).exists())

    (target / "README.md").write_text("\n".join(line for line in lines if not gone(line)) + "\n")
    for doc in [target / "README.md", *sorted((target / "docs").glob("*.md"))]:

        def dead(href: str) -> bool:
            path = href.split("#")[0]
            return (
                bool(path) and "://" not in href and not href.startswith("mailto:") and not (doc.parent / path).exists()
            )

        out, dropping = [], False
        for line in doc.read_text().splitlines():
            if dropping and line.startswith("  ") and line.strip():
                continue  # the rest of a dropped list item
            links = [m for m in LINK.finditer(line) if dead(m[3])]
            dropping = bool(links) and (
                any(m[1] for m in links) or bool(re.match(r"\s*[-*] $", line[: links[0].start()]))
            )
            if not dropping:
                out.append(LINK.sub(lambda m: m[2] if not m[1] and dead(m[3]) else m[0], line))
        doc.write_text("\n".join(out) + "\n")


def git(target: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=target, capture_output=True, text=True)


def record_template(template: Path, target: Path, notes: list[str]) -> None:
    """Writes the template's commit to TEMPLATE_COMMIT, the start of the range of template commits the project can
    take later (docs/new_project.md); a template that is no repository, or has changes not committed, is a note."""
    head = git(template, "rev-parse", "--verify", "-q", "HEAD")
    if head.returncode != 0 or not re.fullmatch(r"[0-9a-f]{40,64}", head.stdout.strip()):
        notes.append(f"{template} is not a git repository with a commit: no {TEMPLATE_COMMIT} to take later fixes from")
        return
    (target / TEMPLATE_COMMIT).write_text(head.stdout.strip() + "\n")
    if git(template, "status", "--porcelain", "--untracked-files=no").stdout.strip():
        notes.append(f"git status: the template has changes not committed; {TEMPLATE_COMMIT} names "
                     f"{head.stdout.strip()[:12]}, the commit they were made on; a later update takes only committed "
                     "fixes")  # fmt: skip


def git_commit(target: Path, notes: list[str]) -> None:
    identity = []
    if not git(target, "config", "user.email").stdout.strip():  # a fresh machine: commit anyway, say how to fix it
        identity = ["-c", "user.name=new_project.py", "-c", "user.email=new_project@localhost"]
        notes.append("git has no user.email: the first commit's author is a placeholder "
                     "(git commit --amend --reset-author after setting it)")  # fmt: skip
    for args in (["init", "-q"], ["add", "-A"],
                 [*identity, "commit", "-q", "-m", "New project from the JAX training template"]):  # fmt: skip
        result = git(target, *args)
        if result.returncode != 0:
            lines = (result.stderr or result.stdout).strip().splitlines() or ["no message"]
            notes.append(f"git {' '.join(args[-3:] if args[0] == '-c' else args)} failed: {lines[-1]}")
            return


def create(target: Path, name: str, samples: list[str], without=(), template: Path = TEMPLATE) -> list[str]:
    """Writes the project; returns notes for the user. Built in a temporary folder beside the target and renamed at
    the end, so a failure, Ctrl-C or SIGTERM leaves nothing behind; what a kill -9 left (a hidden
    ``.<target>-XXXXXXXX`` folder) the next run for the same target removes (``remove_stale_folders``, under the
    folder's lock). A target that is a symbolic link is refused, never followed."""
    if target.is_symlink():  # resolved, a link (dangling or not) would have the project made wherever it points
        raise ProjectError(f"{target}: a symbolic link (to {os.readlink(target)}); give the new folder's own path")
    target, without = target.resolve(), list(without)
    if target == template or template in target.parents:
        raise ProjectError(f"{target}: inside the template; choose a folder outside it (e.g. ../{name})")
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ProjectError(f"{target}: already exists and is not an empty folder")
    for sample in samples:
        if not (template / SAMPLES[sample].config).is_file():
            raise ProjectError(f"--samples {sample}: the template has no {SAMPLES[sample].config}")
    for feature in without:
        if not any((template / path).exists() for path in FEATURES[feature]):
            raise ProjectError(f"--without {feature}: the template has none of its files ({FEATURES[feature][0]})")
    target.parent.mkdir(parents=True, exist_ok=True)
    notes = []
    hold(target.parent)
    remove_stale_folders(target, "-")  # what a killed new_project.py left
    made = {}  # the hidden folder, once made; ``undo`` removes it once, from either thread

    def undo():
        if (building := made.pop("building", None)) is not None:
            remove_folder(building)

    with stops.undone_on_stop(undo):  # a stop signal ends the command at once (stops.stop_at_once), undoing this
        try:
            with stops.finishing():  # made with a stop signal held off, so that the undo knows of it
                made["building"] = building = temporary_folder(target, "-")
            copy_tree(template, building, left_out(samples, without))
            add_samples(template, building, samples, name, without)
            for path, text in text_files(building):
                new = moved(without_features(text, without), config_places(samples))
                if new != text:
                    path.write_text(new)
            fit_docs(building, name, samples)
            for path, text in text_files(building):
                for match in re.finditer(r'configs/([\w.-]+\.json)|"configs" / "([\w.-]+\.json)"', text):
                    if not (building / "configs" / (match[1] or match[2])).is_file():
                        notes.append(f"{path.relative_to(building)} names configs/{match[1] or match[2]}, which the "
                                     "project does not have")  # fmt: skip
            if shutil.which("git"):
                record_template(template, building, notes)
                git_commit(building, notes)  # before the rename: a stop during it leaves no half-made repository
            else:
                notes.append("git is not installed: the folder is not a repository yet")
            with stops.finishing():  # a stop signal now is too late: the project is in place, and the command says so
                os.rename(building, target)  # over an empty target folder too, in one step
                made.clear()
                stops.finished()
        except BaseException:
            with stops.finishing():  # the half-made folder goes first
                undo()
            raise
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


def names(flag: str, noun: str, text: str, known, at_least_one: bool = True) -> list[str]:
    """The comma-separated names in `text`, each one of `known`, none twice."""
    chosen = [s.strip() for s in text.split(",") if s.strip()]
    if at_least_one and not chosen:
        raise ProjectError(f"{flag}: name at least one of {', '.join(known)}")
    for item in chosen:
        if item not in known:
            close = difflib.get_close_matches(item, known, n=1)
            hint = f". Did you mean '{close[0]}'?" if close else ""
            raise ProjectError(f"{flag}: unknown {noun} '{item}'; available: "
                               f"{', '.join(known)}{hint}")  # fmt: skip
    if len(set(chosen)) != len(chosen):
        raise ProjectError(f"{flag}: a {noun} is named twice in '{text}'")
    return chosen


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("target", help="the new project's folder (must not exist, or be empty)")
    parser.add_argument("--name", help="the project's name (default: the folder's name)")
    parser.add_argument("--samples", default=",".join(SAMPLES),
                        help=f"comma-separated samples to keep; the first one is config.json (default: all: "
                             f"{','.join(SAMPLES)})")  # fmt: skip
    parser.add_argument("--without", default="", help=f"comma-separated features to leave out: {','.join(FEATURES)}")
    args = parser.parse_args(argv)
    target = Path(args.target)
    try:
        name = args.name or target.resolve().name
        if not NAME.fullmatch(name):
            raise ProjectError(f"--name {name!r}: expected letters, digits, '_', '-' or '.' (up to 100, starting "
                               f"with a letter or digit)")  # fmt: skip
        samples = names("--samples", "sample", args.samples, SAMPLES)
        notes = create(target, name, samples, names("--without", "feature", args.without, FEATURES, False))
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

    sys.exit(command(stops.at_once(main)))  # Ctrl-C or SIGTERM: the half-made folder removed, at once
