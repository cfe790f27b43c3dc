"""The decoder of a trained VAE as a run of its own, which the export takes as it takes any run:

    python -m tasks.vae.decoder --run saved/mnist_vae/<run_id>     # writes saved/mnist_vae/<run_id>-decoder/
    python inference/convert_tflite.py --run saved/mnist_vae/<run_id>-decoder --name vae_decoder

The decoder's run folder holds its config (the model ``vae_decoder`` with the VAE's sizes, the loader ``prior``:
latent vectors drawn from N(0, I)), its weights (the VAE's ``params["decoder"]``) and its preprocessing. The export
then writes a model that turns a latent vector into the logits of an image: sampling from the prior is a draw of
N(0, I) through it, and the sigmoid of its outputs the image.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from files.writes import BEST, CONFIG, PREPROCESSING, remove_folder, replace_folder, temporary_folder, write_atomic
from training.config.file import ConfigError
from training.run.cli import ArgumentParser, command, fail

DECODER_SUFFIX = "-decoder"


def decoder_config(config: dict, image_shape: tuple, save_dir: str) -> dict:
    """The config of the decoder of a VAE run's ``config``: its sizes, the prior as its data."""
    args = config["model"].get("args") or {}
    latent, hidden = args.get("latent", 16), list(args.get("hidden", [256]))
    data = {"latent": latent, "size": 256, "batch_size": 64}
    model = {"latent": latent, "hidden": hidden, "image_shape": list(image_shape)}
    return {
        "name": f"{config['name']}_decoder",
        "seed": config.get("seed", 0),
        "model": {"name": "vae_decoder", "args": model},
        "loss": {"name": "mse"},  # the decoder alone is not trained: a loss only for the config to be complete
        "metrics": [],
        "optimizer": {"name": "adamw", "args": {"lr": 0.001}},
        "data_loader": {
            "train": {"name": "prior", "args": {**data, "split": "train"}},
            "validation": {"name": "prior", "args": {**data, "split": "validation"}},
        },
        "trainer": {"epochs": 1, "save_dir": save_dir, "monitor": "off"},
    }


def write_decoder_run(vae_run: str | Path, target: str | Path | None = None) -> Path:
    """Writes the decoder of the VAE run ``vae_run`` as a run folder (default: beside it, ``<run>-decoder``); built
    in a hidden folder and renamed into place, so a failure leaves nothing. Bad input raises ConfigError."""
    import jax

    from inference.trained_run import load_run
    from training.config.validation import validate
    from training.run import checkpoint

    vae = load_run(vae_run)
    if vae.config["model"]["name"] != "vae":
        raise ConfigError(f"{vae_run}: a run of the model {vae.config['model']['name']!r}, not of a vae")
    run_dir = vae.checkpoint.parent
    target = Path(target) if target is not None else run_dir.with_name(run_dir.name + DECODER_SUFFIX)
    if target.exists():
        raise ConfigError(f"{target}: exists already; remove it or give another --out")
    config = validate(decoder_config(vae.config, tuple(vae.input_spec.shape[1:]), str(target.parent)), "decoder")
    params = vae.params["decoder"]
    state = {name: {} for name in params}  # the decoder's layers keep no state
    header = {"epoch": vae.header["epoch"], "step": vae.header["step"]}
    preprocessing = {
        key: value for key, value in vae.preprocessing.items() if key in ("layout", "pixel_scale", "mean", "std")
    }
    preprocessing.update(task="other", decoder_of=str(run_dir))
    target.parent.mkdir(parents=True, exist_ok=True)
    building = temporary_folder(target)
    try:
        checkpoint.save(building / BEST, jax.device_get({"params": params, "state": state}), header)
        write_atomic(building / CONFIG, (json.dumps(config, indent=2) + "\n").encode())
        write_atomic(building / PREPROCESSING, (json.dumps(preprocessing, indent=2) + "\n").encode())
        replace_folder(building, target)
    except BaseException:
        remove_folder(building)
        raise
    return target


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description="Write a trained VAE's decoder as a run folder of its own, to export.")
    parser.add_argument("--run", required=True, help="the VAE's run folder (or a checkpoint of it)")
    parser.add_argument("--out", help="the decoder's run folder (default: <run>-decoder beside the run)")
    args = parser.parse_args(argv)
    try:
        print(f"wrote {write_decoder_run(args.run, args.out)}")
    except ConfigError as error:
        fail(str(error))
    return 0


if __name__ == "__main__":
    sys.exit(command(main))
