"""Every sample and the peer benchmarks in one command, for the day an accelerator is there: writes a markdown table
(sample or benchmark, device, throughput, ratio to its peer, MFU) for benchmarks/README.md and prints it.

    python benchmarks/accelerator_run.py                          # samples at 200 batches an epoch, GPT-2, peers
    python benchmarks/accelerator_run.py --nanogpt ~/src/nanoGPT  # add nanoGPT's model.py as the language model's peer
    python benchmarks/accelerator_run.py --full                   # each sample's whole configured run
    python benchmarks/accelerator_run.py --smoke                  # on the CPU in seconds: tiny runs, no peers

Rows:
  each sample config (config.json, configs/*.json): `train.py` over the config's epochs (two where it has one) of
      at most --limit-batches batches of each split (--full: the whole configured run), in a fresh process;
      examples/s and MFU are the last epoch's row of its metrics.jsonl, as the `Trainer` logs them: an epoch after
      the compilation, "auto"'s measurement of steps per call and the first evaluation (MFU against
      training/devices/peaks.py's table; "unknown" where the device is not in it, as on a CPU); "steps per call" is
      what the run used, as its train.log says ("auto": the measured choice, and why)
  gpt2-small: the language-model sample at GPT-2 small's size (12 layers x 768, 12 heads, context 1024, batch 12:
      the shapes of nanoGPT's bench.py), computing in bfloat16 (`trainer.precision`)
  lm_benchmark / train_benchmark (not with --smoke), one round each, through those scripts (their docstrings say
      what each variant is): the language-model sample and gpt2-small against nanoGPT under torch.compile (with
      --nanogpt; gpt2-small against its bfloat16 autocast) and ResNet-20 against PyTorch eager (with torch
      installed); "template / peer" is their ratio, and a skipped peer leaves it "-"
  the loop (not with --smoke): overhead_benchmark.py's Trainer at one step per call (log_every 50 and 1) and at
      "auto" against a bare jit loop of the same compiled update, an MLP of 8 examples (2 rounds, wall time)
--only picks groups of rows (samples, gpt2, lm, resnet, overhead), for a short lease on a lent machine.
A sample whose data cannot be had (CIFAR-10 downloads it) gets its error as the row, and the rest still run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

LM_SAMPLE = REPO / "configs" / "shakespeare_char.json"
# (layers, width, heads, context, batch): GPT-2 small as nanoGPT's bench.py trains it; --smoke: a toy of the same code
GPT2_SMALL = (12, 768, 12, 1024, 12)
GPT2_TOY = (1, 32, 2, 32, 4)
# the rows, in groups a short session on a lent machine can pick from (--only); --smoke runs no peers
GROUPS = ("samples", "gpt2", "lm", "resnet", "overhead")
PEERS = ("lm", "resnet", "overhead")
# overhead_benchmark's Trainer settings reported here, each against the bare jit loop in the same run
OVERHEAD = ("K=1 log=50", "K=1 log=1", "K=auto log=50")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit-batches", type=int, default=200, help="at most N batches per epoch and split")
    parser.add_argument("--full", action="store_true", help="each sample's whole configured run instead")
    parser.add_argument("--smoke", action="store_true", help="CPU check: 3 batches, a toy GPT-2, no peer benchmarks")
    parser.add_argument("--nanogpt", help="a checkout of nanoGPT, for lm_benchmark's nanogpt variant")
    parser.add_argument("--out", default="accelerator_run.md", help="where the table goes (default: %(default)s)")
    parser.add_argument(
        "--only", default=",".join(GROUPS), help=f"a comma-separated subset of {', '.join(GROUPS)} (default: all)"
    )
    parser.add_argument("--samples", help="with the samples group: these samples only (config, configs/ names)")
    args = parser.parse_args(argv)
    if args.limit_batches < 1:
        parser.error(f"--limit-batches: expected a positive number of batches, got {args.limit_batches}")
    args.only = [g.strip() for g in args.only.split(",") if g.strip()]
    unknown = [g for g in args.only if g not in GROUPS]
    if unknown or not args.only:
        parser.error(f"--only: expected some of {', '.join(GROUPS)}, got {', '.join(unknown) or 'nothing'}")
    known = [c.stem if c.parent.name == "configs" else "config" for c in sample_configs()]
    if args.samples is not None and not set(args.samples.split(",")) <= set(known):
        parser.error(f"--samples: expected some of {', '.join(known)}, got {args.samples}")
    return args


def sample_configs(names: str | None = None) -> list[Path]:
    """config.json ("config") and configs/*.json, or those of `names` (comma-separated)."""
    every = [REPO / "config.json", *sorted((REPO / "configs").glob("*.json"))]
    chosen = names.split(",") if names else None
    return [c for c in every if chosen is None or (c.stem if c.parent.name == "configs" else "config") in chosen]


def gpt2_overrides(smoke: bool) -> list[str]:
    depth, dim, heads, context, batch = GPT2_TOY if smoke else GPT2_SMALL
    return [
        f"model.args.depth={depth}",
        f"model.args.dim={dim}",
        f"model.args.num_heads={heads}",
        f"model.args.context={context}",
        f"data_loader.train.args.context={context}",
        f"data_loader.train.args.batch_size={batch}",
        f"data_loader.validation.args.context={context}",
        'trainer.precision={"compute": "bfloat16"}',
    ]


def failed(command: list[str], label: str = "") -> dict | None:
    """Runs `command` in a fresh process (printed first); {"error": its last line of stderr} if it failed."""
    print(f"{label}{' '.join(command[1:])}", flush=True)
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]}
    return None


def train_py_run(name: str, config: Path, overrides: list[str], limit: int | None, save_dir: Path) -> dict:
    """One `train.py` run in a fresh process; its last metrics row, or {"error": its last line of stderr}."""
    from files.reads import read_metrics
    from training.config.validation import load_config

    settings = load_config(config, overrides)
    command = [sys.executable, str(REPO / "train.py"), "-c", str(config), "--run-id", name]
    command += ["--set", f"trainer.save_dir={json.dumps(str(save_dir))}"] + [a for o in overrides for a in ("--set", o)]
    if limit is not None:
        command += ["--limit-batches", str(limit)]
        if settings["trainer"]["epochs"] < 2:  # the last epoch is measured: one after the compilation
            command += ["--set", "trainer.epochs=2"]
    if error := failed(command, f"{name}: "):
        return error
    (metrics,) = save_dir.glob(f"*/{name}/metrics.jsonl")
    row = read_metrics(metrics)[-1]
    # steps per call: "auto"'s choice with its reason, else the compiled step's own line
    said = [line.split(": ", 1)[-1] for line in (metrics.parent / "train.log").read_text().splitlines()]
    said = [line for line in said if line.startswith(("compiled the training step (", "steps per call (auto):"))]
    said.sort(key=lambda line: line.startswith("steps per call (auto):"))
    context = settings["model"]["args"].get("context")
    return {
        "examples_per_s": row["time/examples_per_s"],
        "unit": "tokens/s" if context else "examples/s",
        "rate": row["time/examples_per_s"] * (context or 1),
        "mfu": row.get("time/mfu", "unknown"),
        "steps_per_call": steps_per_call(said[-1]) if said else "-",
    }


