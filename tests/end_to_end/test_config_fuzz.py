"""A deterministic config fuzzer: every bad config makes `train.py` exit with status 2 and exactly one `error: ` line
on stderr, with no traceback and no new file, before anything is compiled.

Cases start from a small valid config (an MLP on tiny IDX data in a temp folder) and damage it in one class of ways
each: typed garbage at every leaf, structural damage, encodings, non-finite numbers, run folder names, duplicate
keys, deep nesting, huge integers, `--set` overrides, combinations, files that are no config. Only damage the
generator knows to be invalid is asserted on: some leaf changes are legitimately valid (a run title "text"), and
those are left out by name in VALID. The bulk runs in-process (train.main, with the Trainer replaced by a sentinel so
that an accepted config stops before compiling); a few run as real processes. `pytest -s` prints the counts.
"""

from __future__ import annotations

import copy
import inspect
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

import train
import training.trainer
from tests.conftest import make_idx_dataset
from training.config.components import COMPONENT_MODULES, available, build, build_optimizer
from training.config.file import ConfigError
from training.config.validation import load_config, validate

ROOT = Path(__file__).resolve().parents[2]
SEED = 20240611
SOURCE = "cfg.json"

GARBAGE = {
    "list": [1],
    "dict": {"x": 1},
    "true": True,
    "null": None,
    "string": "text",
    "negative": -1,
    "zero": 0,
    "huge": 1e30,
    "fraction": 2.5,
}
# Every leaf of the base config, with the garbage that is a valid setting there (not asserted on).
LEAVES = {
    "name": {"string"},
    "seed": {"zero"},
    "model.name": set(),
    "model.args.num_classes": set(),
    "model.args.hidden": {"list"},
    "model.args.hidden.0": set(),
    "model.args.dropout": {"zero"},
    "loss.name": set(),
    "loss.args.label_smoothing": {"zero"},
    "metrics.0.name": set(),
    "metrics.1.name": set(),
    "metrics.1.args.k": set(),
    "optimizer.name": set(),
    "optimizer.args.b1": {"zero"},
    "optimizer.args.b2": {"zero"},
    "optimizer.args.eps": {"huge", "fraction"},
    "optimizer.args.weight_decay": {"zero", "huge", "fraction"},
    "optimizer.schedule.name": set(),
    "optimizer.schedule.args.init_value": {"zero", "huge", "fraction"},
    "optimizer.schedule.args.peak_value": {"zero", "huge", "fraction"},
    "optimizer.schedule.args.warmup_steps": {"zero"},
    "optimizer.schedule.args.decay_steps": set(),
    "optimizer.transforms.0.name": set(),
    "optimizer.transforms.0.args.max_norm": {"huge", "fraction"},
    "data_loader.train.name": set(),
    "data_loader.train.args.split": set(),
    "data_loader.train.args.batch_size": set(),
    "data_loader.train.args.shuffle": {"true"},
    "data_loader.train.args.validation_size": {"zero"},
    "data_loader.train.args.data_dir": set(),
    "data_loader.train.args.verify": {"true"},  # true is valid (it then fails on the toy files' checksums)
    "data_loader.validation.args.validation_size": set(),
    "data_loader.validation.args.batch_size": set(),
    "trainer.epochs": set(),
    "trainer.save_dir": {"string"},  # a relative folder
    "trainer.save_period": set(),
    "trainer.monitor": set(),
    "trainer.early_stop": {"zero"},
    "trainer.log_every": set(),
    "trainer.steps_per_call": set(),
    "trainer.run_id": {"string", "null"},
    "wandb.enabled": {"true"},  # [feature: tracking]
    "wandb.project": {"string", "null"},  # [feature: tracking]
    "wandb.mode": set(),  # [feature: tracking]
    "tensorboard.enabled": {"true"},  # [feature: tracking]
}
NUMERIC = [
    path
    for path in LEAVES
    if path.split(".")[-1]
    in (
        "seed",
        "num_classes",
        "0",
        "dropout",
        "label_smoothing",
        "k",
        "b1",
        "b2",
        "eps",
        "weight_decay",
        "init_value",
        "peak_value",
        "warmup_steps",
        "decay_steps",
        "max_norm",
        "batch_size",
        "validation_size",
        "epochs",
        "save_period",
        "early_stop",
        "log_every",
    )
]
SECTIONS = [
    "model",
    "loss",
    "metrics",
    "optimizer",
    "data_loader",
    "trainer",
    "wandb",  # [feature: tracking]
    "tensorboard",  # [feature: tracking]
    "model.args",
    "loss.args",
    "metrics.0",
    "metrics.1.args",
    "optimizer.args",
    "optimizer.schedule",
    "optimizer.schedule.args",
    "optimizer.transforms",
    "optimizer.transforms.0",
    "data_loader.train",
    "data_loader.train.args",
    "data_loader.validation",
]
REQUIRED = [
    "name",
    "model",
    "loss",
    "optimizer",
    "data_loader",
    "data_loader.train",
    "model.name",
    "loss.name",
    "metrics.0.name",
    "optimizer.name",
    "optimizer.schedule.name",
    "optimizer.schedule.args.decay_steps",
    "optimizer.transforms.0.name",
    "data_loader.train.name",
]
EXTRA = [
    "",
    "model",
    "model.args",
    "loss",
    "loss.args",
    "metrics.0",
    "metrics.1.args",
    "optimizer",
    "optimizer.args",
    "optimizer.schedule",
    "optimizer.schedule.args",
    "optimizer.transforms.0.args",
    "data_loader",
    "data_loader.train",
    "data_loader.train.args",
    "trainer",
    "wandb",  # [feature: tracking]
    "tensorboard",  # [feature: tracking]
]
FOLDER_NAMES = [
    "..",
    ".",
    "../../escape",
    "/abs/path",
    "a/b",
    "a\\b",
    "a\x00b",
    "x" * 300,
    "",
    "a\nb",
    "tab\there",
    "\x1b[31mred",
    " ",
    "-x",
    "--help",
    " lead",
    "trail ",
]
# Flags argparse used to let through (prefix matching) or answer with a usage block: (label, args, word in the line).
FLAGS = [
    ("--epoch 3", ["--epoch", "3"], "--epochs"),
    ("--run x", ["--run", "x"], "--run-id"),
    ("--weight w", ["--weight", "w"], "--weights"),
    ("--epochs abc", ["--epochs", "abc"], "--epochs"),
    ("--epochs 1e3", ["--epochs", "1e3"], "--epochs"),
    ("--bs 1.5", ["--bs", "1.5"], "--bs"),
    ("--lr abc", ["--lr", "abc"], "--lr"),
    ("--limit-batches x", ["--limit-batches", "x"], "--limit-batches"),
    ("--set without a value", ["--set"], "--set"),
    ("--no-such-flag", ["--no-such-flag"], "--no-such-flag"),
]


