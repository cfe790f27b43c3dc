"""Language-model training throughput (tokens/s) on this machine: the template's training path on the
`shakespeare_char` sample against its fused bound, a conventional Flax + Optax loop of the same network, and
nanoGPT's own PyTorch code on its CPU recipe (4 layers x 4 heads x 128, context 64, batch 12, no dropout).

    python benchmarks/lm_benchmark.py                                  # 3 rounds of 200 steps per variant
    python benchmarks/lm_benchmark.py --nanogpt ~/src/nanoGPT          # add nanoGPT's model.py (PyTorch eager)
    python benchmarks/lm_benchmark.py --variants template,fused --steps 500 --rounds 5
    python benchmarks/lm_benchmark.py --set model.args.depth=8 ...    # another size (the same for every variant)

Variants (each in a fresh process, interleaved round by round; medians over rounds):
  template  the real path: `Trainer` with K steps per call ("auto"), the text `DataLoader` with its prefetch thread,
            metric statistics accumulated, platform defaults as `train.py` sets them
  fused     the bound: the same steps in one jitted `lax.scan` call over batches already on the device
  flax      conventional: the same network in flax.linen + optax.adamw, one jitted step per batch, Python loop
  autodiff-norm  template with layer norm differentiated through its two-pass variance, not by the written-out
            derivative of `model/modules/normalization.py`
  nanogpt   nanoGPT's `GPT` and `configure_optimizers` (from --nanogpt DIR, a checkout of nanoGPT; needs torch),
            eager PyTorch (--compile: torch.compile) on the GPU if CUDA is there, else the CPU with all cores, its
            train.py's step (forward, backward, clip 1.0, AdamW)
  bf16      template computing in bfloat16 (`trainer.precision`; float32 parameters), for CPUs with native
            bfloat16 (avx512_bf16, AMX): compare it with nanogpt-bf16, not with the float32 rows
  nanogpt-bf16  nanogpt with its forward pass and loss under CPU autocast to bfloat16, as its train.py's
            `dtype = 'bfloat16'` does
Each process compiles and warms up (template/fused: one timed-length run; flax/nanogpt: ten steps), then times
--steps steps of the config's batch. Each round starts with a process that measures the machine's matmul peak
(4096 x 4096 float32, best of 5, JAX/NumPy/PyTorch; --no-peak: none); the CPU model, core count and load average
are printed with every result, and each throughput also as a fraction of the JAX matmul peak (tokens/s x XLA's FLOP
count per training token).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks.machine import cpu_model, describe, fraction_of_peak, load_average, matmul_peak  # noqa: E402
from benchmarks.train_benchmark import (  # noqa: E402
    FirstExamples,
    base_env,
    compiled_trainer,
    peak_line,
    run_child,
    scan_flops,
    use_autodiff_norm,
)

CONFIG = REPO / "configs" / "shakespeare_char.json"
OVERRIDES: list[str] = []  # --set, for every variant's config (main sets it in each process)
VARIANTS = ["template", "fused", "flax", "nanogpt"]
NANOGPT = ("nanogpt", "nanogpt-bf16")  # the variants that need --nanogpt and PyTorch


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200, help="training steps per timed run")
    parser.add_argument("--nanogpt", help="a checkout of nanoGPT (its model.py is imported for the nanogpt variant)")
    parser.add_argument("--compile", action="store_true", help="nanogpt under torch.compile (its train.py's default)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY.PATH=VALUE",
        help="override the sample config for every variant (another model size; VALUE is JSON)",
    )
    parser.add_argument(
        "--no-peak",
        dest="peak",
        action="store_false",
        help="skip each round's matmul peak, for runs that read only the rates ('of matmul peak' is then '-')",
    )
    parser.add_argument("--out", help="also write the raw results here (JSON)")
    parser.add_argument("--child", metavar="VARIANT", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def bench_config() -> dict:
    from training.config.validation import load_config

    # the warm-up in epochs: a timed run of any length still fits it (the values do not change the work)
    config = load_config(CONFIG, ['optimizer.schedule.args.warmup_steps={"epochs": 0.05}', *OVERRIDES])
    config["trainer"]["monitor"] = "off"
    return config


def train_loader(config: dict, steps: int):
    from training.config.components import build

    loader = build(config["data_loader"]["train"], "data_loader", seed=config["seed"])
    loader.dataset = FirstExamples(loader.dataset, steps * loader.batch_size)
    return loader


def tokens_per_step(loader) -> int:
    return int(loader.spec["target"].size if "target" in loader.spec else loader.spec["input"].size)


# ------------------------------------------------------------------------------------------------- variants
def autodiff_norm_run(steps: int) -> dict:
    """The template with layer norm differentiated through its two-pass variance (not the written-out derivative)."""
    use_autodiff_norm()
    return template_run(steps)


def template_run(steps: int, compute: str = "float32") -> dict:
    import jax

    from training.metrics import metric_results
    from training.trainer import peak_rss_mb

    config = bench_config()
    if compute != "float32":
        config["trainer"]["precision"] = {"compute": compute}
    loader = train_loader(config, steps)
    trainer = compiled_trainer(config, loader)
    metric_results(trainer.run.metrics, trainer.train_epoch(0))  # warm-up: one epoch, as the fused bound does
    start = time.perf_counter()
    metric_results(trainer.run.metrics, trainer.train_epoch(1))  # waits for the last step
    seconds = time.perf_counter() - start
    jax.block_until_ready(trainer.train_state)
    return {
        "tokens_per_s": len(loader) * tokens_per_step(loader) / seconds,
        "seconds": seconds,
        "steps_per_call": trainer.steps_per_call.k,
        "compile_s": trainer.compiled.seconds[trainer.steps_per_call.k],
        "data_wait_s": trainer.data_wait,
        "peak_rss_mb": peak_rss_mb(),
        "params": sum(x.size for x in jax.tree.leaves(trainer.train_state["params"])),
        "flop_per_token": (trainer.compiled.flops_per_example or 0) * loader.batch_size / tokens_per_step(loader),
    }


def fused_run(steps: int) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from training.assembly import assemble
    from training.devices import platform
    from training.metrics import metric_results
    from training.step import empty_stats, make_train_call

    config = bench_config()
    run = assemble(config)
    loader = train_loader(config, steps)
    run.use_data({"train": loader})
    batches = list(loader.batches(1))
    epoch = jax.tree.map(lambda *leaves: np.stack(leaves), *batches)
    epoch["active"] = np.ones(len(batches), np.float32)
    epoch = jax.device_put(epoch)  # the whole run's batches on the device before timing
    model, loss_fn, metrics, (optimizer, _) = run.model, run.loss_fn, run.metrics, run.optimizer()

    def init(seed):
        params, state = model.init(jax.random.PRNGKey(seed), loader.spec["input"])
        return {
            "params": params,
            "state": state,
            "opt_state": optimizer.init(params),
            "step": jnp.zeros((), jnp.int32),
            "rng": jax.random.PRNGKey(1),
        }

    ts = jax.jit(init)(config["seed"])
    zeros = jax.device_get(empty_stats(model, loss_fn, metrics, ts["params"], ts["state"], loader.spec))
    chunk = jax.jit(make_train_call(model, loss_fn, optimizer, metrics), donate_argnums=(0, 1))
    start = time.perf_counter()
    lowered, backend = chunk.lower(ts, zeros, epoch), jax.default_backend()
    compiled = lowered.compile(platform.xla_options(platform.train_kind(lowered, backend), backend) or None)
    compile_s = time.perf_counter() - start
    ts, totals, logs = compiled(ts, jax.device_put(zeros), epoch)  # warm-up: the whole run once
    jax.block_until_ready(logs)
    start = time.perf_counter()
    ts, totals, logs = compiled(ts, jax.device_put(zeros), epoch)
    metric_results(metrics, totals)
    seconds = time.perf_counter() - start
    return {
        "tokens_per_s": len(batches) * tokens_per_step(loader) / seconds,
        "seconds": seconds,
        "compile_s": compile_s,
        "flop_per_token": scan_flops(compiled) / tokens_per_step(loader),
    }


def flax_model(args: dict):
    """nanoGPT's network in flax.linen: learned positions, pre-norm blocks, causal attention, tied head."""
    import flax.linen as nn
    import jax.numpy as jnp

    dim, heads = args["dim"], args["num_heads"]

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            causal = nn.make_causal_mask(jnp.ones(x.shape[:2]))
            x = x + nn.MultiHeadDotProductAttention(heads, use_bias=False)(nn.LayerNorm(use_bias=False)(x), mask=causal)
            y = nn.Dense(args.get("mlp_ratio", 4) * dim, use_bias=False)(nn.LayerNorm(use_bias=False)(x))
            return x + nn.Dense(dim, use_bias=False)(nn.gelu(y, approximate=False))

    class GPT(nn.Module):
        @nn.compact
        def __call__(self, ids):
            embed = nn.Embed(args["vocab_size"], dim)
            x = embed(ids) + nn.Embed(args["context"], dim)(jnp.arange(ids.shape[1]))[None]
            for _ in range(args["depth"]):
                x = Block()(x)
            return embed.attend(nn.LayerNorm(use_bias=False)(x))

    return GPT()