def steps_per_call(line: str) -> str:
    """A train.log line -> the table's cell: "steps per call (auto): 8; <why>" -> "8 (auto: <why>)", and
    "compiled the training step (1 step(s) per call) in ..." -> "1"."""
    if line.startswith("steps per call (auto):"):
        k, _, why = line.removeprefix("steps per call (auto):").strip().partition("; ")
        return f"{k} (auto: {why})"
    return line.removeprefix("compiled the training step (").split(" ", 1)[0]


def devices() -> dict:
    """The device kind, its count and jax's version, asked of a child process: a parent that initialised the GPU
    would hold most of its memory (JAX preallocates) for the whole run, and every run here is a child."""
    ask = "import jax, json; print(json.dumps([jax.devices()[0].device_kind, jax.device_count(), jax.__version__]))"
    done = subprocess.run([sys.executable, "-c", ask], capture_output=True, text=True, check=True)
    kind, count, version = json.loads(done.stdout.splitlines()[-1])
    return {"kind": kind, "count": count, "jax": version}


def peer(
    script: str,
    flags: list[str],
    template: str,
    other: str,
    rate_key: str,
    out: Path,
    device: dict,
    compute: str = "float32",
) -> dict:
    """One round of a peer benchmark: the template's rate, its ratio to `other` (None when skipped) and its MFU (XLA's
    FLOP count per example or token over training/devices/peaks.py's peak of the devices for `compute`)."""
    command = [sys.executable, str(REPO / "benchmarks" / script), "--rounds", "1", "--out", str(out), *flags]
    if error := failed(command):
        return error
    results = json.loads(out.read_text())["results"]
    results = results.get("cifar_resnet", results)  # train_benchmark nests by model
    from training.devices import peaks

    run = results[template][0]
    flops = run.get("flop_per_token") or 1e6 * run.get("mflop_per_example", 0) or None
    peak = peaks.peak_flops(device["kind"], compute)
    # the template's Trainer trains on every device, as train.py does
    _, mfu = peaks.utilization(flops, run[rate_key], peak, device["count"])
    ratio = run[rate_key] / results[other][0][rate_key] if results.get(other) else None
    return {"rate": run[rate_key], "unit": rate_key.replace("_per_s", "/s"), "ratio": ratio, "mfu": mfu}