def base_config(data_dir: Path, save_dir: Path) -> dict:
    loader = {"data_dir": str(data_dir), "verify": False, "validation_size": 40}
    return {
        "name": "fuzz",
        "seed": 1,
        "model": {"name": "mlp", "args": {"num_classes": 10, "hidden": [8], "dropout": 0.0}},
        "loss": {"name": "cross_entropy", "args": {"label_smoothing": 0.1}},
        "metrics": [{"name": "accuracy"}, {"name": "top_k_accuracy", "args": {"k": 3}}],
        "optimizer": {
            "name": "adamw",
            "args": {"b1": 0.9, "b2": 0.999, "eps": 1e-8, "weight_decay": 0.05},
            "schedule": {
                "name": "warmup_cosine_decay",
                "args": {"init_value": 0.0, "peak_value": 0.004, "warmup_steps": 2, "decay_steps": 10},
            },
            "transforms": [{"name": "clip_by_global_norm", "args": {"max_norm": 1.0}}],
        },
        "data_loader": {
            "train": {"name": "mnist", "args": {**loader, "split": "train", "batch_size": 32, "shuffle": True}},
            "validation": {"name": "mnist", "args": {**loader, "split": "validation", "batch_size": 40}},
        },
        "trainer": {
            "epochs": 1,
            "save_dir": str(save_dir),
            "save_period": 1,
            "monitor": "max val/accuracy",
            "early_stop": 0,
            "log_every": 50,
            "steps_per_call": "auto",
            "run_id": "r1",
        },
        "wandb": {"enabled": False, "project": "jax-template", "mode": "offline"},  # [feature: tracking]
        "tensorboard": {"enabled": False},  # [feature: tracking]
    }