def flax_run(steps: int) -> dict:
    import jax
    import optax

    config = bench_config()
    loader = train_loader(config, steps)
    net = flax_model(config["model"]["args"])
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3, b2=0.99, weight_decay=0.1))
    params = jax.jit(net.init)(jax.random.PRNGKey(0), loader.spec["input"])
    opt_state = tx.init(params)

    @jax.jit
    def train_step(params, opt_state, x, y):
        def loss_fn(params):
            return optax.softmax_cross_entropy_with_integer_labels(net.apply(params, x), y).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    for _, batch in zip(range(10), loader.batches(0)):  # compile and warm up
        params, opt_state, loss = train_step(params, opt_state, batch["input"], batch["target"])
    jax.block_until_ready(loss)
    start = time.perf_counter()
    total = 0.0
    for batch in loader.batches(1):
        params, opt_state, loss = train_step(params, opt_state, batch["input"], batch["target"])
        total = total + loss
    jax.block_until_ready(total)
    seconds = time.perf_counter() - start
    return {
        "tokens_per_s": len(loader) * tokens_per_step(loader) / seconds,
        "seconds": seconds,
        "params": sum(x.size for x in jax.tree.leaves(params)),
    }


def nanogpt_run(steps: int, folder: str, bf16: bool = False, compiled: bool = False) -> dict:
    """nanoGPT's model and optimizer as its train.py uses them, on the GPU where CUDA is there, else the CPU (under
    torch.compile with --compile; float32, or its forward pass under autocast to bfloat16 with ``bf16``)."""
    import contextlib
    import importlib.util

    import numpy as np
    import torch

    # nanoGPT's model.py under a name of its own: "model" is this repository's package
    spec = importlib.util.spec_from_file_location("nanogpt_model", Path(folder) / "model.py")
    nanogpt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(nanogpt)
    GPT, GPTConfig = nanogpt.GPT, nanogpt.GPTConfig

    torch.manual_seed(0)
    torch.set_num_threads(os.cpu_count())
    device = "cuda" if torch.cuda.is_available() else "cpu"
    config = bench_config()
    args = config["model"]["args"]
    loader = train_loader(config, steps)
    model = GPT(
        GPTConfig(
            block_size=args["context"],
            vocab_size=args["vocab_size"],
            n_layer=args["depth"],
            n_head=args["num_heads"],
            n_embd=args["dim"],
            dropout=0.0,
            bias=False,
        )
    ).to(device)
    optimizer = model.configure_optimizers(0.1, 1e-3, (0.9, 0.99), device)
    if compiled:
        model = torch.compile(model)

    def step(batch):
        x, y = (torch.from_numpy(np.asarray(batch[k], np.int64)).to(device) for k in ("input", "target"))
        with torch.autocast(device, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
            _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    for _, batch in zip(range(10), loader.batches(0)):
        step(batch)
    start = time.perf_counter()
    for batch in loader.batches(1):
        loss = step(batch)
    loss.item()
    seconds = time.perf_counter() - start
    return {
        "tokens_per_s": len(loader) * tokens_per_step(loader) / seconds,
        "seconds": seconds,
        "params": sum(p.numel() for p in model.parameters()),
        "torch": torch.__version__,
    }


# ---------------------------------------------------------------------------------------------- orchestration
def child_env(variant: str) -> dict:
    from training.devices import platform

    env = base_env()
    if variant in ("template", "fused", "autodiff-norm", "bf16"):  # the peak and the peers run as their users would
        env.update(platform.process_defaults(env))
    else:
        env[platform.SWITCH] = "0"
    return env


def measure(variant: str, args) -> dict:
    command = [sys.executable, __file__, "--child", variant, "--steps", str(args.steps)]
    if args.nanogpt:
        command += ["--nanogpt", args.nanogpt]
    command += ["--compile"] * args.compile + [a for o in args.overrides for a in ("--set", o)]
    return run_child(command, child_env(variant), variant)


def main(argv=None) -> int:
    args = parse_args(argv)
    OVERRIDES[:] = args.overrides
    if args.child:
        runs = {
            "template": template_run,
            "fused": fused_run,
            "flax": flax_run,
            "peak": lambda steps: matmul_peak(),
            "autodiff-norm": autodiff_norm_run,
            "bf16": lambda steps: template_run(steps, "bfloat16"),
        }
        if args.child in NANOGPT:
            result = nanogpt_run(args.steps, args.nanogpt, bf16=args.child == "nanogpt-bf16", compiled=args.compile)
        else:
            result = runs[args.child](args.steps)
        print(json.dumps(result), flush=True)
        return 0
    variants = args.variants.split(",")
    if set(NANOGPT) & set(variants) and not args.nanogpt:
        print("nanogpt: skipped (give --nanogpt DIR, a checkout of nanoGPT, and install torch)")
        variants = [v for v in variants if v not in NANOGPT]
    print(f"{describe()}; load average (1/5/15 min) {load_average()}", flush=True)
    results, peaks = {v: [] for v in variants}, []
    load = [os.getloadavg()]
    for round_ in range(args.rounds):
        if args.peak:
            peaks.append(measure("peak", args))
            shown = ", ".join(f"{k} {v:.0f}" for k, v in peaks[-1].items())
            print(
                f"round {round_ + 1}/{args.rounds}  matmul peak GFLOP/s: {shown}  (load {load_average()})", flush=True
            )
        for variant in variants:
            result = measure(variant, args)
            results[variant].append(result)
            print(
                f"round {round_ + 1}/{args.rounds}  {variant:9s} {result['tokens_per_s']:,.0f} tokens/s  "
                f"(load {load_average()})",
                flush=True,
            )
        load.append(os.getloadavg())
    import jax

    median = {v: statistics.median(r["tokens_per_s"] for r in runs) for v, runs in results.items()}
    print(
        f"\n{cpu_model()}, {os.cpu_count()} cores, jax {jax.__version__}, {time.strftime('%Y-%m-%d %H:%M')}; "
        f"load average (1 min) during the rounds: {', '.join(f'{l[0]:.1f}' for l in load)}; "
        f"{args.steps} steps per timed run, medians of {args.rounds} runs"
    )
    print((peak_line(peaks) if peaks else "matmul peak: not measured (--no-peak)") + "\n")
    peak = max(p["jax"] for p in peaks) if peaks else None
    counted = [r["flop_per_token"] for runs in results.values() for r in runs if r.get("flop_per_token")]
    print(
        "| variant | tokens/s (median) | ms per step | template / variant | variant / fused | of matmul peak | params |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    config = bench_config()
    tokens = config["data_loader"]["train"]["args"]["batch_size"] * config["model"]["args"]["context"]
    for variant, rate in median.items():
        ratio = f"{median['template'] / rate:.2f}" if "template" in median else "-"
        bound = f"{rate / median['fused']:.2f}" if "fused" in median else "-"
        share = f"{100 * fraction_of_peak(rate, counted[0], peak):.0f}%" if counted and peak else "-"
        params = results[variant][0].get("params", "-")
        params = f"{params:,}" if isinstance(params, int) else "-"
        print(f"| {variant} | {rate:,.0f} | {1000 * tokens / rate:.1f} | {ratio} | {bound} | {share} | {params} |")
    if counted:
        print(
            f"\n~{counted[0] / 1e6:.2f} MFLOP per training token (XLA's count; 'of matmul peak' = tokens/s x that / "
            f"the JAX matmul peak)"
        )
    if "template" in results:
        runs = results["template"]
        print(
            f"\ntemplate: K = {runs[0]['steps_per_call']} steps per call, compile "
            f"{statistics.median(r['compile_s'] for r in runs):.1f} s, data wait "
            f"{100 * statistics.median(r['data_wait_s'] / r['seconds'] for r in runs):.1f}%, peak RSS "
            f"{statistics.median(r['peak_rss_mb'] for r in runs):.0f} MB"
        )
    if args.out:
        Path(args.out).write_text(
            json.dumps(
                {"cpu": cpu_model(), "load": load, "args": vars(args), "peaks": peaks, "results": results}, indent=1
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
