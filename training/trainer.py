"""The training loop: epochs of jitted K-step calls, exact epoch metrics, checkpoints, early stopping, resume.

Everything the loop needs arrives built (`train.py` builds it from the config); the loop owns the run folder's
`metrics.jsonl` and checkpoints. Every shape and dtype of a batch comes from the training loader's ``spec`` (one real
batch, abstracted). Batches are split over every device of the config's mesh (``training/distributed.py``: the
devices of all processes, as a data x fsdp grid); parameters and optimizer state are replicated, or split over
"fsdp" when it is above 1, so the same code runs on one CPU, several accelerators or several machines.
"""

from __future__ import annotations

import logging
import math
import resource
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from training import checkpoint, distributed, platform, run_folder
from training.files import BEST, LATEST, METRICS, epoch_checkpoint, step_checkpoint
from training.metrics import values as metric_values
from training.precision import policy_of
from training.step import empty_stats, make_eval_step, make_train_chunk
from training.trackers import StepTrace

log = logging.getLogger("train")


class TrainingDiverged(Exception):
    pass


class Stopped(Exception):
    """A stop asked for by a signal, honoured at a step boundary after the position was saved."""

    def __init__(self, signum: int, message: str):
        super().__init__(message)
        self.signum = signum


def metric_results(metrics: Sequence, stats: dict) -> dict[str, float | list]:
    """Loss and metric values from summed statistics (host numbers; vectors become lists)."""
    stats = jax.device_get(stats)
    return {
        "loss": float(stats["loss_sum"]) / max(float(stats["count"]), 1.0),
        **metric_values(metrics, stats["metrics"]),
    }


def nbytes(spec) -> int:
    """Bytes of a batch from its spec (any pytree of arrays or ShapeDtypeStructs)."""
    return sum(math.prod(leaf.shape) * np.dtype(leaf.dtype).itemsize for leaf in jax.tree.leaves(spec))


def format_results(prefix: str, results: dict) -> str:
    return "  ".join(f"{prefix}/{k} {v:.4f}" for k, v in results.items() if isinstance(v, float))


# XLA:CPU pays a fixed cost per call; 10 steps per call reached 0.98-1.01 of a whole epoch in one call for both
# sample CNNs (benchmarks/train_benchmark.py). Stacks are prefetched whole, so their size is capped.
AUTO_STEPS = range(8, 17)
AUTO_STACK_BYTES = 64 * 2**20


