"""The compiled calls the loop makes: the training call of K steps (``step.train_call``: a ``lax.scan`` over a stack
of K loader batches) and the evaluation step, compiled ahead of time for the training loader's shapes, so a batch of
another shape is an error, never a silent recompilation. A training call compiles on a worker thread (XLA compiles
outside the GIL), overlapping the state's initialisation or the calls at another K meanwhile.

JAX's persistent compilation cache (``training.devices.compilation_cache``: the machine's) keeps every compiled
program on disk: a later run of the same step on the same devices loads it instead of compiling.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import jax

from training.devices import compilation_cache, mesh, peaks, platform
from training.devices.packing import Packing
from training.devices.placement import Placement
from training.precision import policy_of
from training.state import eval_params, template
from training.step import empty_stats, make_eval_step, make_train_call

log = logging.getLogger("train")


def in_background(fn: Callable, *args) -> Future:
    """`fn(*args)` on a thread of its own, which ends with it (XLA compiles and counts outside the GIL)."""
    worker = ThreadPoolExecutor(1)
    future = worker.submit(fn, *args)
    worker.shutdown(wait=False)
    return future


def unpacked(call: Callable, packing: Packing, train_state: dict, totals: dict, packed):
    """``call`` of the stack that `packing` packed into `packed` (``Placement.put_stack``)."""
    return call(train_state, totals, packing.unpack(packed, lead=2))


class Compiled:
    def __init__(
        self, run, settings, placement: Placement, optimizer, lr_fn, state_sharding, execution="aot", count_flops=None
    ):
        """``run``: the assembled run with its data loaded; ``optimizer`` and ``lr_fn``: the run's (``Run.optimizer``;
        the one learning rate, the step's and the logged). ``execution``: "aot", compiled ahead of time for the
        loader's shapes; "jit", compiled at the first call (what jax_debug_nans needs to re-run a step op by op);
        "eager", under jax.disable_jit, op by op (--no-jit). ``count_flops``: count the step's FLOPs for the model
        FLOP/s and MFU (``peaks.step_flops``; None: where the devices' peak is known, so MFU can be had)."""
        self.run, self.placement, self.execution, self.state_sharding = run, placement, execution, state_sharding
        self.accumulate = settings.accumulate_steps
        self.policy = policy_of(settings.precision)
        self.evaluated = run.evaluated_callback()
        self.optimizer, self.call_fn = optimizer, self.call_with(optimizer, lr_fn)
        replicated = placement.replicated
        self.train = jax.jit(
            self.call_fn, donate_argnums=(0, 1), out_shardings=(state_sharding, replicated, replicated)
        )
        self.compiling: dict[int, Future] = {}  # steps per call -> its compilation (``start_compiling``)
        self.seconds: dict[int, float] = {}  # steps per call -> seconds its compilation took
        self.origins: dict[int, str] = {}  # steps per call -> where its program came from (compilation_cache.origin)
        self.train_kind = "train"  # the XLA options' kind the training step was compiled with (platform.train_kind)
        self.stats_template = None
        self.eval_step = jax.jit(
            make_eval_step(run.model, run.loss_fn, run.metrics, run.augment, self.policy),
            donate_argnums=(2,),
            out_shardings=replicated,
        )
        self.compiled_eval, self.eval_batch_size, self.eval_rows = None, None, None
        if count_flops is None:
            count_flops = peaks.peak_flops(placement.mesh.devices.flat[0].device_kind, self.policy.compute) is not None
        self.count_flops = count_flops and execution == "aot"
        self.counting, self.flops_per_example = None, None  # the count under way (a Future), then its result

    def call_with(self, optimizer, lr_fn: Callable | None = None) -> Callable:
        """The K-step training call with `optimizer` (the config's, or the lr_finder's range) and its `lr_fn`."""
        run, packing = self.run, self.placement.packing
        parts = (run.model, run.loss_fn, optimizer, run.metrics, run.augment, self.accumulate, self.policy)
        call = make_train_call(*parts, run.in_step_callbacks(), lr_fn, run.step)
        return call if packing is None else functools.partial(unpacked, call, packing)

    # ------------------------------------------------------------------------------------------------ training
    def start_compiling(self, k: int, state_spec) -> None:
        """Starts compiling the call of `k` steps for a state of `state_spec`'s shapes and shardings on a worker
        thread (once per `k`); ``train_call(k)`` waits for it. The first also starts MFU's FLOP count, if wanted."""
        if self.execution == "aot" and k not in self.compiling:
            self.compiling[k] = in_background(self.compile_train, state_spec, k)
            if self.count_flops and self.counting is None:
                totals, stack = self.empty_stats(state_spec), self.placement.stack_spec(self.accumulate)
                self.counting = in_background(peaks.step_flops, self.call_fn, state_spec, totals, stack)

    def check_step(self, state_spec) -> None:
        """A step of your own (``"step"`` in the config) traced on the state and one step's batches, nothing
        compiled: one that cannot take them (an optimizer without the groups it updates, say) is a ValueError naming
        it, before the run folder is written, not a traceback from the compilation. The default step needs none."""
        if "step" not in self.run.config:
            return
        stack = self.placement.stack_spec(self.accumulate)
        try:
            jax.eval_shape(self.call_fn, state_spec, self.empty_stats(state_spec), stack)
        except (TypeError, ValueError, KeyError, AttributeError, IndexError) as error:
            reason = (str(error).strip() or type(error).__name__).splitlines()[0]
            raise ValueError(f"{self.run.source}: step: {self.run.config['step']['name']}: {reason}") from None

    def compile_train(self, state_spec, k: int):
        started = time.perf_counter()
        stack = self.placement.stack_spec(k * self.accumulate)  # loader batches per call
        lowered = self.train.trace(state_spec, self.empty_stats(state_spec), stack).lower()
        self.train_kind = platform.train_kind(lowered, jax.default_backend())
        options = platform.xla_options(self.train_kind, jax.default_backend()) or None
        compiled, self.origins[k] = compilation_cache.origin(lambda: lowered.compile(options))
        self.seconds[k] = time.perf_counter() - started
        return compiled

    def report(self, k: int, examples_per_step: int, how: str) -> None:
        """Waits for the call of `k` steps the run starts with and logs it (`how`: what the steps per call are), with
        the step's FLOP count per training example where it was counted."""
        if self.execution != "aot":  # the jitted function itself: compiled at its first call, or run op by op
            log.info(f"platform defaults: {platform.describe(jax.default_backend())}")
            log.info(f"training step: {'jitted at the first call' if self.execution == 'jit' else 'op by op'}")
            return
        self.train_call(k)
        log.info(f"platform defaults: {platform.describe(jax.default_backend(), train=self.train_kind)}")
        flops = self.counting.result() if self.counting is not None else None
        # the scan over a call's steps (and over accumulated batches) counts once: one step's FLOPs
        self.flops_per_example = None if flops is None else flops / examples_per_step
        flops = f", ~{self.flops_per_example / 1e6:.1f} MFLOP per training example" if self.flops_per_example else ""
        log.info(f"compiled the training step ({how}) in {self.seconds[k]:.1f}s{self.origins[k]}{flops}")

    def memory_analysis(self, k: int):
        """XLA's memory figures of the compiled call of `k` steps, per device (arguments, outputs, aliased,
        temporaries, code); waits for its compilation (started with the state: training/startup.py). None where
        nothing is compiled ahead of time, nothing was started, or the backend gives none."""
        if self.execution != "aot" or k not in self.compiling:
            return None
        try:
            return self.train_call(k).memory_analysis()
        except (NotImplementedError, AttributeError):  # a backend or compiled form without the analysis
            return None

    def ready(self, k: int) -> bool:
        """Whether the call of `k` steps has compiled (always, where nothing is compiled ahead of time)."""
        return self.execution != "aot" or (k in self.compiling and self.compiling[k].done())

    def train_call(self, k: int) -> Callable:
        """The training call of `k` steps: ``(train_state, totals, stack) -> (train_state, totals, logs)``, compiled
        ahead of time (waits for ``start_compiling``'s compilation); the jitted function itself where it is not."""
        if self.execution == "eager":
            return self.train
        if self.execution == "jit":
            return self.nan_located()
        return self.compiling[k].result()

    def nan_located(self) -> Callable:
        """--detect-nans: the jitted call without donation; when jax_debug_nans finds a NaN in its outputs, the call
        runs again op by op from the same inputs (jax_debug_nans alone stops at the whole `scan`), so the error
        names the first operation that made one, with its line."""
        jitted = jax.jit(self.call_fn)

        def call(train_state, totals, stack):
            try:
                return jitted(train_state, totals, stack)
            except FloatingPointError:
                with jax.disable_jit():
                    return self.call_fn(train_state, totals, stack)

        return call

    def empty_stats(self, train_state=None):
        """Zeroed epoch statistics on the device; ``train_state``: a training state or its abstract value (the first
        call only: the model is traced once, not every epoch)."""
        if self.stats_template is None:
            run, spec = self.run, self.placement.batch_spec
            train_state = template(run, self.optimizer, self.policy) if train_state is None else train_state
            params, model_state = train_state["params"], train_state["state"]
            self.stats_template = jax.device_get(
                empty_stats(run.model, run.loss_fn, run.metrics, params, model_state, spec, run.augment)
            )
        return jax.device_put(self.stats_template, self.placement.replicated)

    # ---------------------------------------------------------------------------------------------- evaluation
    def compile_eval(self, train_state: dict, loader) -> None:
        self.eval_batch_size = loader.batch_size
        size = self.placement.mesh.size
        self.eval_rows = rows = -(-loader.batch_size // size) * size  # divides over the devices
        if self.execution != "aot":
            self.compiled_eval = self.eval_step
            return
        spec = jax.tree.map(lambda a: jax.ShapeDtypeStruct((rows, *a.shape[1:]), a.dtype), loader.spec)
        batch_spec = mesh.with_shardings(spec, self.placement.batch_sharding(spec))
        options = platform.xla_options("eval", jax.default_backend()) or None
        params, model_state, started = train_state["params"], train_state["state"], time.perf_counter()
        lowered = self.eval_step.lower(params, model_state, self.empty_stats(train_state), batch_spec)
        self.compiled_eval, where = compilation_cache.origin(lambda: lowered.compile(options))
        log.info(f"compiled the evaluation step (batches of {rows}) in {time.perf_counter() - started:.1f}s{where}")

    def evaluate(self, train_state: dict, loader, epoch: int = 0) -> dict:
        """Summed statistics of `loader`'s batches (its order of `epoch`) under the evaluated parameters."""
        if self.eval_batch_size != loader.batch_size:
            self.compile_eval(train_state, loader)
        totals = self.empty_stats(train_state)
        params, model_state = eval_params(train_state, self.evaluated), train_state["state"]
        # prefetched as training's stacks are; this process's share of each batch, padded
        for batch in loader.placed(epoch, self.placement.put_batch, self.eval_rows // jax.process_count()):
            totals = self.compiled_eval(params, model_state, totals, batch)
        return totals