# ------------------------------------------------------------------------------------------------------ mutations
def _parent(config, dotted: str):
    *parents, last = dotted.split(".")
    node = config
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node, (int(last) if isinstance(node, list) else last)


def put(dotted: str, value):
    def mutate(config):
        node, key = _parent(config, dotted)
        node[key] = value

    return mutate


def delete(dotted: str):
    def mutate(config):
        node, key = _parent(config, dotted)
        del node[key]

    return mutate


def add_key(dotted: str):
    def mutate(config):
        node = _parent(config, f"{dotted}.x")[0] if dotted else config
        node["unexpected_key"] = 1

    return mutate


class Case:
    """One damaged config: `mutate` changes the base dict; `text` (a function of the dumped JSON) or `raw` (bytes)
    replaces the file's contents; `args` go to train.py after `-c`; `path` names a config path other than the file."""

    def __init__(self, kind: str, label: str, mutate=None, text=None, raw=None, args=(), path=None, section=None):
        self.kind, self.label, self.mutate, self.text, self.raw = kind, label, mutate, text, raw
        self.args, self.path = list(args), path
        self.section = section  # a word the one error line must contain (where the problem is)

    def write(self, folder: Path, base: dict) -> Path:
        if self.path is not None:
            return self.path(folder)
        config = copy.deepcopy(base)
        if self.mutate:
            self.mutate(config)
        text = json.dumps(config, indent=1)
        if self.text:
            text = self.text(text)
        path = folder / SOURCE
        path.write_bytes(self.raw(text) if self.raw else text.encode())
        return path


def literal(dotted: str, replacement: str):
    """The leaf at `dotted` written as raw JSON text (NaN, 1e400, a 5000-digit integer, deep brackets)."""
    marker = "@@FUZZ@@"
    return dict(mutate=put(dotted, marker), text=lambda text: text.replace(json.dumps(marker), replacement))


