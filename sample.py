"""Generate text with a trained language model:

    python sample.py --run saved/shakespeare_char/<run_id> --prompt "ROMEO:" --tokens 200 --temperature 0.8

Uses the run folder's config.json, its best checkpoint (model_best.params, else checkpoint-latest.params) and the
vocabulary in its preprocessing.json; model/generate.py draws the characters.
"""

from __future__ import annotations

import argparse
import math
import sys

from files.writes import CONFIG, PREPROCESSING
from inference.predict import read_preprocessing
from inference.trained_run import load_run
from training.assembly import assemble
from training.buckets import store as buckets  # [feature: buckets]
from training.config.file import ConfigError
from training.config.validation import load_config
from training.devices import compilation_cache
from training.run.checkpoint import check_checkpoint_file
from training.run.cli import ArgumentParser, add_run, command, fail
from training.run.location import check_config_writes


def parse_args(argv=None):
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run(parser, "run folder (or a checkpoint file inside one)", required=True)
    parser.add_argument("--prompt", default="\n", help="text to continue (default: a new line)")
    parser.add_argument("--tokens", type=int, default=200, help="characters to generate (default 200)")
    parser.add_argument("--temperature", type=float, default=0.8, help="0: always the most likely character")
    parser.add_argument("--top-k", type=int, default=None, help="sample among the k most likely characters only")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    compilation_cache.use()  # the machine's: what training compiled, this reads
    from training.run.checkpoint import of_run

    args.run = buckets.local_copy(args.run)  # [feature: buckets] a run in a bucket, read from a local copy
    checkpoint_path = of_run(args.run)
    run_dir = checkpoint_path.parent
    try:
        check_checkpoint_file(checkpoint_path)
        if args.tokens < 0 or not 0 <= args.temperature < math.inf or (args.top_k is not None and args.top_k < 1):
            raise ConfigError("--tokens and --temperature must be >= 0 (a finite number), --top-k >= 1")
        if not 0 <= args.seed < 2**63:
            raise ConfigError(f"--seed {args.seed}: expected an integer from 0 to 2**63 - 1")
        if not args.prompt:
            raise ConfigError("--prompt: give at least one character")
        config = load_config(run_dir / CONFIG, source=CONFIG)
        check_config_writes(config, run_dir)  # the run folder's own config: where it may write is checked
        preprocessing = run_dir / PREPROCESSING
        try:
            vocabulary = read_preprocessing(preprocessing).get("vocabulary")
        except ValueError as error:
            raise ConfigError(str(error)) from None
        if not vocabulary:
            raise ConfigError(f"{preprocessing}: no vocabulary (is this a language model's run folder?)")
        unknown = sorted(set(args.prompt) - set(vocabulary))
        if unknown:
            raise ConfigError(f"--prompt: characters not in the model's vocabulary: {''.join(unknown)!r}")
        run = assemble(config)
        model = run.model
        # the ids' dtype and the context length are the data's: one batch of the training split says them
        spec = run.load_data(["train"])["train"].spec["input"]
    except ConfigError as error:
        fail(str(error))
    except ValueError as error:
        fail(f"config.json: data_loader.train: {error}")

    import jax

    from model.generate import Generator
    from training.run import checkpoint

    context = spec.shape[1]
    try:
        loaded = load_run(checkpoint_path, config, jax.ShapeDtypeStruct((1, context), spec.dtype))
    except (ConfigError, checkpoint.CheckpointError) as error:
        fail(str(error))

    # a sampled id names a character of the vocabulary: one of another run (2 characters for a model of 65
    # outputs) would fail mid-text, so it is refused before
    width = loaded.output_spec().shape[-1]
    if width != len(vocabulary):
        fail(
            f"{preprocessing}: a vocabulary of {len(vocabulary)} characters, but the model gives {width} outputs per "
            "position (one per character): is this preprocessing.json the run's own?"
        )
    generator = Generator(model, spec, vocabulary)
    print(generator(loaded.params, loaded.state, args.prompt, args.tokens, args.temperature, args.top_k, args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(command(main))
