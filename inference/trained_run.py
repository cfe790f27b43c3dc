"""A trained run back in Python (``load_run``): a run folder or one checkpoint file -> a ``LoadedRun``, the model with
its trained params and state, its config and preprocessing, called on inputs as the model takes them (as the
export and predict.py take them), or on raw inputs as the data set's files hold them. test.py, sample.py and the
export load their runs here, and so does a notebook:

    from inference.trained_run import load_run

    run = load_run("saved/Mnist_LeNet/<run_id>")  # model_best.params, else checkpoint-latest.params
    logits = run(pixels, raw=True)  # uint8 images as MNIST's files hold them; predict.py --raw prepares them alike
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from files.reads import read_json
from files.writes import CONFIG, PREPROCESSING
from training.assembly import Run, assemble
from training.buckets import store as buckets  # [feature: buckets]
from training.config.file import ConfigError
from training.config.validation import load_config
from training.run import checkpoint


class ModelInputError(ConfigError):
    """The model cannot take the input it is loaded for; ``reason`` is the first line of the layer's complaint."""

    def __init__(self, reason: str):
        super().__init__(f"config.json: model: cannot take the data's input ({reason})")
        self.reason = reason


@dataclass
class LoadedRun:
    """A trained run ready to use in Python, made by ``load_run``: the model with its trained ``params`` and
    ``state``, the ``config`` it trained with, the ``preprocessing`` a user of it needs (class names, vocabulary,
    normalisation), the components (``run``: loss, metrics, augmentation) and the checkpoint it came from."""

    model: Any
    params: Any
    state: Any
    config: dict
    preprocessing: dict
    run: Run
    checkpoint: Path
    header: dict  # the checkpoint's header: epoch, step, monitored value
    input_spec: Any  # what the model takes (shapes and dtypes, batch first), after the augmentation's eval part
    _forward: Any = field(default=None, repr=False)

    def __call__(self, inputs, mask=None, raw: bool = False):
        """The model's outputs in inference mode on a batch of inputs as the model takes them: what the exported
        model and predict.py take too (an input of the run's loader goes through ``model_input`` first). ``raw``:
        the inputs as the data set's files hold them (MNIST's uint8 pixels, a CSV's numbers in their units),
        prepared by the run's recorded preprocessing as predict.py prepares them (``inference.predict.from_raw``).
        ``mask``: the batch's padding mask, for a model whose call declares one (without it, every position is
        real). A numpy array; a model of several named outputs gives a dict of them."""
        import jax
        import numpy as np

        if raw:
            from inference.predict import from_raw

            try:
                inputs = from_raw(inputs, self.preprocessing)
            except ValueError as error:
                raise ConfigError(f"raw=True: {error}") from None
            # raw arrays come from a user's files, not the run's loader: a wrong shape would fail deep in a layer
            shape = getattr(self.input_spec, "shape", None)
            if shape is not None and np.shape(inputs)[1:] != tuple(shape[1:]):
                raise ConfigError(
                    f"raw=True: inputs of shape {list(np.shape(inputs))}; the model takes a batch of shape "
                    f"[N, {', '.join(map(str, shape[1:]))}]"
                )
        expected = getattr(self.input_spec, "dtype", None)
        given = getattr(inputs, "dtype", None)
        if expected is not None and given is not None and given.kind in "biu" and np.dtype(expected).kind == "f":
            raise ConfigError(
                f"inputs of dtype {given}, where the model takes {np.dtype(expected)}: raw inputs as the data set's "
                "files hold them (pixels of 0..255) need raw=True, which prepares them by the run's preprocessing"
            )
        if self._forward is None:
            model = self.model

            def forward(params, state, x, mask):
                return model(params, state, x, train=False, **({} if mask is None else {"mask": mask}))[0]

            self._forward = jax.jit(forward)
        return jax.tree.map(np.asarray, self._forward(self.params, self.state, inputs, mask))

    def model_input(self, inputs):
        """Inputs as the run's data loader yields them made what the model takes: the evaluation part of the run's
        augmentation (its normalisation, if it has one), as test.py and the export apply it."""
        import numpy as np

        if self.run.augment is None:
            return inputs
        return np.asarray(self.run.augment({"input": inputs}, None, train=False)["input"])

    def output_spec(self):
        """The model's outputs on ``input_spec`` (shapes and dtypes, traced: nothing compiled or run), to check what
        a user of them assumes (a vocabulary of as many characters as the model has outputs)."""
        import jax

        def forward(params, state, x):
            if self.run.augment is not None:
                x = self.run.augment({"input": x}, None, train=False)["input"]
            return self.model(params, state, x, train=False)[0]

        return jax.eval_shape(forward, self.params, self.state, self.input_spec)