def generate() -> list[Case]:
    rng = random.Random(SEED)
    cases = []
    top = lambda dotted: dotted.split(".")[0]

    invalid = [(path, label) for path, valid in LEAVES.items() for label in GARBAGE if label not in valid]
    for path, label in invalid:
        cases.append(Case("leaf garbage", f"{path}={label}", put(path, GARBAGE[label]), section=top(path)))

    for path in SECTIONS:
        for label, value in (("list", [1, 2]), ("number", 7), ("string", "text"), ("bool", True), ("null", None)):
            if label == "null" and path.endswith("args"):
                continue  # "args": null means no arguments
            cases.append(Case("structure", f"{path}={label}", put(path, value), section=top(path)))
    for path in REQUIRED:
        cases.append(Case("structure", f"missing {path}", delete(path), section=top(path)))
    for path in EXTRA:
        cases.append(
            Case(
                "structure",
                f"extra key in {path or 'top level'}",
                add_key(path),
                section=top(path) if path else "unexpected_key",
            )
        )
    for value in ({"steps": 0}, {"minutes": -1}, {"keep": -1}, {"steps": 2.5}, {"x": 1}, {}, [], 5, "often"):
        cases.append(
            Case(
                "structure",
                f"checkpoint_every={json.dumps(value)}",
                put("trainer.checkpoint_every", value),
                section="checkpoint_every",
            )
        )

    noise = bytes(rng.randrange(256) for _ in range(512))

    def recoded(encoding, prefix=b""):
        return lambda text: prefix + text.replace('"fuzz"', '"caf\u00e9 \u20ac"').encode(encoding, "replace")

    for label, raw in (
        ("utf-16", recoded("utf-16")),
        ("utf-16-le", recoded("utf-16-le")),
        ("utf-16-be", recoded("utf-16-be")),
        ("utf-32", recoded("utf-32")),
        ("latin-1", recoded("latin-1")),
        ("cp1252", recoded("cp1252")),
        ("utf-8 bom + latin-1", recoded("latin-1", b"\xef\xbb\xbf")),
        ("utf-16 bom + utf-8", recoded("utf-8", b"\xff\xfe")),
        ("utf-8 bom + utf-16", recoded("utf-16-le", b"\xef\xbb\xbf")),
        ("nul byte", lambda text: text.encode().replace(b'"fuzz"', b'"fu\x00zz"')),
        ("lone surrogate", lambda text: text.encode().replace(b'"fuzz"', b'"\xed\xa0\x80"')),
        ("binary", lambda text: noise),
        ("empty", lambda text: b""),
        ("whitespace", lambda text: b" \n\t\n"),
        ("truncated", lambda text: text.encode()[: len(text) // 2]),
        ("top-level list", lambda text: b"[" + text.encode() + b"]"),
        ("top-level string", lambda text: b'"config"'),
        ("top-level null", lambda text: b"null"),
    ):
        cases.append(Case("encoding", label, raw=raw))

    for path in NUMERIC:
        for value in ("NaN", "Infinity", "-Infinity", "1e400", "-1e999"):
            cases.append(Case("non-finite", f"{path}={value}", **literal(path, value), section=top(path)))
    for path in ("optimizer.args.b1", "trainer.epochs", "seed", "model.args.hidden"):
        for value in ("NaN", "Infinity", "1e400", "[NaN]", '{"a": -Infinity}'):
            cases.append(
                Case("non-finite", f"--set {path}={value}", args=["--set", f"{path}={value}"], section=top(path))
            )

    for value in FOLDER_NAMES:
        cases.append(Case("folder names", f"run_id={value!r}", put("trainer.run_id", value), section="run_id"))
        cases.append(Case("folder names", f"name={value!r}", put("name", value), section="name"))
        if "\x00" not in value:  # a NUL cannot be passed in a command line
            cases.append(Case("folder names", f"--run-id {value!r}", args=[f"--run-id={value}"], section="run_id"))
    cases.append(Case("folder names", "run_id=5", put("trainer.run_id", 5), section="run_id"))
    cases.append(Case("folder names", "run_id=[]", put("trainer.run_id", []), section="run_id"))
    for label, save_dir in (
        ("save_dir under a file", lambda folder: str(folder / SOURCE / "saved")),
        ("save_dir is a file", lambda folder: str(folder / SOURCE)),
        ("empty save_dir", lambda folder: ""),
        ("NUL in save_dir", lambda folder: "sa\x00ved"),
    ):
        cases.append(
            Case(
                "folder names",
                label,
                section="save_dir",
                path=lambda folder, s=save_dir: _with(folder, {"trainer.save_dir": s(folder)}),
            )
        )
    cases.append(
        Case(
            "folder names",
            "run folder is a file",
            section="save_dir",
            path=lambda folder: _with(folder, {"trainer.save_dir": str(folder)}, name=SOURCE),
        )
    )

    for label, old, new in (
        ("top level", '"seed": 1', '"seed": 1, "seed": 2'),
        ("same value twice", '"seed": 1', '"seed": 1, "seed": 1'),
        ("optimizer.args", '"b1": 0.9', '"b1": 0.9, "b1": 0.8'),
        ("trainer", '"epochs": 1', '"epochs": 1, "epochs": 2'),
        ("model", '"name": "mlp"', '"name": "mlp", "name": "mlp"'),
        ("metrics.1.args", '"k": 3', '"k": 3, "k": 2'),
        ("data_loader.train.args", '"batch_size": 32', '"batch_size": 32, "batch_size": 16'),
        ("case differs only", '"seed": 1', '"seed": 1, "seed": 1, "Seed": 1'),
    ):
        cases.append(
            Case("duplicate keys", f"twice in {label}", text=lambda text, old=old, new=new: text.replace(old, new, 1))
        )
    cases.append(Case("duplicate keys", "--set value", args=["--set", 'optimizer.args={"lr": 1, "lr": 2}']))

    for depth in (40, 1000, 10_000, 100_000):
        for path in ("seed", "model.args.hidden", "optimizer.args"):
            cases.append(Case("deep nesting", f"{path} [x{depth}", **literal(path, "[" * depth + "]" * depth)))
        cases.append(
            Case("deep nesting", f"objects x{depth}", **literal("model.args", '{"a": ' * depth + "1" + "}" * depth))
        )
        cases.append(Case("deep nesting", f"--set [x{depth}", args=["--set", "seed=" + "[" * depth + "]" * depth]))

    for path in (
        "seed",
        "trainer.epochs",
        "data_loader.train.args.batch_size",
        "metrics.1.args.k",
        "model.args.num_classes",
        "model.args.hidden.0",
        "optimizer.args.b1",
        "optimizer.schedule.args.warmup_steps",
        "loss.args.label_smoothing",
    ):
        for label, digits in (
            ("10**30", "1" + "0" * 30),
            ("400 digits", "9" * 400),
            ("5000 digits", "9" * 5000),
            ("100000 digits", "1" * 100_000),
            ("-5000 digits", "-" + "9" * 5000),
        ):
            cases.append(Case("huge integers", f"{path}={label}", **literal(path, digits), section=top(path)))
    cases.append(Case("huge integers", "--set 5000 digits", args=["--set", "seed=" + "9" * 5000], section="seed"))

    for path, label in rng.sample(invalid, 40):
        cases.append(
            Case(
                "overrides",
                f"--set {path}={label}",
                args=["--set", f"{path}={json.dumps(GARBAGE[label])}"],
                section=top(path),
            )
        )
    for label, override in (
        ("a value is no section", "seed.x=1"),
        ("no such list index", "metrics.9.name=x"),
        ("no '='", "seed"),
        ("section replaced", "trainer=5"),
        ("empty key", "=3"),
        ("control character in key", "see\nd=1"),
        ("list index of a dict", "model.0=1"),
        ("superscript list index", "metrics.\u00b2.name=x"),  # "²".isdigit() is True, int("²") fails
        ("fullwidth list index", "metrics.\uff11.name=x"),  # isdecimal() is True, but not an ASCII index
        ("lone surrogate in a path", 'trainer.save_dir="\\ud800"'),
        ("lone surrogate in a name", 'name="x\\udfff"'),
    ):
        cases.append(Case("overrides", label, args=["--set", override]))
    for label, args in (
        ("--epochs 0", ["--epochs", "0"]),
        ("--bs -4", ["--bs", "-4"]),
        ("--lr nan", ["--lr", "nan"]),
        ("--lr inf", ["--lr", "inf"]),
        ("--lr -1", ["--lr", "-1"]),
        ("--epochs 10**7", ["--epochs", "10000000"]),
    ):
        cases.append(Case("overrides", label, args=args))

    for label, args, word in FLAGS:
        cases.append(Case("flags", label, args=args, section=word))
    # a step stacks accumulate_steps batches: more than an epoch has would allocate them all
    for value in (4, 1000, 10**9, 2**31 - 1):
        cases.append(
            Case(
                "sizes", f"accumulate_steps={value}", put("trainer.accumulate_steps", value), section="accumulate_steps"
            )
        )

    for i in range(40):
        picks = rng.sample(invalid, rng.randint(2, 4))
        mutations = [put(path, GARBAGE[label]) for path, label in picks]
        cases.append(
            Case(
                "combined",
                f"#{i}: " + ", ".join(f"{p}={l}" for p, l in picks),
                lambda config, ms=mutations: [m(config) for m in ms],
            )
        )

    cases.append(Case("files", "a folder", path=lambda folder: _mkdir(folder / "a_folder.json")))
    cases.append(Case("files", "no such file", path=lambda folder: folder / "missing.json"))
    cases.append(Case("files", "unreadable", path=_unreadable))
    cases.append(Case("files", "config under a file", path=lambda folder: _with(folder, {}) / "x.json"))
    return cases


BASE_FOR_PATHS: dict = {}  # the base config of this run's temp folder, set by the `world` fixture


def _with(folder: Path, changes: dict, name: str = "fuzz") -> Path:
    config = copy.deepcopy(BASE_FOR_PATHS["base"])
    config["name"] = name
    for dotted, value in changes.items():
        put(dotted, value)(config)
    path = folder / SOURCE
    path.write_text(json.dumps(config))
    return path


def _mkdir(path: Path) -> Path:
    path.mkdir(exist_ok=True)
    return path


class NotApplicable(Exception):
    """A case this machine cannot set up (an unreadable file, for a user who reads every file)."""


def _unreadable(folder: Path) -> Path:
    path = _with(folder, {})
    path.chmod(0)
    try:
        path.read_bytes()
    except PermissionError:
        return path
    path.chmod(0o600)
    raise NotApplicable


CASES = generate()
KINDS = list(dict.fromkeys(case.kind for case in CASES))
COUNTS = {kind: sum(case.kind == kind for case in CASES) for kind in KINDS}


# ---------------------------------------------------------------------------------------------------------- tests
class ReachedTraining(BaseException):
    """Raised where the Trainer would be built: the config was accepted."""


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    data_dir = root / "data" / "mnist"
    make_idx_dataset(data_dir, n_train=120, n_test=40)
    (root / "work").mkdir()
    (root / "configs").mkdir()
    BASE_FOR_PATHS["base"] = base_config(data_dir, root / "work" / "saved")
    return root


@pytest.fixture
def harness(world, monkeypatch, capsys):
    def stop(*args, **kwargs):
        raise ReachedTraining()

    monkeypatch.setattr(training.trainer, "Trainer", stop)
    monkeypatch.setattr(train, "Trainer", stop, raising=False)
    # logging.config would close handlers other libraries (absl) bound to the stderr pytest had replaced
    monkeypatch.setattr(train, "setup_logging", lambda *args, **kwargs: None)
    monkeypatch.chdir(world / "work")  # relative paths a case may produce land in the temp folder

    def run_case(case: Case) -> str | None:
        """None if the case behaved, else what went wrong."""
        configs = world / "configs"
        for leftover in configs.iterdir():
            if leftover.is_dir():
                leftover.rmdir()
            else:
                leftover.chmod(0o600)
                leftover.unlink()
        try:
            path = case.write(configs, BASE_FOR_PATHS["base"])
        except NotApplicable:
            return None
        before = snapshot(world)
        capsys.readouterr()
        try:
            status = train.main(["-c", str(path), *case.args])
        except SystemExit as exit:
            status = exit.code
        except ReachedTraining:
            status = "accepted (reached the Trainer)"
        except BaseException as error:  # noqa: B036 (a fuzzer reports whatever escapes)
            status = f"raised {type(error).__name__}: {error}"
        err = capsys.readouterr().err
        problems = check_outcome(status, err, case.section)
        created = snapshot(world) - before
        if created:
            problems.append(f"created {sorted(map(str, created))[:3]}")
        return "; ".join(problems) or None

    return run_case


def snapshot(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if "configs" not in p.relative_to(root).parts}


def check_outcome(status, err: str, section: str | None) -> list[str]:
    problems = []
    if status != 2:
        problems.append(f"status {status!r}")
    lines = err.splitlines()
    if len(lines) != 1 or not lines[0].startswith("error: "):
        problems.append(f"stderr {err[:300]!r}")
    elif section is not None and section not in lines[0]:
        problems.append(f"the error does not name {section!r}: {lines[0][:200]!r}")
    if "Traceback" in err:
        problems.append("traceback")
    return problems


@pytest.mark.parametrize("prefix", [b"", b"\xef\xbb\xbf"], ids=["plain", "utf-8_bom"])
def test_base_config_is_valid(harness, world, capsys, prefix):
    """The fuzzer's starting point passes every check and reaches the Trainer: each case fails by its damage. A UTF-8
    byte-order mark is allowed (json.load allows it; some editors write one)."""
    path = world / "configs" / SOURCE
    path.write_bytes(prefix + json.dumps(BASE_FOR_PATHS["base"]).encode())
    with pytest.raises(ReachedTraining):
        train.main(["-c", str(path), "--set", 'trainer.checkpoint_every={"steps": 4, "keep": 2}'])
    assert capsys.readouterr().err == ""


def test_bare_component_names_are_read_as_components(harness, world, capsys):
    """`"loss": "cross_entropy"` (a name alone, as the optimizer and the metrics take it) is {"name": ...} to every
    reader of the config: the run reaches the Trainer, with no traceback from one that indexes loss["name"]."""
    base = BASE_FOR_PATHS["base"]
    assert validate({**base, "loss": base["loss"]["name"]})["loss"] == {"name": base["loss"]["name"]}
    path = world / "configs" / SOURCE
    path.write_text(json.dumps({**base, "loss": base["loss"]["name"], "model": base["model"]["name"]}))
    with pytest.raises(ReachedTraining):
        train.main(["-c", str(path)])
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "configs").glob("*.json")) + ["../config.json"])
def test_sample_configs_pass_the_checks_made_before_the_data(name):
    """What train.py builds before reading data, with schedule lengths in epochs not yet known (steps_per_epoch
    None): a warm-up of 100 steps before a decay over "all" steps must not be refused for want of the data."""
    config = load_config(ROOT / "configs" / name, source=Path(name).name)
    build(config["model"], "model")
    build(config["loss"], "loss")
    build_optimizer(config, steps_per_epoch=None)


