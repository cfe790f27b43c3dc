"""What a GPU step waits on, in one command for a short spell on a lent machine: fused attention's agreement with the
plain math, GPT-2 small with either attention and XLA's untried settings against nanoGPT under torch.compile, the ten
largest kernels of its step and what each computes, ResNet-20 against PyTorch at its best, and small samples with
and without their loop captured into one CUDA graph.

    python benchmarks/gpu_step_benchmark.py --nanogpt ~/src/nanoGPT --out gpu_step.md
    python benchmarks/gpu_step_benchmark.py --only parity,profile --steps 20
    python benchmarks/gpu_step_benchmark.py --only gpt2-options --gpt2-options O3,triton-gemm-any
    python benchmarks/gpu_step_benchmark.py --smoke      # on the CPU: tiny shapes, no peers, no resnet, no graphs

Parts (--only picks some; each in a fresh process, so JAX and PyTorch never share the card):
  parity   cuDNN's fused attention against the plain math on GPT-2 small's shapes (batch 4, 12 heads of 64, 1024
           positions, causal), in bfloat16: the forward pass and the gradients of q, k and v, each against the plain
           math in float32 (relative norm of the difference, and the largest difference)
  gpt2     lm_benchmark.py at GPT-2 small's shapes (accelerator_run.py's), computing in bfloat16: the template with
           model.args.attention "auto" and "plain", and nanoGPT with torch.compile and bf16 autocast (--nanogpt)
  profile  the template's GPT-2-small step ("auto" attention) under jax.profiler: the ten kernels that take the most
           device time, their share of it, the device's busy time against the wall time of a step, and what each
           kernel computes, from the compiled program's HLO: a fusion's kind, result and the ops it fuses (on a CPU,
           XLA's thunks stand for the kernels)
  profile-config  the same for config.json's ConvNeXt, 64 steps, and profile-lm for the language-model sample at
           its own size, 256 steps: small steps, where the wall time over the kernels' time is the host's share
  resnet   train_benchmark.py's ResNet-20 (--resnet-steps batches of random CIFAR-shaped images; default: an epoch)
           against PyTorch at its best (torch.compile, channels-last, cuDNN's autotuner), in float32 and in bfloat16
           (its autocast), the template and its peer in one call for each
  gpt2-options  a template row of gpt2 ("auto") for each of --gpt2-options (GPT2_OPTIONS: a vocabulary padded
           to 128, XLA's effort level O3, and XLA's Triton matrix products tried for every product, used alone, or
           switched off), each written to --out as it is measured
  graphs   config.json and shakespeare_char through train.py (two epochs of --limit-batches batches; the second
           is the row), as XLA compiles by default and with the step's while loop captured as one CUDA graph
           (XLA's command buffers, WHILE and CONDITIONAL added to the default types)
Writes the tables to --out and prints them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PARTS = ("parity", "gpt2", "profile", "profile-config", "profile-lm", "resnet", "gpt2-options", "graphs")
# the profiled steps: (config, overrides, steps) from the arguments
PROFILED = {
    "profile": lambda args: (
        "configs/shakespeare_char.json",
        ['optimizer.schedule.args.warmup_steps={"epochs": 0.05}', *gpt2_sets(args.smoke, "auto")],
        args.steps,
    ),
    "profile-config": lambda args: ("config.json", [], 64),
    "profile-lm": lambda args: (
        "configs/shakespeare_char.json",
        ['optimizer.schedule.args.warmup_steps={"epochs": 0.05}'],
        256,
    ),
}
# XLA's command buffers: the default types plus the step's loop (the K steps of a call) and its conditionals
GRAPH_FLAGS = {"XLA default": "", "loop captured": "--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL"}
GRAPH_SAMPLES = ("config.json", "configs/shakespeare_char.json")
# the settings not yet tried on a GPU, each a template row of GPT-2 small (--set overrides, environment), in the order
# they run: those that add no autotuning first. The XLA flags are those of the XLA that jax 0.12 ships (an unknown
# one aborts the process: that row fails alone).
GPT2_OPTIONS = {
    # nanoGPT's padding of GPT-2's 50257 tokens to 50304: the head's and the embedding's rows a multiple of 64
    "vocab-128": (["model.args.vocab_size=128"], {}),
    # XLA's effort level; on a GPU, O1 and above add while-loop double buffering (the steps of a call are a loop)
    "O3": ([], {"JAX_OPTIMIZATION_LEVEL": "O3"}),
    # what Triton's products add today: cuBLAS for every one
    "no-triton-gemm": ([], {"XLA_FLAGS": "--xla_gpu_enable_triton_gemm=false"}),
    # XLA keeps Triton for the products it expects it to win (those with ops fused in); this: every one it can take
    "triton-gemm-any": ([], {"XLA_FLAGS": "--xla_gpu_triton_gemm_any=true"}),
    # and without cuBLAS to fall back to where the autotuner finds it faster
    "triton-gemm-only": ([], {"XLA_FLAGS": "--xla_gpu_triton_gemm_any=true --xla_gpu_cublas_fallback=false"}),
}
# the resnet part: the template and PyTorch at its best at each precision (train_benchmark.py's variants)
RESNET_PAIRS = {"float32": ("template", "torch-best"), "bfloat16": ("bf16", "torch-best-bf16")}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=",".join(PARTS), help=f"some of {', '.join(PARTS)} (default: all)")
    parser.add_argument("--nanogpt", help="a checkout of nanoGPT (its model.py), for the gpt2 part's peer")
    parser.add_argument("--attentions", default="auto,plain", help="the gpt2 part's model.args.attention values")
    parser.add_argument(
        "--gpt2-options",
        default=",".join(GPT2_OPTIONS),
        help=f"the gpt2-options part's rows: some of {', '.join(GPT2_OPTIONS)} ('' for none)",
    )
    parser.add_argument("--steps", type=int, default=100, help="timed training steps of GPT-2 small")
    parser.add_argument(
        "--resnet-steps", type=int, default=0, help="the resnet part's timed batches (default: 0, a whole epoch, 390)"
    )
    parser.add_argument("--limit-batches", type=int, default=200, help="the graphs part's batches per epoch")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on any device, no peers (a CPU check)")
    parser.add_argument("--out", default="gpu_step.md", help="where the tables go (default: %(default)s)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.only = [p.strip() for p in args.only.split(",") if p.strip()]
    if not args.only or any(p not in PARTS for p in args.only):
        parser.error(f"--only: expected some of {', '.join(PARTS)}, got {args.only}")
    args.gpt2_options = [o.strip() for o in args.gpt2_options.split(",") if o.strip()]
    if any(o not in GPT2_OPTIONS for o in args.gpt2_options):
        parser.error(f"--gpt2-options: expected some of {', '.join(GPT2_OPTIONS)}, got {args.gpt2_options}")
    return args


def gpt2_sets(smoke: bool, attention: str) -> list[str]:
    from benchmarks.accelerator_run import gpt2_overrides

    return [*gpt2_overrides(smoke), f'model.args.attention="{attention}"']


# ------------------------------------------------------------------------------------------------ children
def parity(smoke: bool) -> dict:
    """Fused and plain attention in bfloat16 against the plain math in float32, forward and gradients."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from model.modules import attention

    b, t, h, d = (2, 32, 2, 16) if smoke else (4, 1024, 12, 64)
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    q, k, v, cotangent = (jax.random.normal(key, (b, t, h, d), jnp.float32) for key in keys)
    mask = attention.causal_mask(t, t)

    def plain(q, k, v):
        return attention.dot_product_attention(q, k, v, mask)

    def fused(q, k, v):
        return attention.fused_attention(q, k, v, causal=True)

    def value_and_grads(fn, dtype):
        @jax.jit
        def run(q, k, v, cotangent):
            out, pullback = jax.vjp(fn, *(a.astype(dtype) for a in (q, k, v)))
            return (out, *pullback(cotangent.astype(dtype)))

        return [np.asarray(x.astype(jnp.float32)) for x in run(q, k, v, cotangent)]

    reference = value_and_grads(plain, jnp.float32)
    results = {}
    for name, fn in (("plain bf16", plain), ("fused bf16", fused)):
        try:
            got = value_and_grads(fn, jnp.bfloat16)
        except Exception as error:  # cuDNN missing or refusing: the row says so
            results[name] = {"error": f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"}
            continue
        results[name] = {
            part: {
                "relative": float(np.linalg.norm(g - r) / np.linalg.norm(r)),
                "max_abs": float(np.abs(g - r).max()),
                "finite": bool(np.isfinite(g).all()),
            }
            for part, g, r in zip(("output", "dq", "dk", "dv"), got, reference)
        }
    return {"shape": [b, t, h, d], "device": jax.devices()[0].device_kind, "results": results}


def profile(config_path: str, overrides: list[str], steps: int, folder: str) -> dict:
    """A sample's step (its config with `overrides`), its kernels by device time, from a jax.profiler trace of one
    epoch of `steps` steps after one that compiled and warmed it."""
    import jax

    from benchmarks.train_benchmark import FirstExamples, compiled_trainer
    from training.config.components import build
    from training.config.validation import load_config
    from training.metrics import metric_results

    # the warm-up in epochs where the schedule has one: a timed run of any length still fits it
    config = load_config(REPO / config_path, overrides)
    config["trainer"]["monitor"] = "off"
    loader = build(config["data_loader"]["train"], "data_loader", seed=config["seed"])
    loader.dataset = FirstExamples(loader.dataset, steps * loader.batch_size)
    trainer = compiled_trainer(config, loader)
    metric_results(trainer.run.metrics, trainer.train_epoch(0))  # compiled, "auto" decided, warm
    jax.block_until_ready(trainer.train_state)
    jax.profiler.start_trace(folder)
    start = time.perf_counter()
    metric_results(trainer.run.metrics, trainer.train_epoch(1))
    jax.block_until_ready(trainer.train_state)
    wall = time.perf_counter() - start
    jax.profiler.stop_trace()
    (path,) = Path(folder).rglob("*.xplane.pb")
    data = jax.profiler.ProfileData.from_file(str(path))
    try:
        text = trainer.compiled.train_call(trainer.steps_per_call.k).as_text() or ""
    except Exception as error:  # a program without its HLO (one read back from a cache, say): kernels still listed
        text, hlo_error = "", f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:200]}"
    else:
        hlo_error = "" if text else "the compiled program gave no HLO text"
    instructions, computations = hlo_instructions(text)
    module = text.split(",", 1)[0].removeprefix("HloModule").strip()
    lines = [line for plane in data.planes for line in plane.lines]
    lines_seen = {line.name: sum(1 for _ in line.events) for line in lines}
    gpu = [line for plane in data.planes if plane.name.startswith("/device:GPU") for line in plane.lines]
    if gpu:  # the streams' kernels; the derived lines (XLA modules, ops, steps) repeat them
        events = [(event, dict(event.stats)) for line in gpu if line.name.startswith("Stream") for event in line.events]
    else:  # a CPU: the step program's thunks, each an event naming its HLO op; its loops hold the others

        def own_work(stats: dict) -> bool:  # an op of the step's program, not a loop or call around others
            op = instructions.get(str(stats.get("hlo_op")))
            return stats.get("hlo_module") == module and op is not None and op[0] not in HLO_CONTAINERS

        events = [(event, dict(event.stats)) for line in lines for event in line.events]
        events = [(event, stats) for event, stats in events if own_work(stats)]
    kernels: dict[str, list] = {}
    for event, stats in events:
        entry = kernels.setdefault(event.name, [0.0, 0, str(stats.get("hlo_op", stats.get("tf_op", "")))])
        entry[0] += event.duration_ns
        entry[1] += 1
    busy = sum(e[0] for e in kernels.values())
    top = sorted(kernels.items(), key=lambda item: -item[1][0])[:10]
    # each kernel's HLO: what a fusion named "loop_add_fusion_24" adds up, from the program the epoch ran
    found = {n: kernel_instruction(n, e[2], instructions) for n, e in top}
    return {
        "config": config_path,
        "steps": steps,
        "steps_per_call": trainer.steps_per_call.k,
        "wall_ms_per_step": 1e3 * wall / steps,
        "busy_ms_per_step": busy / 1e6 / steps,
        "kernels_per_step": sum(e[1] for e in kernels.values()) / steps,
        "lines": lines_seen,
        "hlo_error": hlo_error,
        "top": [
            {
                "name": n,
                "ms_per_step": e[0] / 1e6 / steps,
                "share": e[0] / busy,
                "calls": e[1] / steps,
                "op": found[n] or e[2],
                "hlo": fused_ops(found[n], instructions, computations) if found[n] else "",
            }
            for n, e in top
        ],
    }