def auto_steps_per_call(steps_per_epoch: int, batch_bytes: int, backend: str) -> int:
    """``trainer.steps_per_call: "auto"``: on the CPU, the K in 8..16 that pads the epoch's last call least
    (largest on ties), or the whole epoch when it is shorter; 1 on accelerators, where nothing was measured."""
    if backend != "cpu":
        return 1
    cap = max(1, AUTO_STACK_BYTES // max(batch_bytes, 1))
    if steps_per_epoch <= min(cap, AUTO_STEPS[-1]):
        return steps_per_epoch
    candidates = [k for k in AUTO_STEPS if k <= cap] or [cap]
    return min(candidates, key=lambda k: ((-steps_per_epoch) % k, -k))


def peak_rss_mb() -> float:
    """The process's peak resident memory (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (2**20 if sys.platform == "darwin" else 2**10)


class Trainer:
    def __init__(
        self, run, run_dir: Path | None, trackers: Sequence = (), config_hash: str | None = None, execution: str = "aot"
    ):
        """``run``: the assembled run (``utils.assemble``) with its data loaded: its config, components, loaders and
        optimizer are the only source of what is trained and how."""
        self.run = run
        config = self.config = run.config
        self.config_hash = config_hash
        self.trainer_cfg = config["trainer"]
        self.run_dir = run_dir  # set before fit(); a new run's folder is created once its state is ready
        model, loss_fn, metrics, augment = run.model, run.loss_fn, run.metrics, run.augment
        self.model, self.loss_fn, self.metrics = model, loss_fn, metrics
        optimizer, self.lr_fn = run.optimizer()  # the one learning rate: the step's and the logged
        self.optimizer = optimizer
        train_loader, valid_loader = run.loaders["train"], run.loaders.get("validation")
        self.train_loader, self.valid_loader = train_loader, valid_loader
        self.trackers = list(trackers)

        # the config's mesh over the devices of every process; batches split over all of them, parameters and
        # optimizer state split over "fsdp" (replicated when it is 1)
        self.mesh = distributed.make_mesh(config.get("mesh"))
        self.replicated = NamedSharding(self.mesh, P())
        devices = self.mesh.size
        for loader, split in ((train_loader, "train"), (valid_loader, "validation")):
            if loader is not None and loader.batch_size % devices:
                where = f" ({jax.process_count()} processes)" if jax.process_count() > 1 else ""
                raise ValueError(
                    f"data_loader.{split}.args.batch_size {loader.batch_size} must be a multiple of "
                    f"the {devices} devices in use{where}"
                )
        self.share_batches(train_loader, valid_loader)
        self.batch_spec = train_loader.spec
        self.augment = augment
        # "aot": compiled ahead of time for the loader's shapes; "jit": compiled at the first call (what
        # jax_debug_nans needs to re-run a step op by op); "eager": under jax.disable_jit, op by op (--no-jit)
        self.execution = execution
        self.callbacks = list(run.callbacks)
        self.in_step = [c for c in self.callbacks if c.update is not None]  # keep a state in the training state
        self.evaluated = next((c for c in self.callbacks if c.evaluated), None)
        self.stop_training = None  # a reason set by a callback: the run ends before its next epoch
        self.accumulate = self.trainer_cfg["accumulate_steps"]  # loader batches per optimizer step
        self.steps_per_epoch = -(-len(train_loader) // self.accumulate)
        self.policy = policy_of(self.trainer_cfg["precision"])
        self.steps_per_call = self.trainer_cfg["steps_per_call"]
        if self.steps_per_call == "auto":
            self.steps_per_call = auto_steps_per_call(
                self.steps_per_epoch, self.accumulate * nbytes(self.batch_spec), jax.default_backend()
            )
        self.first_call_logged = False
        self.stats_template = None
        self.compiling = None  # the training step's compilation under way (a Future)
        self.compiled_eval, self.eval_batch_size = None, None

        self.ts_sharding = (
            self.replicated
            if self.mesh.shape["fsdp"] == 1
            else distributed.state_shardings(self.state_template(), self.mesh)
        )
        self.chunk_fn = self.chunk_with(optimizer)
        self.train_chunk = jax.jit(
            self.chunk_fn, donate_argnums=(0, 1), out_shardings=(self.ts_sharding, self.replicated, self.replicated)
        )
        self.eval_step = jax.jit(
            make_eval_step(model, loss_fn, metrics, augment, self.policy),
            donate_argnums=(2,),
            out_shardings=self.replicated,
        )
        self.epoch = 0  # epochs completed
        self.monitor = run.monitor
        self.best, self.best_epoch = None, None
        self.bad_epochs = 0
        self.min_loss = math.inf  # the lowest step loss so far, for trainer.divergence_factor
        self.resumed_header = None
        self.position, self.resumed_totals = 0, None  # steps of the epoch under way done before a resume
        self.stop_signal = None  # set by request_stop (a signal handler); honoured at the next step boundary
        self.last_save = (0, time.monotonic())  # (step, time) of the last checkpoint, for checkpoint_every
        self.writer = run_folder.Writer(background=self.trainer_cfg["async_checkpoints"])
        self.trace = None

    # ------------------------------------------------------------------------------------------------- state
    @property
    def input_spec(self):
        return self.batch_spec["input"]

    @property
    def model_input_spec(self):
        """The input as the model sees it: after the deterministic part of the augmentation (e.g. uint8 images
        converted and normalised)."""
        if self.augment is None:
            return self.input_spec
        return jax.eval_shape(lambda b: self.augment(b, None, train=False, outputs=None), self.batch_spec)["input"]

    def init_state(self) -> dict:
        """Fresh training state from the config's seed, built by one jitted call (no eager per-layer work)."""
        seed = self.config["seed"]
        traced = jax.jit(self.fresh_state, out_shardings=self.ts_sharding).trace(seed)
        self.start_compile(traced.out_info)  # the training step compiles on another thread meanwhile
        self.ts = traced.lower().compile(platform.xla_options("init", jax.default_backend()) or None)(seed)
        self.origin = f"fresh state from seed {seed}"
        return self.ts

    def check_memory(self) -> None:
        """Refuses, before anything is allocated, a run whose state and stacked batches alone exceed the memory of
        the devices (a ValueError naming the numbers): it would otherwise stall or be killed mid-compile."""
        from training import memory

        template = self.state_template()
        shardings = (
            self.ts_sharding if isinstance(self.ts_sharding, dict) else dict.fromkeys(template, self.ts_sharding)
        )
        held = {key: memory.shard_bytes(value, shardings[key]) for key, value in template.items()}
        batches = self.steps_per_call * self.accumulate  # one call's stack, split over every device
        parts = {
            "parameters": held["params"],
            "their gradients": held["params"],
            "optimizer state": held["opt_state"],
            "other state": sum(held.values()) - held["params"] - held["opt_state"],
            f"{batches} stacked batch(es)": -(-batches * nbytes(self.batch_spec) // self.mesh.size),
        }
        local = [d for d in self.mesh.devices.flat if d.process_index == jax.process_index()]
        reason = memory.refusal(parts, local)
        if reason:
            largest = max(parts, key=parts.get)
            hint = (
                "lower trainer.accumulate_steps, trainer.steps_per_call or the batch size"
                if "batch" in largest
                else "make the model smaller (model.args) or split it over more devices (mesh.fsdp)"
            )
            raise ValueError(f"this run {reason}: {hint}; nothing was written")

    def state_template(self) -> dict:
        return jax.eval_shape(lambda: self.fresh_state(0))

    def fresh_state(self, seed) -> dict:
        """The training state a run starts from: init and dropout keys both derive from `seed`."""
        init_key, rng = jax.random.split(jax.random.PRNGKey(seed))
        params, state = self.model.init(init_key, self.model_input_spec)
        fresh = {
            "params": params,
            "state": state,
            "opt_state": self.optimizer.init(params),
            "step": jnp.zeros((), jnp.int32),
            "rng": rng,
        }
        if self.policy.scaled:
            fresh["loss_scale"] = self.policy.init_scale()
        if self.in_step:
            fresh["callbacks"] = {c.name: c.init(params) for c in self.in_step}
        return fresh

    def chunk_with(self, optimizer) -> Callable:
        """The K-step training call with `optimizer` (the config's, or the lr_finder's range)."""
        return make_train_chunk(
            self.model, self.loss_fn, optimizer, self.metrics, self.augment, self.accumulate, self.policy, self.in_step
        )

    def build_optimizer(self, lr: Callable):
        """The config's optimizer with the learning rate `lr` (a function of the step) instead of its own."""
        return self.run.optimizer(lr)[0]

    def eval_params(self):
        """The parameters evaluation uses: a callback's (e.g. an average of the parameters), else the trained."""
        if self.evaluated is None:
            return self.ts["params"]
        return self.ts["callbacks"][self.evaluated.name]["params"]

    def restore(self, path: Path) -> None:
        """Continues from a checkpoint: state, epoch, best value and early-stopping count."""

        def template(header: dict) -> dict:
            state = self.state_template()
            if header.get("position"):  # saved mid-epoch: the epoch's statistics so far come too
                state["epoch_totals"] = self.empty_stats(state)
            return state

        tree, header = checkpoint.restore(path, template)
        self.resumed_totals = tree.pop("epoch_totals", None)
        self.position = header.get("position", 0)
        shardings = self.shardings_of(tree)
        self.start_compile(
            jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), tree, shardings)
        )
        self.ts = distributed.to_mesh(tree, shardings)  # every process read the file; each keeps its shards
        self.epoch = header["epoch"]
        self.best, self.best_epoch = header.get("best"), header.get("best_epoch")
        self.bad_epochs = header.get("bad_epochs", 0)
        self.min_loss = header.get("min_loss") if isinstance(header.get("min_loss"), float) else math.inf
        self.resumed_header = header
        self.origin = f"resumed from {path}: epoch {self.epoch}, step {header['step']}" + (
            f" ({self.position} step(s) into epoch {self.epoch + 1})" if self.position else ""
        )
        self.last_save = (header["step"], time.monotonic())
        if header.get("config_hash") != self.config_hash:
            self.origin += " (the config's model/loss/optimizer/seed differ from the checkpoint's run)"

    def load_weights(self, path: Path, exclude: Sequence[str] = ()) -> None:
        """Fine-tuning: params and model state from another checkpoint; optimizer and counters start fresh.
        Key paths under an ``exclude`` prefix (e.g. ``params.head``, a new classifier) keep their fresh values."""
        template = {"params": self.ts["params"], "state": self.ts["state"]}
        tree, _ = checkpoint.restore(path, template, only=("params", "state"), exclude=exclude)
        self.ts.update(distributed.to_mesh(tree, self.shardings_of(tree)))
        kept = f" (kept fresh: {', '.join(exclude)})" if exclude else ""
        self.origin = f"params and model state from {path}{kept}, optimizer fresh"

    def header(self) -> dict:
        return {
            "epoch": self.epoch,
            "step": int(self.ts["step"]),
            "best": self.best,
            "best_epoch": self.best_epoch,
            "bad_epochs": self.bad_epochs,
            "monitor": self.trainer_cfg["monitor"],
            "config_hash": self.config_hash,
            "data_seed": self.config["seed"],
            "min_loss": self.min_loss if math.isfinite(self.min_loss) else None,
            **({"eval_params": f"callbacks.{self.evaluated.name}.params"} if self.evaluated else {}),
        }

    # -------------------------------------------------------------------------------------------------- loop
    def stack_sharding(self, stack: dict) -> dict:
        """Stacks of K batches: split along the batch axis (the second) over every device of the mesh; ``active``
        (K,) is replicated."""
        axes = distributed.BATCH_AXES
        return jax.tree.map(lambda a: NamedSharding(self.mesh, P(None, axes) if a.ndim > 1 else P()), stack)

    def batch_sharding(self, batch: dict) -> dict:
        return jax.tree.map(lambda a: NamedSharding(self.mesh, P(distributed.BATCH_AXES)), batch)

    def put_stack(self, stack: dict) -> dict:
        """This process's rows of a stack (its loader's share) placed as one global stack."""
        return distributed.put_local(stack, self.stack_sharding(stack))

    def put_batch(self, batch: dict) -> dict:
        return distributed.put_local(batch, self.batch_sharding(batch))

    def share_batches(self, *loaders) -> None:
        """Each process reads only its rows of every batch (process by process, as the mesh orders devices)."""
        for loader in loaders:
            if loader is not None:
                loader.share = (jax.process_index(), jax.process_count())

    def shardings_of(self, state: dict) -> dict:
        """Where each leaf of a training state (or a part of one, such as a checkpoint's) lives on the mesh:
        params and optimizer state by the FSDP rule, the rest replicated."""
        return distributed.state_shardings(state, self.mesh)

    def empty_stats(self, state=None):
        """Zeroed epoch statistics on the device; ``state``: the training state or its abstract value."""
        if self.stats_template is None:  # traced once: the model is not re-traced every epoch
            state = self.ts if state is None else state
            self.stats_template = jax.device_get(
                empty_stats(
                    self.model,
                    self.loss_fn,
                    self.metrics,
                    state["params"],
                    state["state"],
                    self.batch_spec,
                    self.augment,
                )
            )
        return jax.device_put(self.stats_template, self.replicated)

    def start_compile(self, state_spec) -> None:
        """Starts compiling the training step from the state's abstract value on a worker thread: XLA compiles
        outside the GIL, so on a multi-core host this overlaps the initialisation. ``compile()`` waits for it."""
        if self.execution != "aot":
            return
        worker = ThreadPoolExecutor(1)
        self.compiling = worker.submit(self.compile_train_step, state_spec)
        worker.shutdown(wait=False)  # the thread ends with this one task

    def compile_train_step(self, state_spec):
        k = self.steps_per_call * self.accumulate  # loader batches per call
        stack_spec = jax.tree.map(lambda a: jax.ShapeDtypeStruct((k, *a.shape), a.dtype), self.batch_spec)
        stack_spec["active"] = jax.ShapeDtypeStruct((k,), jnp.float32)
        stack_spec = jax.tree.map(
            lambda a, sharding: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding),
            stack_spec,
            self.stack_sharding(stack_spec),
        )
        start = time.perf_counter()
        compiled = self.train_chunk.lower(state_spec, self.empty_stats(state_spec), stack_spec).compile(
            platform.xla_options("train", jax.default_backend()) or None
        )
        return compiled, time.perf_counter() - start

    def compile(self) -> None:
        """Compiles the training step ahead of time for the loader's fixed batch shape (the evaluation step is
        compiled at the first evaluation, off the path to the first training step).

        The loop calls these compiled executables, so a batch of another shape is an error, never a silent
        recompilation; the compile time and XLA's FLOP estimate are logged.
        """
        log.info(f"platform defaults: {platform.describe(jax.default_backend())}")
        if self.execution != "aot":  # the jitted function itself: compiled at its first call, or run op by op
            chunk = self.train_chunk if self.execution == "eager" else self.nan_located_chunk()
            self.compiled_chunk, self.compile_seconds, self.flops_per_example = chunk, 0.0, None
            log.info(f"training step: {'jitted at the first call' if self.execution == 'jit' else 'op by op'}")
            return
        if self.compiling is None:
            self.start_compile(self.ts)
        self.compiled_chunk, self.compile_seconds = self.compiling.result()
        self.compiling = None
        k = self.steps_per_call
        self.flops_per_example = None
        try:
            cost = self.compiled_chunk.cost_analysis()
            cost = cost[0] if isinstance(cost, (list, tuple)) else cost
            # XLA reports one device's program and counts the scan body once: flops of one step on a device's shard
            self.flops_per_example = float(cost["flops"]) / (self.train_loader.batch_size / self.mesh.size)
        except (KeyError, TypeError, IndexError, NotImplementedError):
            pass  # not every backend reports costs
        flops = f", ~{self.flops_per_example / 1e6:.1f} MFLOP per training example" if self.flops_per_example else ""
        log.info(f"compiled the training step ({k} step(s) per call) in {self.compile_seconds:.1f}s{flops}")

    def nan_located_chunk(self) -> Callable:
        """--detect-nans: the jitted call without donation; when jax_debug_nans finds a NaN in its outputs, the call
        runs again op by op from the same inputs (jax_debug_nans alone stops at the whole `scan`), so the error
        names the first operation that made one, with its line."""
        jitted = jax.jit(self.chunk_fn)

        def chunk(ts, totals, stack):
            try:
                return jitted(ts, totals, stack)
            except FloatingPointError:
                with jax.disable_jit():
                    return self.chunk_fn(ts, totals, stack)

        return chunk

    def train_epoch(self, epoch: int, start: int = 0, totals=None) -> dict:
        """One epoch's training steps from loader batch `start` of its order on (a resumed position, with the
        statistics `totals` it had gathered); saves the position when checkpoint_every says so or a stop was asked
        for. Positions count loader batches; steps count optimizer updates (trainer.accumulate_steps batches)."""
        from tqdm import tqdm

        loader, n = self.train_loader, self.accumulate
        batches = len(loader)
        interactive = sys.stderr.isatty()
        bar = tqdm(
            total=self.steps_per_epoch,
            initial=start // n,
            desc=f"epoch {epoch}",
            unit="step",
            leave=False,
            disable=not interactive,
        )
        totals = self.empty_stats() if totals is None else jax.device_put(totals, self.replicated)
        pending = None  # the previous call's per-step logs, read while the next call runs
        first_step = int(self.ts["step"])
        done, steps_done = 0, 0  # loader batches and steps run by this call of train_epoch
        self.skipped = start // n
        started = time.perf_counter()
        self.data_wait = 0.0
        chunks = loader.chunks(epoch, self.steps_per_call * n, self.put_stack, start)
        try:
            while True:
                waited = time.perf_counter()
                item = next(chunks, None)
                self.data_wait += time.perf_counter() - waited
                if item is None:
                    break
                real, stack = item
                real_steps = -(-real // n)
                if self.trace:
                    self.trace.before(first_step + steps_done + 1, first_step + steps_done + real_steps)
                self.ts, totals, logs = self.compiled_chunk(self.ts, totals, stack)
                if not self.first_call_logged:
                    self.log_first_call(logs, real_steps)
                if self.trace:
                    self.trace.after(first_step + steps_done + real_steps, self.ts)
                if pending is not None:
                    self.check_logs(epoch, *pending, bar)
                pending = (logs, steps_done, real_steps, first_step, started)
                done += real
                steps_done += real_steps
                if start + done < batches and self.position_save_due(first_step + steps_done):
                    self.check_logs(epoch, *pending, bar)  # a diverged state is never saved
                    pending = None
                    self.save_position(start + done, totals)
                    if self.stop_signal is not None:
                        raise Stopped(
                            self.stop_signal,
                            f"saved at step {first_step + steps_done} ({start + done} of {batches} into epoch {epoch})",
                        )
            if pending is not None:
                self.check_logs(epoch, *pending, bar)
        finally:
            # an error or a signal ends the epoch: the prefetch thread is joined and the dispatched steps finish,
            # so the process never exits with work in flight (which aborts it instead of returning its status)
            chunks.close()
            settle(self.ts)
            bar.close()
        return totals

    def log_first_call(self, logs, steps: int) -> None:
        """Start-up cost: from the command's start (``platform.STARTED_AT``) to the first call's steps done."""
        jax.block_until_ready(logs)
        self.first_call_logged = True
        self.first_call_seconds = time.time() - platform.STARTED_AT
        log.info(
            f"first {steps} training step(s) done {self.first_call_seconds:.1f}s after start "
            f"(compiling the step took {self.compile_seconds:.1f}s)"
        )

    def check_logs(self, epoch: int, logs: dict, done: int, real: int, first_step: int, started: float, bar) -> None:
        losses = np.asarray(logs["loss"])[:real]
        # float16's loss scaling skips a step whose gradients overflowed (and lowers the scale): not a divergence
        skipped = np.asarray(logs["skipped"])[:real] if "skipped" in logs else np.zeros(real, bool)
        if skipped.any():
            log.debug(f"{int(skipped.sum())} step(s) skipped by float16 loss scaling (gradients overflowed)")
        bad = np.flatnonzero(~np.isfinite(losses) & ~skipped)
        if bad.size:
            step = first_step + done + int(bad[0]) + 1
            raise TrainingDiverged(
                f"non-finite loss ({losses[bad[0]]}) at epoch {epoch}, step {step}; training stopped; {self.kept()}"
            )
        factor = self.trainer_cfg["divergence_factor"]
        for i, loss in enumerate(losses):
            if skipped[i]:
                continue
            if factor and 0 < self.min_loss and loss > factor * self.min_loss:
                step = first_step + done + i + 1
                raise TrainingDiverged(
                    f"diverging: loss {loss:.4g} at epoch {epoch}, step {step} is above "
                    f"trainer.divergence_factor {factor:g} x the lowest step loss "
                    f"{self.min_loss:.4g}; training stopped; {self.kept()}"
                )
            self.min_loss = min(self.min_loss, float(loss))
        every = self.trainer_cfg["log_every"]
        rate = (done + real) / max(time.perf_counter() - started, 1e-9)  # steps/s this epoch, up to these steps
        examples_per_s = rate * self.train_loader.batch_size * self.accumulate
        eta = (self.steps_per_epoch - self.skipped - done - real) / rate
        for i in range(real):
            step = first_step + done + i + 1
            if step % every == 0:
                values = {
                    "train/step_loss": float(losses[i]),
                    "train/lr": float(self.lr_fn(step - 1)),
                    "train/grad_norm": float(np.asarray(logs["grad_norm"])[i]),
                }
                # with a live progress bar the console shows the bar; step lines still reach train.log
                level = logging.INFO if bar.disable else logging.DEBUG
                log.log(
                    level,
                    f"epoch {epoch} step {step}: loss {values['train/step_loss']:.6f}  "
                    f"lr {values['train/lr']:.3g}  grad_norm {values['train/grad_norm']:.3f}  "
                    f"{examples_per_s:.0f} ex/s  eta {int(eta) // 60}:{int(eta) % 60:02d}",
                )
                for tracker in self.trackers:
                    tracker.log_step(step, values)
                for callback in self.callbacks:
                    callback.on_step(self, step, values)
        if not bar.disable:  # tqdm shows the ETA itself
            lr = float(self.lr_fn(first_step + done + real - 1))
            bar.set_postfix(
                {"loss": f"{losses[-1]:.4f}", "lr": f"{lr:.3g}", "ex/s": f"{examples_per_s:.0f}"}, refresh=False
            )
            bar.update(real)

    def compile_eval(self, loader) -> None:
        if self.execution != "aot":
            self.compiled_eval, self.eval_batch_size = self.eval_step, loader.batch_size
            return
        batch_spec = jax.tree.map(
            lambda a, sharding: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding),
            loader.spec,
            self.batch_sharding(loader.spec),
        )
        options = platform.xla_options("eval", jax.default_backend()) or None
        self.compiled_eval = self.eval_step.lower(
            self.ts["params"], self.ts["state"], self.empty_stats(), batch_spec
        ).compile(options)
        self.eval_batch_size = loader.batch_size

    def evaluate(self, loader, epoch: int = 0) -> dict:
        if self.eval_batch_size != loader.batch_size:
            self.compile_eval(loader)
        totals = self.empty_stats()
        params, state = self.eval_params(), self.ts["state"]
        for batch in loader.batches(epoch):
            totals = self.compiled_eval(params, state, totals, self.put_batch(batch))
        return metric_results(self.metrics, totals)

    def fit(self) -> dict | None:
        epochs = self.trainer_cfg["epochs"]
        patience = self.trainer_cfg["early_stop"]
        profile = self.trainer_cfg.get("profile")
        self.trace = StepTrace(self.run_dir / "profile", **profile) if profile else None
        self.compile()
        try:
            for callback in self.callbacks:
                callback.on_train_start(self)
            if self.stop_training:
                log.info(self.stop_training)
                return self.best
            self.train_epochs(epochs, patience)
            for callback in self.callbacks:
                callback.on_train_end(self)
        finally:
            self.writer.wait()  # the last checkpoint is on disk before the run reports how it ended
        if self.trace:
            self.trace.stop(self.ts)
        return self.best

    def train_epochs(self, epochs: int, patience: int) -> None:
        while self.epoch < epochs:
            epoch = self.epoch + 1
            start = time.perf_counter()
            ran = 1 - self.position / len(self.train_loader)  # the share of the epoch this process trains
            totals = self.train_epoch(epoch, self.position, self.resumed_totals)
            self.position, self.resumed_totals = 0, None
            train = metric_results(self.metrics, totals)  # waits for the epoch's last step
            seconds = time.perf_counter() - start
            row = {"epoch": epoch, "step": int(self.ts["step"]), **{f"train/{k}": v for k, v in train.items()}}
            if self.valid_loader is not None:
                row.update({f"val/{k}": v for k, v in self.evaluate(self.valid_loader, epoch).items()})
            row.update(
                {
                    "time/epoch_s": seconds,
                    "time/examples_per_s": ran * self.train_loader.num_examples / seconds,
                    "time/data_wait_s": self.data_wait,
                    "time/peak_rss_mb": peak_rss_mb(),
                    "lr": float(self.lr_fn(int(self.ts["step"]) - 1)),
                }
            )
            for callback in self.callbacks:
                callback.on_epoch_end(self, epoch, row)
            self.epoch = epoch
            improved = self.update_best(row, epoch)
            log.info(
                f"epoch {epoch}/{epochs}  {format_results('train', train)}  "
                + format_results("val", {k[4:]: v for k, v in row.items() if k.startswith("val/")})
                + f"  {seconds:.1f}s  {row['time/examples_per_s']:.0f} ex/s"
                + ("  *" if improved else "")
            )
            self.commit(epoch, improved, row)
            for tracker in self.trackers:
                tracker.log_epoch(epoch, row, self.best)
            if self.agreed_stop() is not None and self.epoch < epochs:
                raise Stopped(self.stop_signal, f"saved at the end of epoch {epoch}")
            if patience and self.bad_epochs >= patience:
                log.info(
                    f"early stop: {self.monitor.name} has not improved for {patience} epochs (best {self.best:.4f})"
                )
                break

    def update_best(self, row: dict, epoch: int) -> bool:
        if self.monitor is None:
            return False
        value = row.get(self.monitor.name)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            raise ValueError(f"trainer.monitor: {self.monitor.name!r} was not computed this epoch")
        if self.best is None or self.monitor.better(value, self.best):
            self.best, self.best_epoch, self.bad_epochs = value, epoch, 0
            return True
        self.bad_epochs += 1
        return False

    def commit(self, epoch: int, improved: bool, row: dict) -> None:
        """The end of an epoch, in an order a kill cannot make inconsistent: checkpoint-latest.params first (the
        commit point: its header holds the row and the best epoch), then what derives from it, then the row.
        ``run_folder.reconcile`` redoes whatever a kill left undone when the run resumes."""
        names = [LATEST]
        if improved:
            names.append(BEST)
        if epoch % self.trainer_cfg["save_period"] == 0:
            names.append(epoch_checkpoint(epoch))
        pause = self.save(self.ts, {**self.header(), "row": row}, names, row=row)
        log.debug(f"epoch {epoch} committed; the loop paused {1000 * pause:.0f} ms")
        for callback in self.callbacks:
            callback.on_checkpoint(self, names)

    def save(self, tree, header: dict, names: list[str], row: dict | None = None, rotate: int = 0) -> float:
        """Writes `tree` and `header` to the run folder's files `names`, in order, then the metrics `row`, once the
        previous save has finished. The state is copied to host memory here, at the step boundary; encoding and
        writing run on a background thread (trainer.async_checkpoints) while training goes on. ``rotate`` > 0: also
        keep only the last `rotate` numbered step checkpoints. Returns the pause the loop paid, in seconds."""
        started = time.perf_counter()
        self.writer.wait()
        # copies (the device buffers go to the next step), gathered from every device: all processes take part
        host = distributed.to_host(tree)
        run_dir = self.run_dir

        def write():
            payload = checkpoint.encode(host, header)
            path = run_dir / names[0]
            try:
                for name in names:
                    path = run_dir / name
                    checkpoint.write_atomic(path, payload)
                if row is not None:
                    path = run_dir / METRICS
                    run_folder.append_row(run_dir, row)
                if rotate:
                    numbered = sorted(run_dir.glob(step_checkpoint("*")), key=lambda p: int(p.stem.rsplit("_", 1)[1]))
                    for old in numbered[:-rotate]:
                        old.unlink()
            except OSError as error:
                kept = "nothing was changed" if path.name == names[0] else f"{names[0]} holds step {header['step']}"
                raise run_folder.RunFolderError(f"cannot write {path}: {error.strerror or error}; {kept}") from None

        if distributed.is_main():  # written once, by process 0; every process reads it on resume
            self.writer.submit(write)
        self.last_save = (header["step"], time.monotonic())
        return time.perf_counter() - started

    def request_stop(self, signum: int) -> None:
        """Called from a signal handler: the loop saves and stops at the next step boundary."""
        self.stop_signal = signum

    def position_save_due(self, step: int) -> bool:
        """Whether to save the position now (a stop was asked for, or checkpoint_every says so), agreed by every
        process: a signal or a clock seen by some processes only must not make them save (a collective) or stop
        alone. A stop asked of any process becomes every process's."""
        signum, due = distributed.max_over_processes(self.stop_signal or 0, int(self.save_due(step)))
        self.stop_signal = self.stop_signal or signum or None
        return bool(signum or due)

    def agreed_stop(self) -> int | None:
        """The stop signal any process received (every process then stops at the same boundary), or None."""
        (signum,) = distributed.max_over_processes(self.stop_signal or 0)
        self.stop_signal = self.stop_signal or signum or None
        return self.stop_signal

    def save_due(self, step: int) -> bool:
        """trainer.checkpoint_every: {"steps": N} and/or {"minutes": M} since the last checkpoint."""
        every = self.trainer_cfg.get("checkpoint_every") or {}
        last_step, last_time = self.last_save
        return ("steps" in every and step // every["steps"] > last_step // every["steps"]) or (
            "minutes" in every and time.monotonic() - last_time >= 60 * every["minutes"]
        )

    def save_position(self, position: int, totals) -> None:
        """checkpoint-latest.params in the middle of an epoch: the state, the position in the epoch's order and the
        statistics gathered so far, so the resumed run goes on with the next batch and ends bit-identical. With
        checkpoint_every.keep = N also checkpoint-step_S.params, the last N of them kept."""
        header = {**self.header(), "position": position}
        step = header["step"]
        keep = (self.trainer_cfg.get("checkpoint_every") or {}).get("keep", 0)
        names = [LATEST] + ([step_checkpoint(step)] if keep else [])
        pause = self.save({**self.ts, "epoch_totals": totals}, header, names, rotate=keep)
        log.info(
            f"checkpoint at step {step} ({position} of {len(self.train_loader)} into epoch {self.epoch + 1}); "
            f"the loop paused {1000 * pause:.0f} ms"
        )
        for callback in self.callbacks:
            callback.on_checkpoint(self, names)

    def kept(self) -> str:
        """What a stopped run leaves to continue from, for its last message."""
        try:
            self.writer.wait()
        except run_folder.RunFolderError:
            pass  # reported by the loop; what is on disk is what counts here
        latest = self.run_dir / LATEST
        written = run_folder.written_at(latest)
        if written is None:
            return "no checkpoint was written yet (no epoch ended)"
        return f"{latest} (epoch {written[0]}) is kept"


def settle(tree) -> None:
    """Waits for the computations that produce `tree` (some may have been donated: those are skipped)."""
    for leaf in jax.tree.leaves(tree):
        try:
            leaf.block_until_ready()
        except (RuntimeError, AttributeError):
            pass