def test_unknown_names_list_only_components():
    for kind in COMPONENT_MODULES:
        assert all(inspect.isfunction(fn) for fn in available(kind).values()), kind
    names = ", ".join(sorted(available("optimizer")))  # whatever optimizers a project adds
    with pytest.raises(ConfigError, match=rf"available: {names}\. Did you mean 'adam'"):
        validate({**base_config(Path("data"), Path("saved")), "optimizer": {"name": "adamm"}})


@pytest.mark.parametrize("kind", KINDS, ids=[f"{kind.replace(' ', '_')}-{COUNTS[kind]}_cases" for kind in KINDS])
def test_every_bad_config_exits_2_with_one_error_line(harness, kind):
    failures = []
    for case in (c for c in CASES if c.kind == kind):
        problem = harness(case)
        if problem:
            failures.append(f"{case.label!r}: {problem}")
    assert not failures, f"{len(failures)} of {COUNTS[kind]} {kind} cases:\n" + "\n".join(failures[:30])


def test_counts_per_class():
    """The fuzzer's size per class (printed with -s): a change that drops a class shows here."""
    width = max(map(len, KINDS))
    print("\nconfig fuzz cases per class:")
    for kind in KINDS:
        print(f"  {kind:<{width}}  {COUNTS[kind]:4d}")
    print(f"  {'total':<{width}}  {len(CASES):4d}")
    assert len(CASES) >= 300 and all(count >= 4 for count in COUNTS.values())


# A few as real processes: the exit status and stderr of the interpreter itself, platform set-up included.
PROCESS_CASES = [
    "utf-16",
    "optimizer.args.b1=NaN",
    "--run-id '../../escape'",
    "seed [x100000",
    "twice in optimizer.args",
    "--epoch 3",
    "--epochs abc",
    "--run-id ' '",
    "accumulate_steps=1000",
]


@pytest.mark.parametrize("label", PROCESS_CASES)
def test_bad_config_as_a_process(world, tmp_path, label):
    case = next(c for c in CASES if c.label == label)
    path = case.write(tmp_path, BASE_FOR_PATHS["base"])
    before = snapshot(world)
    result = subprocess.run(
        [sys.executable, "train.py", "-c", str(path), *case.args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert check_outcome(result.returncode, result.stderr, case.section) == [], result.stderr
    assert snapshot(world) == before and set(tmp_path.iterdir()) == {path}
