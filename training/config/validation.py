"""The one validation of a config: ``validate`` checks every section in a fixed order (their schema and defaults in
training/config/schema.py) and returns the resolved config, what a run saves; ``load_config`` reads a config file,
applies the command line's ``--set`` overrides and validates it.

Every component in `config.json` has the form {"name": ..., "args": {...}}; `name` is looked up among the
functions registered for that kind of component (``model/registry.py``), and `args` must bind to that function's
signature. All of this is checked before any data is read or anything is compiled, and
every problem is reported as one line that names its place in the file: `config.json: optimizer.args.lr: ...`.
"""

from __future__ import annotations

import copy
from pathlib import Path

from training.config.components import build
from training.config.file import ConfigError, check_values, parse_override, read_config_file, set_path, show
from training.config.notebook_components import check_kernel_components
from training.config.schema import (
    check_components,
    check_features,
    check_loaders,
    check_mesh,
    check_optimizer,
    check_top_level,
    check_trainer,
)


def validate(config: dict, source: str = "config.json") -> dict:
    """Checks the whole config and fills defaults; returns the resolved config (what gets saved). The sections in a
    fixed order, so that a config with several problems reports the same one first every time."""
    check_values(config, source)  # read_config_file did for the file; this covers configs built in Python
    config = copy.deepcopy(config)
    check_top_level(config, source)
    names = check_components(config, source)
    check_optimizer(config, source)
    check_loaders(config, source)
    build_augment(config, source)  # every op's name and arguments, before any data is read
    check_trainer(config, names, source)
    check_features(config, source)  # the optional features' sections (training/<feature>/config.py)
    check_mesh(config, source)
    return config


def build_augment(config: dict, source: str = "config.json"):
    """The train loader's ``augment`` list built and checked (op names, arguments, ranges) without reading data;
    None when there is none. Raises ConfigError naming the place: ``config.json: data_loader.train.augment.1...``."""
    from data_loader.augment.pipeline import Augment  # JAX: config errors are reported before it loads

    spec = config.get("data_loader", {}).get("train")
    ops = spec.get("augment") if isinstance(spec, dict) else None
    if ops is None:
        return None
    where = f"{source}: data_loader.train.augment"
    if not isinstance(ops, list):
        raise ConfigError(f'{where}: expected a list of {{"name": ..., "args": {{...}}}} ops, got {show(ops)}')
    built = [build(op, "augment", f"{where}.{i}") for i, op in enumerate(ops)]
    if not built:
        return None
    try:
        return Augment(built, where)
    except ValueError as error:
        raise ConfigError(str(error)) from None


def load_config(path: str | Path, overrides: list[str] = (), source: str | None = None) -> dict:
    """The config file at ``path``, each ``--set KEY.PATH=VALUE`` of ``overrides`` applied, validated; a run
    folder's config whose components lived in a notebook's kernel is refused first, in one line."""
    source = source or str(path)
    check_kernel_components(Path(path).parent, source)
    config = read_config_file(path, source)
    for text in overrides:
        key, value = parse_override(text)
        set_path(config, key, value, f"--set {key}")
    return validate(config, source)
