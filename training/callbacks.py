"""Callbacks: code run at the loop's named events, listed in the config's ``"callbacks"`` (``{"name", "args"}``).

The trainer calls every callback's methods at five places, and nowhere else:

    on_train_start(trainer)               after the step is compiled, before the first epoch
    on_step(trainer, step, values)        after each logged step (trainer.log_every), values as logged: when
                                          the loop reads the logs, every 0.1 s or 1024 steps (trainer.py, READ_EVERY_S)
    on_epoch_end(trainer, epoch, row)     after evaluation, before the checkpoint; may add entries to `row`
    on_checkpoint(trainer, names)         after a checkpoint's files were handed to the writer
    on_train_end(trainer)                 after the last epoch (or an early stop)

A callback that must see every step (an average of the parameters, say) cannot wait for the host: it keeps a state
in the training state instead, ``train_state["callbacks"][name]``, made by ``init(params)`` and advanced inside the
jitted step by ``update(state, params, step)``; it is checkpointed with everything else, so a resumed run continues it
exactly. A callback with ``evaluated = True`` keeps parameters in ``state["params"]`` that evaluation, model_best,
``test.py`` and the export use instead of the trained ones (the checkpoint's header names them: ``eval_params``).
``check(train_loader)`` runs once the data is loaded, before anything is compiled: a callback that needs something
of the data says there what is missing.

What a callback may read of the trainer: ``trainer.train_state`` (the training state), ``trainer.run`` (model, loss,
metrics, loaders), ``trainer.compiled`` (the compiled calls), ``trainer.placement`` (how batches reach the devices),
``trainer.run_dir``, ``trainer.epoch``, ``trainer.start`` (where training started: ``training/startup.py``).
Add one by writing a function here that returns a ``Callback``, decorated with ``@register("callbacks")``.
"""

from __future__ import annotations

import csv
import io
import logging
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from files.writes import LR_FINDER_PLOT, LR_FINDER_TABLE, SAMPLES_TEXT, open_append, write_atomic
from model.registry import register
from training import optimizers
from training.run.figures import plots
from training.state import eval_params
from training.step import log_columns

log = logging.getLogger("train")


class Callback:
    name = "callback"
    init = None  # (params) -> the callback's state in the training state, for update()
    update = None  # (state, params, step) -> state, inside the jitted step
    evaluated = False  # True: state["params"] are evaluated and exported instead of the trained parameters

    def check(self, train_loader) -> None: ...

    def on_train_start(self, trainer) -> None: ...

    def on_step(self, trainer, step: int, values: dict) -> None: ...

    def on_epoch_end(self, trainer, epoch: int, row: dict) -> None: ...

    def on_checkpoint(self, trainer, names: list[str]) -> None: ...

    def on_train_end(self, trainer) -> None: ...


class EMA(Callback):
    """An exponential moving average of the parameters, updated after every step inside the jitted call; evaluation,
    model_best, ``test.py`` and the export use the average. With ``warmup`` the decay is min(decay, (1 + t) / (10 + t))
    at step t, so the early average is not dominated by the random initialisation (TensorFlow's num_updates rule)."""

    name = "ema"
    evaluated = True

    def __init__(self, decay: float, warmup: bool):
        self.decay, self.warmup = decay, warmup

    def init(self, params):
        return {"params": jax.tree.map(jnp.copy, params)}

    def update(self, state, params, step):
        decay = jnp.float32(self.decay)
        if self.warmup:
            t = step.astype(jnp.float32)
            decay = jnp.minimum(decay, (1 + t) / (10 + t))
        average = jax.tree.map(lambda a, p: (decay * a + (1 - decay) * p).astype(a.dtype), state["params"], params)
        return {"params": average}


@register("callbacks")
def ema(decay: float = 0.999, warmup: bool = True) -> Callback:
    if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0 <= decay < 1:
        raise ValueError(f"decay: expected a number in [0, 1), got {decay!r}")
    if not isinstance(warmup, bool):
        raise ValueError(f"warmup: expected true or false, got {warmup!r}")
    return EMA(float(decay), warmup)


