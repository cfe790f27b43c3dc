"""Components in files of your own: the registry finds a new file's ``@register`` by itself (model/registry.py), a
file that cannot be imported is one line naming it (exit status 2 from train.py), and a name registered twice is one
line naming both files. Each test points the registry at a package of its own in a temporary folder, so nothing is
written into the repository."""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from model import registry
from training.config.components import available
from training.config.file import ConfigError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def own_package(tmp_path, monkeypatch):
    """A function writing files of a package ``mine_<n>`` (a name no other test imports) that the registry searches
    instead of the repository's packages; the registry's state is restored after the test."""
    name = f"mine_{abs(hash(str(tmp_path))) % 10**8}"
    (tmp_path / name).mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "ROOT", tmp_path)
    monkeypatch.setattr(registry, "PACKAGES", (name,))
    for kind, module in registry.KINDS.items():
        importlib.import_module(module)  # the template's components, registered before the test's
        monkeypatch.setitem(registry._REGISTERED, kind, dict(registry._REGISTERED[kind]))
    monkeypatch.setattr(registry, "_FOUND", None)
    monkeypatch.setattr(registry, "_LOADED", set())

    def write(relative: str, text: str) -> Path:
        path = tmp_path / name / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
        return path

    yield name, write
    for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[module]


def test_a_new_file_is_found_by_itself_and_only_for_the_kind_it_registers(own_package):
    name, write = own_package
    write(
        "losses.py",
        """
        from model.registry import register

        @register("loss", task="regression")
        def my_loss(outputs, targets, *, scale: float = 1.0, mask=None):
            return scale * ((outputs - targets) ** 2).reshape(len(outputs), -1).mean(axis=1)
        """,
    )
    write(
        "heavy.py",
        """
        from model.registry import register

        raise RuntimeError("imported although it registers no loss")

        @register("metrics")
        def never(): ...
        """,
    )
    write(
        "docs_only.py",
        '"""An example in a docstring imports nothing:\n\n    @register("loss")\n    def x(): ...\n"""\n',
    )
    losses = available("loss")
    assert "my_loss" in losses and "cross_entropy" in losses
    assert list(losses).index("cross_entropy") < list(losses).index("my_loss")  # the template's first
    assert registry.entries("loss")["my_loss"].task == "regression"
    assert f"{name}.heavy" not in sys.modules and f"{name}.docs_only" not in sys.modules
    # the metrics kind does import it, and its failure is one line naming the file
    with pytest.raises(ConfigError) as error:
        available("metrics")
    assert str(error.value) == (
        f"{name}/heavy.py: cannot import it for its @register('metrics') components "
        "(RuntimeError: imported although it registers no loss)"
    )


def test_a_file_that_fails_to_import_names_itself(own_package):
    name, write = own_package
    write("sub/models.py", 'from model.registry import register\n\n@register("model")\ndef broken(:\n    pass\n')
    with pytest.raises(ConfigError, match=rf"^{name}/sub/models.py: cannot import it for its @register\('model'\) "
                       r"components \(SyntaxError: invalid syntax"):  # fmt: skip
        available("model")


def test_a_kind_misspelt_is_named_not_skipped(own_package):
    name, write = own_package
    write("losses.py", 'from model.registry import register\n\n@register("losses")\ndef mine(outputs, targets): ...\n')
    with pytest.raises(ConfigError) as error:
        available("model")  # whichever kind is looked up first: the file would never be imported for its own
    assert str(error.value) == (
        f"{name}/losses.py: @register('losses'): unknown kind of component. Did you mean 'loss'? Kinds: "
        f"{', '.join(registry.KINDS)}"
    )


def test_a_name_registered_twice_names_both_files(own_package):
    name, write = own_package
    write(
        "losses.py",
        """
        from model.registry import register

        @register("loss")
        def mse(outputs, targets, *, mask=None):
            return outputs
        """,
    )
    with pytest.raises(ConfigError) as error:
        available("loss")
    assert str(error.value) == (
        f"loss 'mse' is registered twice, in training/losses.py and in {name}/losses.py: a config names a component "
        "by its function's name, so rename one of them"
    )


def test_the_same_function_registered_again_replaces_itself():
    # a notebook's cell run twice, or a module reloaded: not a second name
    def cell_net():
        return None

    try:
        registry.register("model")(cell_net)
        registry.register("model")(cell_net)
    finally:
        registry._REGISTERED["model"].pop("cell_net", None)


def test_train_py_refuses_a_broken_file_of_your_own_in_one_line(tmp_path):
    package = tmp_path / "mine_cli"
    package.mkdir()
    (package / "models.py").write_text(
        'from model.registry import register\nimport not_a_module_anywhere\n\n@register("model")\ndef m(): ...\n'
    )
    code = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        sys.path.insert(0, {str(tmp_path)!r})
        from model import registry
        registry.ROOT, registry.PACKAGES = Path({str(tmp_path)!r}), ("mine_cli",)
        import train
        sys.exit(train.main(["--list", "model"]))
        """
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        "error: mine_cli/models.py: cannot import it for its @register('model') components (ModuleNotFoundError: No "
        "module named 'not_a_module_anywhere')"
    ]


def test_looking_up_the_data_loaders_imports_no_jax_with_the_samples_files_among_them():
    # config errors are reported before JAX loads: a loader of tasks/ (teacher_outputs loads a run) must keep that
    code = (
        "import sys\nfrom model.registry import entries\nnames = entries('data_loader')\n"
        "assert {'teacher_outputs', 'mnist_images', 'prior'} <= set(names), sorted(names)\n"
        "print('jax' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr
