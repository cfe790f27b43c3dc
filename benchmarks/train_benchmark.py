"""Training throughput on this machine: the template's training path against the fused bound, a conventional
Flax + Optax loop and PyTorch eager, for the reference CNN (`mnist_cnn`), the MNIST sample (`mnist_convnext`) and the
CIFAR sample's ResNet-20 (`cifar_resnet`), with each optimisation switched off in turn. The CPU (by name), its cores,
the load average and the machine's matmul peak (measured in the same run) are printed with the results, and every
throughput also as a fraction of that peak.

    python benchmarks/train_benchmark.py                        # all three models, 3 rounds, 100 steps per epoch
    python benchmarks/train_benchmark.py --models mnist_cnn,mnist_convnext --steps 0   # whole MNIST epochs
    python benchmarks/train_benchmark.py --models mnist_cnn --variants template,fused,flax --steps 50
    python benchmarks/train_benchmark.py --models cifar_resnet --steps 20   # ~0.7 s per ResNet-20 step on 2 cores

Variants (each measured in a fresh process, since platform defaults are per process):
  template      the real path: `Trainer` (K steps per call, "auto"), the MNIST `DataLoader` with its prefetch
                thread, metric statistics accumulated, no checkpoints; platform defaults as `train.py` sets them
  fused         the bound: the same epoch in one jitted `lax.scan` call over batches already on the device
  flax          conventional: flax.linen model + optax, one jitted step per batch, Python loop, XLA defaults
  torch         the peer a user would pick instead: the same network in PyTorch eager (NCHW; on the GPU where CUDA
                is there, else all cores), AdamW with the same schedule and clipping, one step per batch; skipped
                with a note when torch is not installed (it is never a requirement of the template)
  K=1           template with one step per call
  no-hugetlb    template without GLIBC_TUNABLES=glibc.malloc.hugetlb=1
  no-xla-opts   template without the per-executable XLA:CPU options
  autodiff-conv template with plain autodiff for the non-depthwise convolutions (no custom VJP)
  window-pool   template with max pooling as lax.reduce_window (mnist_cnn)
  conv-first-layer  template with the one-input-channel convolution trained as an XLA convolution (mnist_cnn),
                not as shifted-slice products and a matrix product over taps
  lax-depthwise template with depthwise convolutions as grouped lax convolutions (mnist_convnext)
  conv-weight-grad  template with the weight gradients of ungrouped convolutions as XLA convolutions, not as one
                matrix product per kernel tap
  autodiff-norm template with batch/layer/group norm differentiated through the two-pass variance, not by the
                written-out derivative (mnist_convnext, cifar_resnet)
  no-prefetch   template with batches prepared in the loop (DataLoader prefetch=0)
  no-augment    template without the CIFAR sample's random crop and flip (normalisation only) (cifar_resnet)
  bf16          template computing in bfloat16 (`trainer.precision`: float32 parameters, bfloat16 products), for
                CPUs with native bfloat16 (avx512_bf16, AMX); compare it with torch-bf16, not the float32 peers
  torch-bf16    the PyTorch peer under CPU autocast to bfloat16 (forward and loss; float32 parameters)
  torch-best    the PyTorch peer at its best: torch.compile, channels-last tensors, cuDNN's autotuner, TF32 matrix
                products (JAX's default on a GPU); compare it with template on the same card (`torch_step`)
  torch-best-bf16  torch-best under autocast to bfloat16 (forward and loss); compare it with bf16
  A+B           template with both ablations, e.g. K=1+no-hugetlb (a per-step loop without the malloc default)
  startup       `python train.py`: seconds from the command to its first call's steps done, and the compile time

Each process compiles, warms up with one epoch (the flax and torch loops: ten steps), then times one epoch of --steps
batches (the first --steps * 128 training examples; 0: all; the two 10-30x slower ablations: 30 steps after one
call). Each round starts with a fresh process that times a 4096 x 4096 float32 matrix product (best of 5) in JAX,
NumPy and PyTorch (when installed): the matmul peak. Variants are interleaved round by round so that load changes on
a shared machine hit them alike; the table reports per-variant medians over rounds, ratios of medians, and the
median rate times XLA's FLOP count per training example over the best JAX matmul peak of the rounds (load only
lowers a peak). MNIST is read from
../shared/data/mnist when present, else data/mnist.

cifar_resnet is the sample configs/cifar10_resnet.json (ResNet-20 with batch norm, SGD with Nesterov momentum, weight
decay, cosine schedule; on the device: random crop, horizontal flip, normalisation of uint8 images) trained on random
uint8 images of CIFAR's shape (32 x 32 x 3, 10 classes) from an .npz file through the `arrays` loader: an offline
machine has no CIFAR-10, and a step's time does not depend on the pixels. `fused`, `flax` and `torch` train on the
same images normalised (`fused` on the device, the peers on the host, outside their timed steps' devices), without
the random crop and flip, whose cost the `no-augment` variant shows.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform as host
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
SHARED_MNIST = REPO.parent / "shared" / "data" / "mnist"
MODELS = ("mnist_cnn", "mnist_convnext", "cifar_resnet")
VARIANTS = {
    "mnist_cnn": [
        "template",
        "fused",
        "flax",
        "torch",
        "K=1",
        "no-hugetlb",
        "K=1+no-hugetlb",
        "no-xla-opts",
        "autodiff-conv",
        "window-pool",
        "conv-first-layer",
        "conv-weight-grad",
        "no-prefetch",
        "startup",
    ],
    "mnist_convnext": [
        "template",
        "fused",
        "flax",
        "torch",
        "K=1",
        "no-hugetlb",
        "K=1+no-hugetlb",
        "no-xla-opts",
        "autodiff-conv",
        "lax-depthwise",
        "conv-weight-grad",
        "autodiff-norm",
        "no-prefetch",
        "startup",
    ],
    "cifar_resnet": [
        "template",
        "fused",
        "flax",
        "torch",
        "no-augment",
        "K=1",
        "no-hugetlb",
        "no-xla-opts",
        "conv-weight-grad",
        "autodiff-norm",
    ],
}
BATCH = 128
SLOW = {"autodiff-conv", "lax-depthwise"}  # 10-20x slower: timed on at most 30 steps after one warm-up call
SLOW_STEPS = 30
TORCH = ("torch", "torch-bf16", "torch-best", "torch-best-bf16")  # the variants that need PyTorch
PEERS = ("flax", *TORCH, "peak")  # run as their users would: no platform defaults


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--variants", help="comma-separated subset (default: all for each model)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=100, help="batches per timed epoch (0: the whole epoch)")
    parser.add_argument("--out", help="also write the raw results here (JSON)")
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "VARIANT"), help=argparse.SUPPRESS)
    return parser.parse_args(argv)


# ------------------------------------------------------------------------------------------- one measurement
def data_dir() -> str:
    return str(SHARED_MNIST if (SHARED_MNIST / "train-images-idx3-ubyte.gz").is_file() else REPO / "data" / "mnist")


CIFAR_SAMPLE = REPO / "configs" / "cifar10_resnet.json"
CIFAR_EXAMPLES = 50_000  # CIFAR-10's training set: a whole epoch


def cifar_like(steps: int) -> Path:
    """Random uint8 images of CIFAR-10's shape and random labels, enough for `steps` batches, in an .npz file made
    once per size (atomically: rounds run in fresh processes)."""
    import numpy as np

    from files.writes import atomic_output

    rows = steps * BATCH if steps else CIFAR_EXAMPLES
    path = Path(tempfile.gettempdir()) / f"train-benchmark-cifar-like-{rows}.npz"
    if not path.is_file():
        rng = np.random.default_rng(0)
        with atomic_output(path) as f:
            np.savez(
                f,
                images=rng.integers(0, 256, (rows, 32, 32, 3), np.uint8),
                labels=rng.integers(0, 10, rows).astype(np.int32),
            )
    return path


def bench_config(model: str, steps: int = 0, augment: bool = True) -> dict:
    """The model's training config with its train loader only; cifar_resnet: the CIFAR sample on random images
    (``augment`` false: its normalisation only)."""
    from training.config.validation import load_config

    if model == "cifar_resnet":
        config = load_config(CIFAR_SAMPLE, [])
        ops = config["data_loader"]["train"]["augment"]
        config["data_loader"] = {
            "train": {
                "name": "arrays",
                "args": {
                    "path": str(cifar_like(steps)),
                    "input": "images",
                    "target": "labels",
                    "batch_size": BATCH,
                    "shuffle": True,
                },
                "augment": ops if augment else [op for op in ops if op["name"] == "normalize"],
            }
        }
    else:
        # the sample's schedule over its full run (430 steps x 5 epochs), not "all" of the few steps measured here,
        # whose length would fall below the warm-up
        config = load_config(
            REPO / "config.json", [f"model.name={model}", "model.args={}", "optimizer.schedule.args.decay_steps=2150"]
        )
        config["data_loader"] = {
            "train": {
                "name": "mnist",
                "args": {"split": "train", "batch_size": BATCH, "shuffle": True, "data_dir": data_dir()},
            }
        }
    config["trainer"]["monitor"] = "off"
    return config


def host_normalize(config: dict):
    """The batch input as the template's `normalize` op makes it, computed in numpy (for the peers); the identity
    when the config has no such op."""
    import numpy as np

    ops = {op["name"]: op.get("args", {}) for op in config["data_loader"]["train"].get("augment", [])}
    if "normalize" not in ops:
        return lambda x: x
    mean = np.asarray(ops["normalize"]["mean"], np.float32)
    std = np.asarray(ops["normalize"]["std"], np.float32)
    return lambda x: (x.astype(np.float32) / np.float32(np.iinfo(x.dtype).max) - mean) / std


class FirstExamples:
    """The first n examples of a dataset (a timed epoch shorter than the real one)."""

    def __init__(self, dataset, n: int):
        self.dataset, self.n = dataset, min(n, len(dataset)) if n else len(dataset)
        self.preprocessing = getattr(dataset, "preprocessing", None)

    def __len__(self):
        return self.n

    def get_batch(self, indices):
        return self.dataset.get_batch(indices)


def compiled_trainer(config: dict, loader):
    """The template's Trainer for `config` on `loader`, state initialised and training step compiled (its FLOPs
    counted, for the reports' FLOP rates)."""
    from training import startup
    from training.assembly import assemble
    from training.trainer import Trainer

    run = assemble(config)
    run.use_data({"train": loader})
    trainer = Trainer(run, Path(tempfile.mkdtemp()), count_flops=True)
    trainer.begin(startup.from_seed(trainer))
    trainer.log_compile()
    trainer.first_call_logged = True
    return trainer


def use_autodiff_norm():
    """Ablation `autodiff-norm`: the normalisation layers differentiated through the two-pass variance, not by
    their written-out derivative: the same function without its custom JVP rule."""
    from model.modules import normalization

    normalization.normalize = normalization.normalize.fun


def template_run(model_name: str, variant: str, steps: int) -> dict:
    """The template with the ablations named in ``variant`` ("template", or names joined by "+")."""
    import jax

    from model.kernels import conv as cpu_conv
    from model.kernels import depthwise as cpu_depthwise
    from model.modules import pooling
    from training.config.components import build
    from training.devices import platform
    from training.metrics import metric_results

    ablations = set(variant.split("+"))
    if "no-xla-opts" in ablations:
        platform.XLA_CPU_OPTIONS = {}
    if "autodiff-conv" in ablations:
        cpu_conv.conv = cpu_conv.canonical_conv  # the plain lax convolution and its autodiff gradient
    if "window-pool" in ablations:

        def window_max(self, params, x):
            return jax.lax.reduce_window(
                x, -jax.numpy.inf, jax.lax.max, (1, *self.kernel_size, 1), (1, *self.stride, 1), "VALID"
            )

        pooling.MaxPool2d.forward = window_max
    if "conv-first-layer" in ablations:
        cpu_conv.is_single_channel = lambda *args: False
    if "lax-depthwise" in ablations:
        cpu_depthwise.is_plain_depthwise = lambda *args: False
    if "conv-weight-grad" in ablations:
        cpu_conv.is_tap_weight_grad = lambda *args: False
    if "autodiff-norm" in ablations:
        use_autodiff_norm()
    config = bench_config(model_name, steps, augment="no-augment" not in ablations)
    if "K=1" in ablations:
        config["trainer"]["steps_per_call"] = 1
    if "bf16" in ablations:
        config["trainer"]["precision"] = {"compute": "bfloat16"}
    spec = config["data_loader"]["train"]
    if "no-prefetch" in ablations:
        spec["args"]["prefetch"] = 0
    loader = build(spec, "data_loader", seed=config["seed"])
    loader.dataset = FirstExamples(loader.dataset, steps * BATCH)
    trainer = compiled_trainer(config, loader)
    if ablations & SLOW:  # warm up with one call
        k = trainer.steps_per_call.k
        _, stack = next(iter(loader.stacks(0, k, trainer.placement.put_stack)))
        call = trainer.compiled.train_call(k)
        trainer.train_state, _, logs = call(trainer.train_state, trainer.compiled.empty_stats(), stack)
        jax.block_until_ready(logs)
    else:  # warm up with one epoch, as the fused bound does
        metric_results(trainer.run.metrics, trainer.train_epoch(0))
    start = time.perf_counter()
    metric_results(trainer.run.metrics, trainer.train_epoch(1))  # waits for the last step
    seconds = time.perf_counter() - start
    from training.trainer import peak_rss_mb

    return {
        "images_per_s": loader.num_examples / seconds,
        "seconds": seconds,
        "data_wait_s": trainer.data_wait,
        "compile_s": trainer.compiled.seconds[trainer.steps_per_call.k],
        "steps_per_call": trainer.steps_per_call.k,
        "peak_rss_mb": peak_rss_mb(),
        "mflop_per_example": (trainer.compiled.flops_per_example or 0) / 1e6,
    }


def fused_run(model_name: str, steps: int) -> dict:
    import jax
    import numpy as np

    from training.assembly import assemble
    from training.devices import platform
    from training.metrics import metric_results
    from training.step import empty_stats, make_train_call

    run = assemble(bench_config(model_name, steps, augment=False))
    config, augment = run.config, run.augment
    loader = run.load_data(["train"])["train"]
    loader.dataset = FirstExamples(loader.dataset, steps * BATCH)
    run.use_data({"train": loader})  # the schedule over the steps timed
    batches = list(loader.batches(1))
    epoch = {k: np.stack([b[k] for b in batches]) for k in batches[0]}
    epoch["active"] = np.ones(len(batches), np.float32)
    epoch = jax.device_put(epoch)  # the whole epoch on the device before timing
    model, loss_fn, metrics, (optimizer, _) = run.model, run.loss_fn, run.metrics, run.optimizer()

    one = {k: v[0] for k, v in epoch.items() if k != "active"}
    seen = augment.spec(one) if augment else one  # the batch as the model sees it

    def init(seed):
        params, state = model.init(
            jax.random.PRNGKey(seed), jax.ShapeDtypeStruct(seen["input"].shape, seen["input"].dtype)
        )
        return {
            "params": params,
            "state": state,
            "opt_state": optimizer.init(params),
            "step": jax.numpy.zeros((), jax.numpy.int32),
            "rng": jax.random.PRNGKey(1),
        }

    ts = jax.jit(init)(config["seed"])
    zeros = jax.device_get(empty_stats(model, loss_fn, metrics, ts["params"], ts["state"], seen))
    chunk = jax.jit(make_train_call(model, loss_fn, optimizer, metrics, augment), donate_argnums=(0, 1))
    start = time.perf_counter()
    lowered, backend = chunk.lower(ts, zeros, epoch), jax.default_backend()
    compiled = lowered.compile(platform.xla_options(platform.train_kind(lowered, backend), backend) or None)
    compile_s = time.perf_counter() - start
    ts, acc, logs = compiled(ts, jax.device_put(zeros), epoch)  # warm-up: one whole epoch
    jax.block_until_ready(logs)
    start = time.perf_counter()
    ts, acc, logs = compiled(ts, jax.device_put(zeros), epoch)
    metric_results(metrics, acc)
    seconds = time.perf_counter() - start
    return {
        "images_per_s": loader.num_examples / seconds,
        "seconds": seconds,
        "compile_s": compile_s,
        "mflop_per_example": scan_flops(compiled) / BATCH / 1e6,
    }


def scan_flops(compiled) -> float:
    """XLA's FLOP count of a compiled `lax.scan` over steps: the body once, i.e. one step (0 if not reported)."""
    try:
        cost = compiled.cost_analysis()
        return float((cost[0] if isinstance(cost, (list, tuple)) else cost)["flops"])
    except (KeyError, TypeError, IndexError, NotImplementedError):
        return 0.0


def flax_model(model_name: str):
    """The same networks in flax.linen (Flax's own conv, max pool, LayerNorm, BatchNorm, Dense); ``train``
    switches batch norm to the batch's statistics."""
    import functools

    import flax.linen as nn
    import jax

    class CNN(nn.Module):
        @nn.compact
        def __call__(self, x, train=True):
            for c in (32, 64):
                x = nn.max_pool(nn.relu(nn.Conv(c, (3, 3))(x)), (2, 2), (2, 2))
            x = nn.relu(nn.Dense(128)(x.reshape(x.shape[0], -1)))
            return nn.Dense(10)(x)

    class ConvNeXt(nn.Module):
        @nn.compact
        def __call__(self, x, train=True):
            x = nn.LayerNorm(1e-6)(nn.Conv(32, (4, 4), 2)(x))
            for i, dim in enumerate((32, 64)):
                if i:
                    x = nn.Conv(dim, (2, 2), 2)(nn.LayerNorm(1e-6)(x))
                for _ in range(2):
                    y = nn.Conv(dim, (7, 7), feature_group_count=dim)(x)
                    y = nn.Dense(4 * dim)(nn.LayerNorm(1e-6)(y))
                    x = x + nn.Dense(dim)(jax.nn.gelu(y, approximate=False))
            return nn.Dense(10)(nn.LayerNorm(1e-6)(x.mean((1, 2))))

    class ResNet20(nn.Module):
        """He et al.'s CIFAR ResNet-20 as the template's cifar_resnet builds it (1x1 projection shortcuts)."""

        @nn.compact
        def __call__(self, x, train=True):
            norm = functools.partial(nn.BatchNorm, use_running_average=not train, momentum=0.9, epsilon=1e-5)
            x = nn.relu(norm()(nn.Conv(16, (3, 3), use_bias=False)(x)))
            for i, width in enumerate((16, 32, 64)):
                for b in range(3):
                    stride = 2 if i and not b else 1
                    y = nn.relu(norm()(nn.Conv(width, (3, 3), stride, use_bias=False)(x)))
                    y = norm()(nn.Conv(width, (3, 3), use_bias=False)(y))
                    if stride > 1:
                        x = norm()(nn.Conv(width, (1, 1), stride, use_bias=False)(x))
                    x = nn.relu(x + y)
            return nn.Dense(10)(x.mean((1, 2)))

    return {"mnist_cnn": CNN, "mnist_convnext": ConvNeXt, "cifar_resnet": ResNet20}[model_name]()


def schedule_args(config: dict, steps_per_epoch: int) -> tuple[str, dict]:
    """The config's schedule: its name and arguments, "all" decay steps counted."""
    spec = config["optimizer"]["schedule"]
    args = dict(spec["args"])
    if args.get("decay_steps") == "all":
        args["decay_steps"] = config["trainer"]["epochs"] * steps_per_epoch
    return spec["name"], args


def optax_schedule(config: dict, steps_per_epoch: int):
    """The config's schedule as a Flax user writes it: optax's own."""
    import optax

    name, args = schedule_args(config, steps_per_epoch)
    if name == "cosine_decay":
        return optax.cosine_decay_schedule(args["init_value"], args["decay_steps"])
    return optax.warmup_cosine_decay_schedule(
        args["init_value"], args["peak_value"], args["warmup_steps"], args["decay_steps"]
    )


def peer_schedule(config: dict, steps_per_epoch: int):
    """The config's schedule as a Python function of the step (optax's and the template's definitions)."""
    import math

    name, args = schedule_args(config, steps_per_epoch)
    if name == "cosine_decay":
        return lambda step: (
            args["init_value"] * 0.5 * (1 + math.cos(math.pi * min(step, args["decay_steps"]) / args["decay_steps"]))
        )
    warmup, decay = args["warmup_steps"], args["decay_steps"]

    def warmup_cosine(step):
        if step < warmup:
            return args["init_value"] + (args["peak_value"] - args["init_value"]) * step / warmup
        t = min(step - warmup, decay - warmup)
        return args["peak_value"] * 0.5 * (1 + math.cos(math.pi * t / (decay - warmup)))

    return warmup_cosine


def peer_is_sgd(config: dict) -> bool:
    """The CIFAR sample's optimizer (SGD, Nesterov momentum 0.9, weight decay added to the gradient) rather than the
    MNIST configs' AdamW with clipping."""
    return config["optimizer"]["name"] == "sgd"


def weight_decay(config: dict) -> float:
    transforms = {t["name"]: t.get("args", {}) for t in config["optimizer"].get("transforms", [])}
    return transforms.get("add_decayed_weights", {}).get("weight_decay", 0.0)


def flax_run(model_name: str, steps: int) -> dict:
    import functools

    import jax
    import jax.numpy as jnp
    import optax

    from training.config.components import build

    config = bench_config(model_name, steps)
    loader = build(config["data_loader"]["train"], "data_loader", seed=config["seed"])
    loader.dataset = FirstExamples(loader.dataset, steps * BATCH)
    normalize = host_normalize(config)
    net = flax_model(model_name)
    schedule = optax_schedule(config, len(loader))
    if peer_is_sgd(config):
        tx = optax.chain(
            optax.add_decayed_weights(weight_decay(config)), optax.sgd(schedule, momentum=0.9, nesterov=True)
        )
    else:
        tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.05))
    first = normalize(next(iter(loader.batches(0)))["input"])
    variables = jax.jit(functools.partial(net.init, train=False))(jax.random.PRNGKey(0), jnp.zeros_like(first))
    params, stats = variables["params"], variables.get("batch_stats", {})
    opt_state = tx.init(params)

    @jax.jit
    def train_step(params, stats, opt_state, x, y):
        def loss_fn(params):
            logits, updated = net.apply({"params": params, "batch_stats": stats}, x, mutable=["batch_stats"])
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
            return loss, (logits, updated.get("batch_stats", {}))

        (loss, (logits, stats)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), stats, opt_state, loss, jnp.mean(logits.argmax(-1) == y)

    for _, batch in zip(range(10), loader.batches(0)):  # compile and warm up
        params, stats, opt_state, loss, accuracy = train_step(
            params, stats, opt_state, normalize(batch["input"]), batch["target"]
        )
    jax.block_until_ready(loss)
    start = time.perf_counter()
    total = jnp.zeros(2)
    for batch in loader.batches(1):
        params, stats, opt_state, loss, accuracy = train_step(
            params, stats, opt_state, normalize(batch["input"]), batch["target"]
        )
        total = total + jnp.stack([loss, accuracy])
    jax.block_until_ready(total)
    seconds = time.perf_counter() - start
    return {"images_per_s": loader.num_examples / seconds, "seconds": seconds}


def torch_model(model_name: str):
    """The same networks in PyTorch (NCHW, as PyTorch users write them): same layers, widths and paddings."""
    from torch import nn

    if model_name == "mnist_cnn":
        return nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(64 * 7 * 7, 128),
            nn.ReLU(),
            nn.Linear(128, 10),
        )

    class ChannelNorm(nn.LayerNorm):
        """LayerNorm over the channels of an NCHW tensor."""

        def forward(self, x):
            return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)

    class Block(nn.Module):
        """ConvNeXt block as in its reference code: depthwise conv, then the MLP channels-last."""

        def __init__(self, dim):
            super().__init__()
            self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
            self.norm = nn.LayerNorm(dim, eps=1e-6)
            self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

        def forward(self, x):
            y = self.norm(self.dwconv(x).permute(0, 2, 3, 1))
            return x + self.fc2(nn.functional.gelu(self.fc1(y))).permute(0, 3, 1, 2)

    class ConvNeXt(nn.Module):
        def __init__(self):
            super().__init__()
            self.features = nn.Sequential(
                nn.Conv2d(1, 32, 4, 2, padding=1),
                ChannelNorm(32, eps=1e-6),
                Block(32),
                Block(32),
                ChannelNorm(32, eps=1e-6),
                nn.Conv2d(32, 64, 2, 2),
                Block(64),
                Block(64),
            )
            self.norm, self.head = nn.LayerNorm(64, eps=1e-6), nn.Linear(64, 10)

        def forward(self, x):
            return self.head(self.norm(self.features(x).mean((2, 3))))

    class BasicBlock(nn.Module):
        def __init__(self, previous, width, stride):
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(previous, width, 3, stride, padding=1, bias=False),
                nn.BatchNorm2d(width),
                nn.ReLU(),
                nn.Conv2d(width, width, 3, padding=1, bias=False),
                nn.BatchNorm2d(width),
            )
            self.shortcut = (
                nn.Identity()
                if stride == 1 and previous == width
                else nn.Sequential(nn.Conv2d(previous, width, 1, stride, bias=False), nn.BatchNorm2d(width))
            )

        def forward(self, x):
            return nn.functional.relu(self.body(x) + self.shortcut(x))

    if model_name == "cifar_resnet":  # ResNet-20 with 1x1 projection shortcuts, as the template builds it
        blocks, previous = [nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU()], 16
        for i, width in enumerate((16, 32, 64)):
            for b in range(3):
                blocks.append(BasicBlock(previous, width, 2 if i and not b else 1))
                previous = width
        return nn.Sequential(*blocks, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))
    return ConvNeXt()


def torch_run(model_name: str, steps: int, bf16: bool = False, best: bool = False) -> dict:
    """PyTorch on the GPU where CUDA is there, else on all cores: the same network and optimizer (AdamW with the
    config's schedule and clipping; for the CIFAR sample SGD with Nesterov momentum and weight decay), batch 128;
    eager, or with ``best`` as PyTorch's own performance guides have it (``torch_step``); ``bf16``: the forward pass
    and the loss under autocast to bfloat16."""
    import torch

    from training.config.components import build

    torch.manual_seed(0)
    torch.set_num_threads(os.cpu_count())
    device = "cuda" if torch.cuda.is_available() else "cpu"
    config = bench_config(model_name, steps)
    loader = build(config["data_loader"]["train"], "data_loader", seed=config["seed"])
    loader.dataset = FirstExamples(loader.dataset, steps * BATCH)
    # channels-last weights before the optimizer holds them: cuDNN's NHWC kernels, no layout transposes
    layout = torch.channels_last if best else torch.preserve_format
    net = torch_model(model_name).to(device, memory_format=layout).train()
    sgd = peer_is_sgd(config)
    if sgd:
        optimizer = torch.optim.SGD(
            net.parameters(), lr=1.0, momentum=0.9, nesterov=True, weight_decay=weight_decay(config)
        )
    else:
        optimizer = torch.optim.AdamW(net.parameters(), lr=1.0, weight_decay=0.05)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, peer_schedule(config, len(loader)))
    step = torch_step(net, optimizer, schedule, host_normalize(config), device, clip=not sgd, bf16=bf16, best=best)
    start = time.perf_counter()
    for _, batch in zip(range(10), loader.batches(0)):  # warm up (best: compiles the forward and backward)
        step(batch)
    warm_up_s = time.perf_counter() - start
    start = time.perf_counter()
    total = torch.zeros(2, device=device)
    for batch in loader.batches(1):
        total += step(batch)
    total.tolist()
    seconds = time.perf_counter() - start
    return {
        "images_per_s": loader.num_examples / seconds,
        "seconds": seconds,
        "warm_up_s": warm_up_s,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "device": device,
        "params": sum(p.numel() for p in net.parameters()),
    }


def torch_step(net, optimizer, schedule, normalize, device: str, clip: bool, bf16: bool = False, best: bool = False):
    """One training step of the PyTorch peer on a batch of NHWC arrays: the loss and accuracy on the device.

    ``best``: what PyTorch's performance guides ask of a convolutional network on a GPU, so that the ratio is to
    PyTorch at its best: ``torch.compile`` (its default mode), channels-last inputs (with `net`'s weights made
    channels-last by the caller), cuDNN's autotuner, and TF32 matrix products, as JAX's default precision uses on
    the GPU (cuDNN's convolutions take TF32 by default in both)."""
    import contextlib

    import torch

    layout = torch.channels_last if best else torch.contiguous_format
    forward = net
    if best:
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = True
        forward = torch.compile(net)

    def step(batch):
        # NHWC to NCHW as a view: channels-last strides, which `layout` keeps or makes contiguous
        x = torch.from_numpy(normalize(batch["input"])).permute(0, 3, 1, 2).contiguous(memory_format=layout)
        x, y = x.to(device), torch.from_numpy(batch["target"]).long().to(device)
        with torch.autocast(device, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
            logits = forward(x)
            loss = torch.nn.functional.cross_entropy(logits, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        return torch.stack([loss.detach(), (logits.detach().argmax(1) == y).float().mean()])

    return step


def peak_run() -> dict:
    """The machine's matmul peak in GFLOP/s (JAX, NumPy, PyTorch when installed), in a process of its own."""
    from benchmarks.machine import matmul_peak

    return matmul_peak()


def startup_run(model_name: str) -> dict:
    """`python train.py` on the model for one epoch, stopped once its first call is done."""
    import re
    import signal

    with tempfile.TemporaryDirectory() as save_dir:
        command = [
            sys.executable,
            "-X",
            "importtime",
            "train.py",
            "-c",
            "config.json",
            "--set",
            f"model.name={model_name}",
            "--set",
            "model.args={}",
            "--set",
            f"trainer.save_dir={save_dir}",
            "--epochs",
            "1",
        ]
        process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        imported, found = set(), None
        for line in process.stdout:
            if line.startswith("import time:"):
                imported.add(line.rsplit("|", 1)[-1].strip().split(".")[0])
            found = re.search(
                r"first (\d+) training step\(s\) done ([\d.]+)s after start \(compiling the step "
                r"took ([\d.]+)s\)",
                line,
            )
            if found:
                break
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=120)
    if not found:
        raise RuntimeError("train.py did not report its first steps")
    heavy = sorted(imported & {"tensorflow", "wandb", "onnx", "onnxruntime", "tf2onnx", "jax2onnx", "flax", "optax"})
    return {
        "first_call_s": float(found.group(2)),
        "compile_s": float(found.group(3)),
        "steps_in_first_call": int(found.group(1)),
        "heavy_imports": heavy,
    }


def child(model_name: str, variant: str, steps: int) -> dict:
    if set(variant.split("+")) & SLOW:
        steps = min(steps or SLOW_STEPS, SLOW_STEPS)
    if variant == "fused":
        return fused_run(model_name, steps)
    if variant == "flax":
        return flax_run(model_name, steps)
    if variant in TORCH:
        return torch_run(model_name, steps, bf16=variant.endswith("-bf16"), best=variant.startswith("torch-best"))
    if variant == "peak":
        return peak_run()
    if variant == "startup":
        return startup_run(model_name)
    return template_run(model_name, variant, steps)


# ---------------------------------------------------------------------------------------------- orchestration
def base_env() -> dict:
    """This process's environment without the platform settings it may carry: each child chooses its own."""
    from training.devices import platform

    drop = ("GLIBC_TUNABLES", platform.SWITCH, "_TRAIN_PLATFORM_REEXECUTED", "_TRAIN_STARTED_AT")
    return {k: v for k, v in os.environ.items() if k not in drop}


def child_env(variant: str) -> dict:
    from training.devices import platform

    env = base_env()
    if variant not in PEERS + ("startup",) and "no-hugetlb" not in variant.split("+"):  # train.py sets its own
        env.update(platform.process_defaults(env))
    if variant in PEERS:
        env[platform.SWITCH] = "0"
    return env


def run_child(command: list[str], env: dict, what: str) -> dict:
    """A measurement in a fresh process: the last JSON line it prints."""
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        raise RuntimeError(f"{what} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return json.loads(lines[-1])


def measure(model_name: str, variant: str, steps: int) -> dict:
    command = [sys.executable, __file__, "--child", model_name, variant, "--steps", str(steps)]
    return run_child(command, child_env(variant), f"{model_name} {variant}")


def machine() -> dict:
    import jax
    import jaxlib

    from benchmarks.machine import cpu_model

    return {
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "python": host.python_version(),
        "device": str(jax.devices()[0]),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }


def median(results: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in results)


def peak_line(peaks: list[dict]) -> str:
    """The matmul peaks measured during the rounds: median (range) per library."""
    parts = []
    for library in ("jax", "numpy", "torch"):
        rates = [p[library] for p in peaks if library in p]
        if rates:
            parts.append(f"{library} {max(rates):.0f} ({min(rates):.0f}-{max(rates):.0f})")
    return (
        f"matmul peak, 4096 x 4096 float32, best of 5 per round, best (range) of {len(peaks)} rounds, GFLOP/s: "
        + ", ".join(parts)
        + "; 'of matmul peak' divides by the best JAX figure"
    )


def report(model_name: str, results: dict[str, list[dict]], peak: float | None = None) -> str:
    """The model's table; ``peak``: the JAX matmul peak in GFLOP/s (adds each variant's fraction of it)."""
    from benchmarks.machine import fraction_of_peak

    template = median(results["template"], "images_per_s") if "template" in results else None
    fused = median(results["fused"], "images_per_s") if "fused" in results else None
    counted = [r["mflop_per_example"] for runs in results.values() for r in runs if r.get("mflop_per_example")]
    mflop = counted[0] if counted else None  # XLA's count for the network, the same for every variant
    lines = [
        f"### {model_name}",
        "",
        "| variant | images/s (median) | range | runs | template / variant | variant / fused | of matmul peak |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for variant, runs in results.items():
        if variant == "startup":
            continue
        rate = median(runs, "images_per_s")
        ratio = f"{template / rate:.2f}" if template else "-"
        bound = f"{rate / fused:.2f}" if fused else "-"
        share = f"{100 * fraction_of_peak(rate, mflop * 1e6, peak):.0f}%" if mflop and peak else "-"
        rates = [r["images_per_s"] for r in runs]
        lines.append(
            f"| {variant} | {rate:,.0f} | {min(rates):,.0f}-{max(rates):,.0f} | {len(runs)} | {ratio} | "
            f"{bound} | {share} |"
        )
    if "template" in results:
        runs = results["template"]
        wait = statistics.median(r["data_wait_s"] / r["seconds"] for r in runs)
        lines += [
            "",
            f"template: K = {runs[0]['steps_per_call']} steps per call, data wait {100 * wait:.1f}% of "
            f"the epoch, compile {median(runs, 'compile_s'):.1f} s, peak RSS "
            f"{median(runs, 'peak_rss_mb'):.0f} MB",
        ]
    if mflop:
        lines.append(
            f"~{mflop:.1f} MFLOP per training example (XLA's count; 'of matmul peak' = images/s x that / "
            f"the JAX matmul peak)"
        )
    if "torch" in results:
        lines.append(
            f"torch: PyTorch {results['torch'][0]['torch']} eager, {results['torch'][0]['threads']} "
            f"threads, {results['torch'][0]['params']:,} parameters"
        )
    for variant in ("torch-best", "torch-best-bf16"):
        if variant in results:
            lines.append(
                f"{variant}: PyTorch {results[variant][0]['torch']} on {results[variant][0]['device']}, ten warm-up "
                f"steps with the compilation {median(results[variant], 'warm_up_s'):.1f} s"
            )
    if "startup" in results:
        runs = results["startup"]
        first, compile_s = median(runs, "first_call_s"), median(runs, "compile_s")
        lines.append(
            f"startup: `python train.py` to its first {runs[0]['steps_in_first_call']} steps done "
            f"{first:.1f} s = {first / compile_s:.2f} x the step's compile time ({compile_s:.1f} s); "
            f"TensorFlow/WandB/ONNX/Flax imported: {', '.join(runs[0]['heavy_imports']) or 'none'}"
        )
    return "\n".join(lines)


def available(variants: list[str]) -> tuple[list[str], list[str]]:
    """The variants this machine can run, and a note for each one left out (torch when it is not installed)."""
    if set(TORCH) & set(variants) and importlib.util.find_spec("torch") is None:
        return (
            [v for v in variants if v not in TORCH],
            ["torch: skipped, PyTorch is not installed (it is optional: `pip install torch` to compare)"],
        )
    return variants, []


def main(argv=None) -> int:
    from benchmarks.machine import describe, load_average

    args = parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child, args.steps)), flush=True)
        return 0
    models = args.models.split(",")
    chosen, notes = {}, []
    for m in models:
        chosen[m], skipped = available(args.variants.split(",") if args.variants else VARIANTS[m])
        notes += [note for note in skipped if note not in notes]
    for note in notes:
        print(note, flush=True)
    print(f"{describe()}; load average (1/5/15 min) {load_average()}", flush=True)
    results = {m: {v: [] for v in chosen[m]} for m in models}
    peaks, load = [], [os.getloadavg()]
    for round_ in range(args.rounds):
        peaks.append(measure("-", "peak", 0))
        shown = ", ".join(f"{k} {v:.0f}" for k, v in peaks[-1].items())
        print(f"round {round_ + 1}/{args.rounds}  matmul peak GFLOP/s: {shown}  (load {load_average()})", flush=True)
        for model_name in models:
            for variant in chosen[model_name]:
                result = measure(model_name, variant, args.steps)
                result["load"] = os.getloadavg()[0]
                results[model_name][variant].append(result)
                shown = (
                    f"{result['images_per_s']:,.0f} images/s"
                    if "images_per_s" in result
                    else f"first call {result['first_call_s']:.1f} s, compile {result['compile_s']:.1f} s"
                )
                print(
                    f"round {round_ + 1}/{args.rounds}  {model_name:15s} {variant:14s} {shown}  "
                    f"(load {load_average()})",
                    flush=True,
                )
        load.append(os.getloadavg())
    info = machine()
    peak = max(p["jax"] for p in peaks) if peaks else None
    print(
        f"\n{info['cpu']}, {info['cores']} cores; jax {info['jax']} (jaxlib {info['jaxlib']}), Python "
        f"{info['python']}, {info['device']}, {info['date']}; XLA_FLAGS={info['xla_flags'] or '(none)'}; "
        f"load average (1 min) during the rounds: {', '.join(f'{l[0]:.1f}' for l in load)}; "
        f"{args.steps or 'all'} steps of {BATCH} per timed epoch, medians of {args.rounds} runs"
    )
    if peaks:
        print(peak_line(peaks))
    print()
    for model_name in models:
        print(report(model_name, results[model_name], peak) + "\n")
    if args.out:
        Path(args.out).write_text(
            json.dumps(
                {"machine": info, "load": load, "args": vars(args), "peaks": peaks, "results": results}, indent=1
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