class LRFinder(Callback):
    """The learning-rate range test (Smith 2017, as fastai runs it): before training, `steps` steps whose learning
    rate grows exponentially from `min_lr` to `max_lr`, from a copy of the initial state; stops early once the
    smoothed loss exceeds 4x its minimum. Writes lr_finder.csv and lr_finder.png in the run folder and logs the
    learning rate of the steepest fall of the smoothed loss. `stop`: end the run there (the default: choose a rate,
    then train with it); otherwise training goes on from the untouched initial state."""

    name = "lr_finder"

    def __init__(self, min_lr: float, max_lr: float, steps: int, stop: bool):
        self.min_lr, self.max_lr, self.steps, self.stop = min_lr, max_lr, steps, stop
        self.suggestion = None

    def lr(self, step):
        return self.min_lr * (self.max_lr / self.min_lr) ** (step / max(self.steps - 1, 1))

    def on_train_start(self, trainer) -> None:
        if trainer.epoch > 0 or trainer.start.position:  # a resumed run has already chosen
            return
        optimizer, _ = trainer.run.optimizer(self.lr)  # the config's, with the range test's learning rate
        call = jax.jit(trainer.compiled.call_with(optimizer))
        train_state = {**jax.tree.map(jnp.copy, trainer.train_state), "step": jnp.zeros((), jnp.int32)}
        train_state["opt_state"] = optimizer.init(train_state["params"])
        totals = trainer.compiled.empty_stats()
        k = trainer.steps_per_call.k * trainer.accumulate
        # curve: the losses smoothed as fastai does (an exponential average of 0.98, debiased)
        losses, curve, average, best, diverged, epoch = [], [], 0.0, math.inf, False, 0
        while len(losses) < self.steps and not diverged:
            for real, stack in trainer.train_loader.stacks(epoch, k, trainer.placement.put_stack):
                train_state, totals, logs = call(train_state, totals, stack)
                for loss in log_columns(np.asarray(logs))["loss"][: -(-real // trainer.accumulate)]:
                    losses.append(float(loss))
                    average = 0.98 * average + 0.02 * float(loss)
                    curve.append(average / (1 - 0.98 ** len(losses)))
                    best = min(best, curve[-1])
                    diverged = not math.isfinite(curve[-1]) or curve[-1] > 4 * best
                    if diverged or len(losses) == self.steps:  # the range ends here
                        break
                if diverged or len(losses) == self.steps:
                    break
            epoch += 1
        rates = [self.lr(i) for i in range(len(losses))]
        self.suggestion = self.report(trainer.run_dir, rates, losses, curve)
        if self.stop:
            trainer.stop_training = "lr_finder: stopped after the range test (callbacks.lr_finder.args.stop)"

    def report(
        self, run_dir: Path, rates: list[float], losses: list[float], smoothed_losses: list[float]
    ) -> float | None:
        table = io.StringIO(newline="")
        writer = csv.writer(table)
        writer.writerow(["step", "lr", "loss", "smoothed_loss"])
        writer.writerows([i, r, l, s] for i, (r, l, s) in enumerate(zip(rates, losses, smoothed_losses)))
        write_atomic(run_dir / LR_FINDER_TABLE, table.getvalue().encode())
        finite = [i for i, s in enumerate(smoothed_losses) if math.isfinite(s)]
        suggestion = None
        if len(finite) >= 3:
            logs = np.log10(np.asarray(rates)[finite])
            slopes = np.gradient(np.asarray(smoothed_losses)[finite], logs)
            suggestion = float(10 ** logs[int(np.argmin(slopes))])
        figures, drawn = plots(), ""
        try:
            if figures is not None:
                figures.save_lr_finder(rates, smoothed_losses, suggestion, run_dir / LR_FINDER_PLOT)
                drawn = f", {LR_FINDER_PLOT}"
        except Exception as error:  # the CSV holds the result; a figure is a convenience
            log.warning(f"{LR_FINDER_PLOT} not drawn: {type(error).__name__}: {error}")
        said = f"steepest fall of the loss at lr {suggestion:.3g}" if suggestion else "no clear fall of the loss"
        log.info(
            f"lr_finder: {len(losses)} steps from {rates[0]:.3g} to {rates[-1]:.3g}: {said} "
            f"({run_dir / LR_FINDER_TABLE}{drawn})"
        )
        return suggestion


@register("callbacks")
def lr_finder(min_lr: float = 1e-7, max_lr: float = 10.0, steps: int = 100, stop: bool = True) -> Callback:
    for key, value in (("min_lr", min_lr), ("max_lr", max_lr)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
            raise ValueError(f"{key}: expected a number > 0, got {value!r}")
    if max_lr <= min_lr:
        raise ValueError(f"max_lr ({max_lr}) must be above min_lr ({min_lr})")
    if isinstance(steps, bool) or not isinstance(steps, int) or not 2 <= steps <= 100_000:
        raise ValueError(f"steps: expected an integer from 2 to 100,000, got {steps!r}")
    if not isinstance(stop, bool):
        raise ValueError(f"stop: expected true or false, got {stop!r}")
    return LRFinder(float(min_lr), float(max_lr), steps, stop)


class GenerateText(Callback):
    """A language model's sample at the end of every `every` epochs, from `prompt`, logged (train.log and the
    console) and written to samples.txt in the run folder. Needs the vocabulary in the data's preprocessing."""

    name = "generate_text"

    def __init__(self, prompt: str, tokens: int, temperature: float, every: int, seed: int):
        self.prompt, self.tokens, self.temperature, self.every, self.seed = prompt, tokens, temperature, every, seed
        self.generator = None

    def check(self, train_loader) -> None:
        vocabulary = train_loader.preprocessing.get("vocabulary")
        if not vocabulary:
            raise ValueError("needs a language model's data (a vocabulary in the training data's preprocessing)")
        unknown = sorted(set(self.prompt) - set(vocabulary))
        if unknown:
            raise ValueError(f"prompt: characters not in the data's vocabulary: {''.join(unknown)!r}")

    def on_train_start(self, trainer) -> None:
        from model.generate import Generator

        vocabulary = trainer.train_loader.preprocessing["vocabulary"]
        self.generator = Generator(trainer.run.model, trainer.train_loader.spec["input"], vocabulary)

    def on_epoch_end(self, trainer, epoch: int, row: dict) -> None:
        if epoch % self.every:
            return
        params, model_state = eval_params(trainer.train_state, trainer.compiled.evaluated), trainer.train_state["state"]
        text = self.generator(params, model_state, self.prompt, self.tokens, self.temperature, seed=self.seed + epoch)
        log.info(f"generate_text after epoch {epoch}:\n{text}")
        with open_append(trainer.run_dir / SAMPLES_TEXT) as file:
            file.write(f"--- epoch {epoch}, step {row['step']}\n{text}\n")


@register("callbacks")
def generate_text(
    prompt: str = "\n", tokens: int = 200, temperature: float = 0.8, every: int = 1, seed: int = 0
) -> Callback:
    if not isinstance(prompt, str) or not prompt:
        raise ValueError(f"prompt: expected a non-empty string, got {prompt!r}")
    if isinstance(tokens, bool) or not isinstance(tokens, int) or not 1 <= tokens <= 100_000:
        raise ValueError(f"tokens: expected an integer from 1 to 100,000, got {tokens!r}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 <= temperature < 100:
        raise ValueError(f"temperature: expected a number from 0 to 100, got {temperature!r}")
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"every: expected an integer >= 1, got {every!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise ValueError(f"seed: expected an integer from 0 to 2**32 - 1, got {seed!r}")
    return GenerateText(prompt, tokens, float(temperature), every, seed)


class ReduceOnPlateau(Callback):
    """The host side of the ``reduce_on_plateau`` schedule, added by the trainer when the optimizer's schedule is one:
    at each epoch's end the monitored value updates the factor in the optimizer's state (before the checkpoint,
    which so holds it), and the trainer's ``lr_scale``, kept on the host so that the logged learning rate is the one
    applied without waiting for the steps in flight."""

    name = "reduce_on_plateau"

    def on_train_start(self, trainer) -> None:
        trainer.lr_scale = float(optimizers.plateau_state(trainer.train_state["opt_state"]).scale)  # a resumed run's

    def on_epoch_end(self, trainer, epoch: int, row: dict) -> None:
        plateau, monitor = trainer.lr_fn.plateau, trainer.checkpoints.monitor
        value = row.get(monitor.name)
        if value is None:
            raise ValueError(f"trainer.monitor: {monitor.name!r} was not computed this epoch")
        opt_state = trainer.train_state["opt_state"]
        new = optimizers.observe_plateau(
            optimizers.plateau_state(opt_state), plateau, float(value), monitor.mode == "max"
        )
        trainer.train_state = {**trainer.train_state, "opt_state": optimizers.with_plateau_state(opt_state, new)}
        before, trainer.lr_scale = trainer.lr_scale, float(new.scale)
        if trainer.lr_scale != before:
            log.info(
                f"reduce_on_plateau: {monitor.name} has not improved for more than {plateau.patience} epoch(s); "
                f"lr {plateau.init_value * before:.3g} -> {plateau.init_value * trainer.lr_scale:.3g}"
            )


def restart_plateau(train_state: dict) -> tuple[dict, list[str]]:
    """After a resume that changed trainer.monitor: reduce_on_plateau's best value (in the optimizer state) was of
    the old metric, and compared with the new one every epoch would count as bad, so it starts afresh, like the
    checkpoints' best; the rate reached so far is kept. The state, and its one log line (none without such a
    schedule)."""
    opt_state = train_state["opt_state"]
    plateau = optimizers.plateau_state(opt_state)
    if plateau is None:
        return train_state, []
    put = lambda value, like: jax.device_put(np.asarray(value, like.dtype), like.sharding)  # noqa: E731
    fresh = plateau._replace(best=put(np.inf, plateau.best), bad_epochs=put(0, plateau.bad_epochs))
    return {**train_state, "opt_state": optimizers.with_plateau_state(opt_state, fresh)}, [
        f"reduce_on_plateau: its best value and patience count start afresh with the new monitor (its learning-rate "
        f"scale so far, {float(plateau.scale):g}, is kept)"
    ]


def of_schedule(lr_fn) -> list[Callback]:
    """The callbacks a learning-rate schedule needs besides the config's: reduce_on_plateau's."""
    return [ReduceOnPlateau()] if hasattr(lr_fn, "plateau") else []