def overhead(out: Path) -> dict[str, dict]:
    """overhead_benchmark.py's Trainer settings against its bare jit loop (2 rounds of 2000 steps, wall time): a row
    each, "template / peer" the Trainer's rate over the bare loop's (the loop's own cost: 1 / its ratio of times)."""
    variants = ",".join(("bare", *OVERHEAD))
    command = [sys.executable, str(REPO / "benchmarks" / "overhead_benchmark.py"), "--rounds", "2"]
    command += ["--variants", variants, "--out", str(out)]
    name = "the loop, {}, vs a bare jit loop".format
    if error := failed(command):
        return {name(v): error for v in OVERHEAD}
    measured = json.loads(out.read_text())
    best, bare = measured["best"], measured["best"]["bare"]["wall_us"]
    return {
        name(v): {
            "rate": 1e6 / best[v]["wall_us"],
            "unit": "steps/s",
            "ratio": bare / best[v]["wall_us"],
            "mfu": "-",
            "steps_per_call": measured["results"][v][0]["steps_per_call"],
        }
        for v in OVERHEAD
    }


def cell(value, form: str) -> str:
    return format(value, form) if isinstance(value, (int, float)) else str(value)


def table(rows: dict[str, dict], device: str) -> str:
    lines = [
        "| run | device | throughput | template / peer | MFU | steps per call |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    lines += [row_line(name, r, device) for name, r in rows.items()]
    return "\n".join(lines)


def row_line(name: str, r: dict, device: str) -> str:
    if "error" in r:
        return f"| {name} | {device} | failed: {r['error']} | - | - | - |"
    ratio = cell(r.get("ratio"), ".2f") if r.get("ratio") is not None else "-"
    rate = f"{r['rate']:,.0f} {r['unit']}"
    return f"| {name} | {device} | {rate} | {ratio} | {cell(r['mfu'], '.1%')} | {r.get('steps_per_call', '-')} |"


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    if out.is_dir() or not out.parent.is_dir():  # said before minutes of training, not after
        print(f"error: --out {out}: expected a file in an existing folder", file=sys.stderr)
        return 2
    found = devices()
    device = found["kind"]
    limit = 3 if args.smoke else None if args.full else args.limit_batches
    rows = {}

    def add(name: str, result: dict) -> None:  # each row as it is measured: a run cut short still shows them
        rows[name] = result
        print(row_line(name, result, device), flush=True)

    groups = [g for g in args.only if not (args.smoke and g in PEERS)]
    with tempfile.TemporaryDirectory(prefix="accelerator-run-") as tmp:
        for config in sample_configs(args.samples) if "samples" in groups else []:
            name = config.stem if config.parent.name == "configs" else "config"
            add(name, train_py_run(name, config, [], limit, Path(tmp)))
        if "gpt2" in groups:
            gpt2 = "gpt2-small" + (" (toy)" if args.smoke else "")
            overrides = gpt2_overrides(args.smoke)
            add(gpt2, train_py_run("gpt2-small", LM_SAMPLE, overrides, limit or args.limit_batches, Path(tmp)))
        # nanoGPT as its train.py runs by default: compiled, and in bfloat16 where the template computes in it
        nanogpt = ["--nanogpt", args.nanogpt, "--compile"] if args.nanogpt else []
        if "lm" in groups:
            for name, sets, peer_variant in [
                ("shakespeare_char", [], "nanogpt"),
                ("gpt2-small", gpt2_overrides(False), "nanogpt-bf16"),
            ]:
                variants = "template," + peer_variant if args.nanogpt else "template"
                result = peer(
                    "lm_benchmark.py",
                    ["--variants", variants, *nanogpt, *[a for o in sets for a in ("--set", o)]],
                    "template",
                    peer_variant,
                    "tokens_per_s",
                    Path(tmp) / f"{name}.json",
                    found,
                    "bfloat16" if sets else "float32",
                )
                add(f"lm_benchmark {name} vs nanoGPT", result)
        if "resnet" in groups:
            result = peer(
                "train_benchmark.py",
                ["--models", "cifar_resnet", "--variants", "template,torch"],
                "template",
                "torch",
                "images_per_s",
                Path(tmp) / "train.json",
                found,
            )
            add("ResNet-20 vs PyTorch", result)
        if "overhead" in groups:
            for name, result in overhead(Path(tmp) / "overhead.json").items():
                add(name, result)
    text = f"{device}, jax {found['jax']}, {found['count']} device(s)\n\n{table(rows, device)}\n"
    from files.writes import write_atomic

    write_atomic(Path(args.out), text.encode())
    print("\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
