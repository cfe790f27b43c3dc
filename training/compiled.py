"""The training state on the devices, and the compiled steps that advance it.

A state is a dict ``{"params", "state", "opt_state", "step", "rng"}`` (plus ``loss_scale`` for float16 and
``callbacks`` for callbacks that update inside the step). It lives on the config's mesh over the devices of every
process (``training/devices/mesh.py``: a data x fsdp grid): batches are split over every device; parameters and
optimizer state are replicated, or split over "fsdp" when it is above 1, so the same code runs on one CPU, several
accelerators or several machines. Every shape and dtype of a batch comes from the training loader's ``spec``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from training.config.settings import Settings
from training.devices import memory, mesh, platform
from training.precision import policy_of
from training.run import checkpoint
from training.step import empty_stats, make_eval_step, make_train_chunk

log = logging.getLogger("train")

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


class CompiledSteps:
    def __init__(self, run, settings: Settings, execution: str = "aot"):
        """``run``: the assembled run with its data loaded. ``execution``: "aot", compiled ahead of time for the
        loader's shapes; "jit", compiled at the first call (what jax_debug_nans needs to re-run a step op by op);
        "eager", under jax.disable_jit, op by op (--no-jit)."""
        self.run, self.settings, self.execution = run, settings, execution
        self.optimizer, self.lr_fn = run.optimizer()  # built with the data (``Run.optimizer``), not again here
        train_loader, valid_loader = run.loaders["train"], run.loaders.get("validation")
        self.mesh = mesh.make_mesh(run.config.get("mesh"))
        self.replicated = NamedSharding(self.mesh, P())
        if train_loader.batch_size % self.mesh.size:  # evaluation pads its batches instead (``evaluate``)
            n, size = self.mesh.size, train_loader.batch_size
            where = f" ({jax.process_count()} processes)" if jax.process_count() > 1 else ""
            nearest = " or ".join(str(b) for b in (size // n * n, size // n * n + n) if b)
            raise ValueError(
                f"data_loader.train.args.batch_size {size} must be a multiple of the {n} devices in use{where}: "
                f"{nearest}"
            )
        self.share_batches(train_loader, valid_loader)
        self.batch_spec = train_loader.spec
        self.in_step = [c for c in run.callbacks if c.update is not None]  # keep a state in the training state
        self.evaluated = next((c for c in run.callbacks if c.evaluated), None)
        self.accumulate = settings.accumulate_steps
        self.steps_per_epoch = -(-len(train_loader) // self.accumulate)
        self.policy = policy_of(settings.precision)
        self.steps_per_call = settings.steps_per_call
        if self.steps_per_call == "auto":
            self.steps_per_call = auto_steps_per_call(
                self.steps_per_epoch, self.accumulate * memory.nbytes(self.batch_spec), jax.default_backend()
            )
        self.stats_template = None
        # XLA:CPU, one process: the call places host arrays in one transfer (jax.device_put is slower per array)
        self.host_arrays = jax.process_count() == 1 and self.mesh.devices.flat[0].platform == "cpu"
        self.compiling = None  # the training step's compilation under way (a Future)
        self.compiled_chunk, self.compile_seconds, self.flops_per_example = None, 0.0, None
        self.compiled_eval, self.eval_batch_size = None, None
        fsdp = self.mesh.shape["fsdp"] > 1
        self.sharding = mesh.state_shardings(self.template(), self.mesh) if fsdp else self.replicated
        self.jit_train_chunk()
        self.eval_step = jax.jit(
            make_eval_step(run.model, run.loss_fn, run.metrics, run.augment, self.policy),
            donate_argnums=(2,),
            out_shardings=self.replicated,
        )

    def jit_train_chunk(self, schedule_length: dict | None = None) -> None:
        """The training call; ``schedule_length``: a checkpoint's, which its resumed run's schedules keep counting."""
        if schedule_length is not None:
            self.run.epochs, self.run.steps_per_epoch = schedule_length["epochs"], schedule_length["steps_per_epoch"]
        self.optimizer, self.lr_fn = self.run.optimizer()  # the one learning rate: the step's and the logged
        self.chunk_fn = self.chunk_with(self.optimizer, self.lr_fn)
        self.train_chunk = jax.jit(
            self.chunk_fn, donate_argnums=(0, 1), out_shardings=(self.sharding, self.replicated, self.replicated)
        )

    # ---------------------------------------------------------------------------------------- making a state
    @property
    def input_spec(self):
        return self.batch_spec["input"]

    @property
    def model_input_spec(self):
        """The input as the model sees it: after the deterministic part of the augmentation (e.g. uint8 images
        converted and normalised)."""
        augment = self.run.augment
        if augment is None:
            return self.input_spec
        return jax.eval_shape(lambda b: augment(b, None, train=False, outputs=None), self.batch_spec)["input"]

    def fresh(self, seed) -> dict:
        """The training state a run starts from: init and dropout keys both derive from `seed`."""
        init_key, rng = jax.random.split(jax.random.PRNGKey(seed))
        params, state = self.run.model.init(init_key, self.model_input_spec)
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

    def template(self) -> dict:
        """The state's abstract value (shapes and dtypes, nothing computed)."""
        return jax.eval_shape(lambda: self.fresh(0))

    def init(self) -> dict:
        """A fresh state from the config's seed, built by one jitted call (no eager per-layer work)."""
        seed = self.settings.seed
        traced = jax.jit(self.fresh, out_shardings=self.sharding).trace(seed)
        self.start_compile(traced.out_info)  # the training step compiles on another thread meanwhile
        return traced.lower().compile(platform.xla_options("init", jax.default_backend()) or None)(seed)

    def restore(self, path: Path) -> tuple[dict, dict, dict | None]:
        """A checkpoint's state on the mesh, its header, and the statistics of the epoch under way when it was saved
        mid-epoch (else None)."""

        def template(header: dict) -> dict:
            state = self.template()
            if header.get("position"):
                state["epoch_totals"] = self.empty_stats(state)
            return state

        tree, header = checkpoint.restore(path, template)
        self.jit_train_chunk(header.get("schedule_length"))  # before the step compiles
        totals = tree.pop("epoch_totals", None)
        shardings = mesh.state_shardings(tree, self.mesh)
        self.start_compile(mesh.with_shardings(tree, shardings))
        ts = mesh.to_mesh(tree, shardings)  # every process read the file; each keeps its shards
        return ts, header, totals

    def load_weights(self, ts: dict, path: Path, exclude: Sequence[str] = ()) -> dict:
        """Fine-tuning: params and model state from another checkpoint into `ts`. Key paths under an ``exclude``
        prefix (e.g. ``params.head``, a new classifier) keep their fresh values."""
        template = {"params": ts["params"], "state": ts["state"]}
        tree, _ = checkpoint.restore(path, template, only=("params", "state"), exclude=exclude)
        return {**ts, **mesh.to_mesh(tree, mesh.state_shardings(tree, self.mesh))}

    def check_memory(self) -> None:
        """Refuses, before anything is allocated, a run whose state and one call's stacked batches alone exceed the
        memory of the devices (a ValueError naming the numbers): it would otherwise stall or be killed mid-compile."""
        template = self.template()
        shardings = self.sharding if isinstance(self.sharding, dict) else dict.fromkeys(template, self.sharding)
        batches = self.steps_per_call * self.accumulate  # one call's stack, split over every device
        local = [d for d in self.mesh.devices.flat if d.process_index == jax.process_index()]
        stack_bytes = -(-batches * memory.nbytes(self.batch_spec) // self.mesh.size)
        memory.check_fits(template, shardings, f"{batches} stacked batch(es)", stack_bytes, local)

    def eval_params(self, ts: dict):
        """The parameters evaluation uses: a callback's (e.g. an average of the parameters), else the trained."""
        if self.evaluated is None:
            return ts["params"]
        return ts["callbacks"][self.evaluated.name]["params"]

    # ------------------------------------------------------------------------------------------ placing data
    def share_batches(self, *loaders) -> None:
        """Each process reads only its rows of every batch (process by process, as the mesh orders devices)."""
        for loader in loaders:
            if loader is not None:
                loader.share = (jax.process_index(), jax.process_count())

    def stack_sharding(self, stack: dict) -> dict:
        """Stacks of K batches: split along the batch axis (the second) over every device of the mesh; ``active``
        (K,) is replicated."""
        axes = mesh.BATCH_AXES
        return jax.tree.map(lambda a: NamedSharding(self.mesh, P(None, axes) if a.ndim > 1 else P()), stack)

    def batch_sharding(self, batch: dict) -> dict:
        return jax.tree.map(lambda a: NamedSharding(self.mesh, P(mesh.BATCH_AXES)), batch)

    def put_stack(self, stack: dict) -> dict:
        """This process's rows of a stack (its loader's share) placed as one global stack (see ``host_arrays``)."""
        return stack if self.host_arrays else mesh.put_local(stack, self.stack_sharding(stack))

    def put_batch(self, batch: dict) -> dict:
        return batch if self.host_arrays else mesh.put_local(batch, self.batch_sharding(batch))

    def empty_stats(self, state=None):
        """Zeroed epoch statistics on the device; ``state``: a training state or its abstract value (the first
        call only: the model is traced once, not every epoch)."""
        if self.stats_template is None:
            state = self.template() if state is None else state
            run = self.run
            self.stats_template = jax.device_get(
                empty_stats(
                    run.model, run.loss_fn, run.metrics, state["params"], state["state"], self.batch_spec, run.augment
                )
            )
        return jax.device_put(self.stats_template, self.replicated)

    # ------------------------------------------------------------------------------------------------ steps
    def chunk_with(self, optimizer, lr_fn: Callable | None = None) -> Callable:
        """The K-step training call with `optimizer` (the config's, or the lr_finder's range) and its `lr_fn`."""
        run = self.run
        parts = (run.model, run.loss_fn, optimizer, run.metrics, run.augment, self.accumulate, self.policy)
        return make_train_chunk(*parts, self.in_step, lr_fn)

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
        stack_spec = mesh.with_shardings(stack_spec, self.stack_sharding(stack_spec))
        start = time.perf_counter()
        compiled = self.train_chunk.lower(state_spec, self.empty_stats(state_spec), stack_spec).compile(
            platform.xla_options("train", jax.default_backend()) or None
        )
        return compiled, time.perf_counter() - start

    def compile(self, ts: dict) -> None:
        """Compiles the training step ahead of time for the loader's fixed batch shape (the evaluation step is
        compiled at the first evaluation, off the path to the first training step).

        The loop calls these compiled executables, so a batch of another shape is an error, never a silent
        recompilation; the compile time and XLA's FLOP estimate are logged.
        """
        log.info(f"platform defaults: {platform.describe(jax.default_backend())}")
        if self.execution != "aot":  # the jitted function itself: compiled at its first call, or run op by op
            self.compiled_chunk = self.train_chunk if self.execution == "eager" else self.nan_located_chunk()
            log.info(f"training step: {'jitted at the first call' if self.execution == 'jit' else 'op by op'}")
            return
        if self.compiling is None:
            self.start_compile(ts)
        self.compiled_chunk, self.compile_seconds = self.compiling.result()
        self.compiling = None
        try:
            cost = self.compiled_chunk.cost_analysis()
            cost = cost[0] if isinstance(cost, (list, tuple)) else cost
            # XLA reports one device's program and counts the scan body once: flops of one step on a device's shard
            self.flops_per_example = float(cost["flops"]) / (self.run.loaders["train"].batch_size / self.mesh.size)
        except (KeyError, TypeError, IndexError, NotImplementedError):
            pass  # not every backend reports costs
        flops = f", ~{self.flops_per_example / 1e6:.1f} MFLOP per training example" if self.flops_per_example else ""
        log.info(
            f"compiled the training step ({self.steps_per_call} step(s) per call) in {self.compile_seconds:.1f}s{flops}"
        )

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

    def compile_eval(self, ts: dict, loader) -> None:
        self.eval_batch_size = loader.batch_size
        self.eval_rows = rows = -(-loader.batch_size // self.mesh.size) * self.mesh.size  # divides over the devices
        if self.execution != "aot":
            self.compiled_eval = self.eval_step
            return
        spec = jax.tree.map(lambda a: jax.ShapeDtypeStruct((rows, *a.shape[1:]), a.dtype), loader.spec)
        batch_spec = mesh.with_shardings(spec, self.batch_sharding(spec))
        options = platform.xla_options("eval", jax.default_backend()) or None
        lowered = self.eval_step.lower(ts["params"], ts["state"], self.empty_stats(), batch_spec)
        self.compiled_eval = lowered.compile(options)

    def evaluate(self, ts: dict, loader, epoch: int = 0) -> dict:
        """Summed statistics of `loader`'s batches (its order of `epoch`) under the evaluated parameters."""
        if self.eval_batch_size != loader.batch_size:
            self.compile_eval(ts, loader)
        totals = self.empty_stats()
        params, state = self.eval_params(ts), ts["state"]
        # prefetched as training's stacks are; this process's share of each batch, padded
        for batch in loader.placed(epoch, self.put_batch, self.eval_rows // jax.process_count()):
            totals = self.compiled_eval(params, state, totals, batch)
        return totals