# an HLO instruction's line: "%name = type opcode(operands), attributes"; a computation's: "%name (params) -> type {"
HLO_LINE = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+) = (.*?) ([a-z][a-z0-9\-]*)\((.*)$")
HLO_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%([\w.\-]+) .*\{$")
# bookkeeping rather than work: left out of a fusion's list of ops
HLO_PLUMBING = {"parameter", "constant", "bitcast", "tuple", "get-tuple-element"}
# ops that run other computations: a CPU profile's event for one spans those of the ops it runs
HLO_CONTAINERS = {"while", "call", "conditional", "async-start", "async-done"}


def hlo_instructions(text: str) -> tuple[dict, dict]:
    """A compiled program's HLO text -> (instruction name -> (opcode, type, the rest of its line), computation name
    -> its instructions' names in order)."""
    instructions, computations, current = {}, {}, None
    for line in text.splitlines():
        if found := HLO_COMPUTATION.match(line):
            current = computations.setdefault(found.group(1), [])
        elif (found := HLO_LINE.match(line)) and current is not None:
            name, type_, opcode, rest = found.groups()
            instructions[name] = (opcode, re.sub(r"\{[^{}]*\}", "", type_), rest)
            current.append(name)
    return instructions, computations


def fused_ops(name: str, instructions: dict, computations: dict) -> str:
    """What the HLO instruction `name` computes, briefly: a fusion's kind, result and the ops of its computation
    (nested fusions' included) with their result types, counted; any other instruction its opcode (a custom call's
    target) and result; "" for a name the program does not have."""
    if name not in instructions:
        return ""
    opcode, type_, rest = instructions[name]
    if opcode != "fusion":
        target = re.search(r'custom_call_target="([^"]+)"', rest)
        return f"{opcode}{' ' + target.group(1) if target else ''} -> {type_}"
    kind = re.search(r"kind=(k\w+)", rest)
    counts: dict[str, int] = {}
    pending = re.findall(r"calls=%([\w.\-]+)", rest)
    while pending:
        for inner in computations.get(pending.pop(0), []):
            op, inner_type, inner_rest = instructions[inner]
            if op == "fusion":
                pending += re.findall(r"calls=%([\w.\-]+)", inner_rest)
            elif op not in HLO_PLUMBING:
                element = re.match(r"\(?(\w+)", inner_type)  # a tuple's first
                key = f"{op} {element.group(1) if element else inner_type}"
                counts[key] = counts.get(key, 0) + 1
    ranked = sorted(counts.items(), key=lambda item: -item[1])  # the most frequent first, ties in program order
    ops = ", ".join(f"{op} x{n}" if n > 1 else op for op, n in ranked)
    return f"{kind.group(1) if kind else 'fusion'} -> {type_}: {ops}"


def kernel_instruction(kernel: str, hlo_op: str, instructions: dict) -> str | None:
    """The HLO instruction a profiled kernel ran: the event's own hlo_op where the program has it, else the kernel's
    name read as the instruction's (the GPU's kernel names are the fusions' with "." and "-" as "_")."""
    if hlo_op in instructions:
        return hlo_op
    if kernel in instructions:
        return kernel
    sanitized = {re.sub(r"[^\w]", "_", name): name for name in instructions}
    return sanitized.get(kernel)


# ---------------------------------------------------------------------------------------------- orchestration
def child(part: str, args, folder: str) -> dict:
    command = [sys.executable, __file__, "--child", part, "--steps", str(args.steps)] + ["--smoke"] * args.smoke
    return run_json(command, Path(folder) / f"{part}.json", part)


def run_json(command: list, out: Path, label: str, env: dict | None = None):
    """`command` with ``--out out`` in a fresh process (with `env` added to this one's environment): the JSON it
    wrote, or {"error": its exception's line}."""
    print(f"[{time.strftime('%H:%M:%S')}] {label}", flush=True)
    environ = {**os.environ, **(env or {})}
    if env and "XLA_FLAGS" in env:  # added to flags already set, not instead of them
        environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {env['XLA_FLAGS']}".strip()
    done = subprocess.run([*command, "--out", str(out)], cwd=REPO, capture_output=True, text=True, env=environ)
    if done.returncode:
        return {"error": last_error(done)}
    return json.loads(out.read_text())


def last_error(done) -> str:
    """The exception's own line of a failed child's stderr (JAX appends a note after it)."""
    lines = [
        line for line in done.stderr.strip().splitlines() if line.strip() and not line.startswith("For simplicity")
    ]
    errors = [line for line in lines if not line.startswith(" ") and ("Error" in line or "error" in line)]
    return ((errors or lines or [f"exit status {done.returncode}"])[-1])[:300]


def lm(args, attention: str, variants: str, folder: str, option: str = "") -> dict:
    """lm_benchmark.py's `variants` (one round, no matmul peak) at GPT-2 small's shapes with `attention`, and the
    overrides and environment of GPT2_OPTIONS[`option`] where one is named."""
    sets, env = GPT2_OPTIONS[option] if option else ([], {})
    command = [sys.executable, str(REPO / "benchmarks" / "lm_benchmark.py"), "--rounds", "1", "--no-peak"]
    command += ["--steps", str(args.steps), "--variants", variants]
    command += [a for s in [*gpt2_sets(args.smoke, attention), *sets] for a in ("--set", s)]
    if args.nanogpt and "nanogpt" in variants:
        command += ["--nanogpt", args.nanogpt, "--compile"]
    name = f"gpt2-{attention}{'-' + option if option else ''}"
    found = run_json(command, Path(folder) / f"{name}.json", f"{name} ({variants})", env)
    return found if "error" in found else found["results"]


def resnet(steps: int, folder: str) -> dict:
    """train_benchmark.py's ResNet-20 (the CIFAR sample on random images, `steps` batches of 128; 0: an epoch): for
    each precision of RESNET_PAIRS, the template and PyTorch at its best in one call (one round, each in a process
    of its own), so that their ratio is of one card in one run; a pair that fails says why in its rows."""
    rows = {}
    for precision, pair in RESNET_PAIRS.items():
        command = [
            sys.executable,
            str(REPO / "benchmarks" / "train_benchmark.py"),
            "--rounds",
            "1",
            "--steps",
            str(steps),
        ]
        command += ["--models", "cifar_resnet", "--variants", ",".join(pair)]
        found = run_json(command, Path(folder) / f"resnet-{precision}.json", f"resnet {precision} ({', '.join(pair)})")
        rows[precision] = found if "error" in found else found["results"]["cifar_resnet"]
    return rows


def graphs(args, folder: str) -> dict:
    from benchmarks.accelerator_run import train_py_run

    rows = {}
    for config in GRAPH_SAMPLES:
        for label, flags in GRAPH_FLAGS.items():
            os.environ["XLA_FLAGS"] = flags
            name = f"{Path(config).stem}-{len(rows)}"
            print(f"[{time.strftime('%H:%M:%S')}] graphs {config}: {label}", flush=True)
            rows[f"{config}, {label}"] = train_py_run(name, REPO / config, [], args.limit_batches, Path(folder))
    os.environ.pop("XLA_FLAGS", None)
    return rows


def cell(value, form: str) -> str:
    """A number in `form`, or "-" where there is none."""
    return format(value, form) if isinstance(value, (int, float)) else "-"


def tables(found: dict, steps: int) -> str:
    out = []
    if "parity" in found:
        p = found["parity"]
        out.append(f"parity, shape (batch, length, heads, head size) {p.get('shape')}, against float32 plain math:\n")
        out.append(
            "| attention | part | relative error | largest difference | finite |\n| --- | --- | --- | --- | --- |"
        )
        for name, r in p.get("results", {"error": p}).items():
            if "error" in r:
                out.append(f"| {name} | failed: {r['error']} | | | |")
                continue
            for part, v in r.items():
                out.append(f"| {name} | {part} | {v['relative']:.2e} | {v['max_abs']:.2e} | {v['finite']} |")
    if "gpt2" in found or "gpt2-options" in found:
        out.append("\nGPT-2 small, bfloat16 (lm_benchmark.py, one round):\n")
        out.append("| variant | tokens/s | ms/step | steps per call | compile s |\n| --- | --- | --- | --- | --- |")
        rows = {**found.get("gpt2", {}), **found.get("gpt2-options", {})}
        for row, results in rows.items():  # row: the attention, and the option where there is one
            if "error" in results:
                out.append(f"| template, attention {row} | failed: {results['error']} | | | |")
                continue
            for variant, runs in results.items():
                r = runs[0]
                ms = 1e3 * r["seconds"] / steps  # each variant times `steps` steps (lm_benchmark.py)
                out.append(
                    f"| {variant}, attention {row} | {r['tokens_per_s']:,.0f} | {ms:.1f} | "
                    f"{r.get('steps_per_call', '-')} | {cell(r.get('compile_s'), '.1f')} |"
                )
    for part in (p for p in PROFILED if p in found):
        p = found[part]
        if "error" in p:
            out.append(f"\n{part} failed: {p['error']}")
        else:
            out.append(
                f"\nprofile of {p['config']}'s step (K = {p['steps_per_call']}): {p['wall_ms_per_step']:.2f} ms wall, "
                f"{p['busy_ms_per_step']:.2f} ms of kernels, {p['kernels_per_step']:.0f} kernels a step"
                + (f" (no HLO: {p['hlo_error']})" if p.get("hlo_error") else "")
                + "\n"
            )
            out.append(
                "| kernel | HLO op | ms/step | share | calls/step | what it computes (HLO) |\n"
                "| --- | --- | --- | --- | --- | --- |"
            )
            for k in p["top"]:
                out.append(
                    f"| {k['name'][:70]} | {k['op'][:60]} | {k['ms_per_step']:.3f} | {k['share']:.1%} | "
                    f"{k['calls']:.0f} | {k['hlo'][:300] or '-'} |"
                )
    if "resnet" in found:
        out.append("\nResNet-20, batch 128, CIFAR-shaped random images (train_benchmark.py, one round):\n")
        out.append(
            "| precision | template, images/s | PyTorch at its best, images/s | template / PyTorch | template K | "
            "PyTorch's warm-up s |\n| --- | --- | --- | --- | --- | --- |"
        )
        for precision, results in found["resnet"].items():
            if "error" in results:
                out.append(f"| {precision} | failed: {results['error']} | | | | |")
                continue
            template, peer = (results.get(v, [None])[0] for v in RESNET_PAIRS[precision])
            ratio = template["images_per_s"] / peer["images_per_s"] if template and peer else None
            out.append(
                f"| {precision} | {cell(template and template['images_per_s'], ',.0f')} | "
                f"{cell(peer and peer['images_per_s'], ',.0f') if peer else 'not run (no PyTorch)'} | "
                f"{cell(ratio, '.2f')} | {cell(template and template['steps_per_call'], 'd')} | "
                f"{cell(peer and peer['warm_up_s'], '.1f')} |"
            )
    if "graphs" in found:
        out.append("\nsamples, loop capture (train.py, the second epoch):\n")
        out.append("| sample, XLA | rate | steps per call |\n| --- | --- | --- |")
        for name, r in found["graphs"].items():
            if "error" in r:
                out.append(f"| {name} | failed: {r['error']} | |")
            else:
                out.append(f"| {name} | {r['rate']:,.0f} {r['unit']} | {r['steps_per_call']} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        result = parity(args.smoke) if args.child == "parity" else None
        if args.child in PROFILED:
            config, overrides, steps = PROFILED[args.child](args)
            with tempfile.TemporaryDirectory(prefix="gpu-profile-") as folder:
                result = profile(config, overrides, steps, folder)
        Path(args.out).write_text(json.dumps(result))
        return 0
    from benchmarks.accelerator_run import devices

    found_devices = devices()  # asked of a child: JAX here would hold the card's memory for the whole run
    header = f"{found_devices['kind']}, jax {found_devices['jax']}, {time.strftime('%Y-%m-%d %H:%M')}\n"
    found: dict = {}

    def save() -> str:  # after each part and each option's row: a run cut short keeps what it measured
        text = header + "\n" + tables(found, args.steps)
        Path(args.out).write_text(text + "\n<!--\n" + json.dumps(found, indent=1) + "\n-->\n")
        return text

    with tempfile.TemporaryDirectory(prefix="gpu-step-") as folder:
        for part in args.only:
            if part == "parity" or part in PROFILED:
                found[part] = child(part, args, folder)
            elif part == "gpt2":
                peer = ",nanogpt-bf16" if args.nanogpt and not args.smoke else ""
                found["gpt2"] = {}
                for i, attention in enumerate(args.attentions.split(",")):
                    found["gpt2"][attention] = lm(args, attention, "template" + (peer if i == 0 else ""), folder)
            elif part == "gpt2-options":
                found["gpt2-options"] = {}
                for option in args.gpt2_options:
                    found["gpt2-options"][f"auto, {option}"] = lm(args, "auto", "template", folder, option)
                    save()
            elif part == "resnet" and not args.smoke:
                found["resnet"] = resnet(args.resnet_steps, folder)
            elif part == "graphs" and not args.smoke:
                found["graphs"] = graphs(args, folder)
            save()
            print(tables({part: found[part]}, args.steps) if part in found else "", flush=True)
    print("\n" + save())
    return 0


if __name__ == "__main__":
    sys.exit(main())