def load_run(path: str | Path, config: dict | None = None, input_spec=None) -> LoadedRun:
    """A run folder (its best checkpoint, else the latest) or a checkpoint file -> a ``LoadedRun`` ready to call.

    ``config``: a validated config (default: the config.json beside the checkpoint). ``input_spec``: what the model
    takes (default: read from one batch of the config's data, the train split first). Bad input raises ConfigError,
    a checkpoint that does not fit the model ``training.run.checkpoint.CheckpointError``; both carry one line."""
    import jax

    path = buckets.fetched(path)  # [feature: buckets] a run in a bucket, read from a local copy
    checkpoint_path = checkpoint.of_run(path)
    checkpoint.check_checkpoint_file(checkpoint_path)
    if config is None:
        config_path = checkpoint_path.parent / CONFIG
        if not config_path.is_file():
            raise ConfigError(f"{config_path}: no such file; pass the run's config as load_run(path, config=...)")
        config = load_config(config_path, source=CONFIG)
    run = assemble(config)
    data_preprocessing = None
    if input_spec is None:
        loader = first_loader(run)
        batch_spec = loader.spec if run.augment is None else run.augment.spec(loader.spec)
        input_spec = batch_spec["input"]
        data_preprocessing = loader.preprocessing
        if run.augment is not None:  # as train.py records it
            data_preprocessing = run.augment.preprocessing(data_preprocessing, loader.spec)
    try:
        template = jax.eval_shape(
            lambda: dict(zip(("params", "state"), run.model.init(jax.random.PRNGKey(0), input_spec)))
        )
    except Exception as error:  # shape errors from deep inside a layer: their first line says what
        raise ModelInputError((str(error).strip() or type(error).__name__).splitlines()[0]) from None
    tree, header = checkpoint.restore(checkpoint_path, template, only=("params", "state"))
    saved = checkpoint_path.parent / PREPROCESSING
    try:  # what train.py recorded of the training data, held to the bound of every JSON file a tool reads
        preprocessing = read_json(saved, "preprocessing.json")
    except FileNotFoundError:
        preprocessing = data_preprocessing or {}
    except ValueError as error:  # a folder, a FIFO, too large, not JSON, nested too deep: the message names it
        raise ConfigError(str(error)) from None
    except OSError as error:
        raise ConfigError(f"{saved}: cannot read it ({error.strerror or error})") from None
    if type(preprocessing) is not dict:
        raise ConfigError(
            f"{saved}: expected a JSON object of the data's preprocessing, got {type(preprocessing).__name__}"
        )
    return LoadedRun(
        run.model, tree["params"], tree["state"], config, preprocessing, run, checkpoint_path, header, input_spec
    )


def first_loader(run: Run):
    """The loader of the first split of the config that reads (train, validation, test): its first batch gives the
    shapes and dtypes the model takes."""
    splits = [s for s in ("train", "validation", "test") if s in run.config["data_loader"]]
    problem = None
    for split in splits:
        try:
            return run.load_data([split])[split]
        except ConfigError as error:
            problem = str(error)
        except (OSError, ValueError) as error:  # the data set's own complaint, which does not say which split
            problem = f"config.json: data_loader.{split}: {error}"
    raise ConfigError(problem or "config.json: data_loader: no split to read the model's input shape from")
