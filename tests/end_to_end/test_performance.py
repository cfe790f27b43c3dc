"""The speed features keep results exact: K steps per call equal one per call on conv models, "auto" picks K as
documented, nothing recompiles after the first epoch, and the platform defaults apply only where they should.
(Speed itself is measured in benchmarks/, not here.)"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from data_loader.loader import ArrayDataset, DataLoader
from training import startup
from training.assembly import assemble
from training.compiled import Compiled
from training.config.file import ConfigError
from training.config.validation import validate
from training.devices import peaks, platform
from training.steps_per_call import AUTO_CPU_CALL_S, AUTO_MAX_STEPS, AUTO_STACK_BYTES, auto_steps_per_call
from training.trainer import Trainer

REPO = Path(__file__).resolve().parents[2]
ROOT = Path(__file__).resolve().parents[2]

TINY_MODELS = {
    # the reference CNN's layers (custom-VJP convolutions, reshape max pooling) at small widths
    "mnist_cnn": {"name": "mnist_cnn", "args": {"channels": [4, 8], "hidden": 16}},
    # the sample's layers: 7x7 depthwise convolutions on the shifted-slice path, layer norm, GELU, strided convs
    "mnist_convnext": {"name": "mnist_convnext", "args": {"dims": [8, 16], "depths": [1, 1]}},
}


class StepLosses:
    """A tracker that keeps every logged step loss."""

    def __init__(self):
        self.losses = {}

    def log_step(self, step, values):
        self.losses[step] = values["train/step_loss"]

    def log_epoch(self, epoch, row, best):
        pass


@pytest.fixture(autouse=True)
def fresh_choices(tmp_path, monkeypatch):
    """ "auto"'s remembered choices in a folder of each test's own: another test's choice for the same step would
    start the run at it, untimed."""
    monkeypatch.setattr("training.devices.compilation_cache.folder", lambda: tmp_path / "cache")


def make_trainer(tmp_path, model, steps_per_call, run, n=7 * 16 + 5, epochs=2):
    """7 full batches of 16 and one of 5: a padded last batch, and with K = 3 a last call with 2 of 3 steps."""
    config = validate(
        {
            "name": "perf",
            "seed": 1,
            "model": model,
            "loss": {"name": "cross_entropy"},
            "metrics": [{"name": "accuracy"}],
            "optimizer": {
                "name": "adamw",
                "args": {"weight_decay": 0.05},
                "schedule": {
                    "name": "warmup_cosine_decay",
                    "args": {"init_value": 0.0, "peak_value": 0.004, "warmup_steps": 3, "decay_steps": 16},
                },
                "transforms": [{"name": "clip_by_global_norm", "args": {"max_norm": 1.0}}],
            },
            "data_loader": {"train": {"name": "mnist"}, "validation": {"name": "mnist"}},
            "trainer": {"epochs": epochs, "steps_per_call": steps_per_call, "log_every": 1, "save_dir": str(tmp_path)},
        }
    )
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, 28, 28, 1)).astype(np.float32)
    y = (x[:, ::3, ::3, 0].reshape(n, -1)[:, :10].argmax(1)).astype(np.int32)
    train = DataLoader(ArrayDataset(input=x, target=y), 16, shuffle=True, seed=1)
    valid = DataLoader(ArrayDataset(input=x[:40], target=y[:40]), 16)
    (tmp_path / run).mkdir()
    assembled = assemble(config)
    assembled.use_data({"train": train, "validation": valid})
    trainer = Trainer(assembled, tmp_path / run, trackers=[StepLosses()], count_flops=True)
    trainer.begin(startup.from_seed(trainer))
    return trainer


@pytest.mark.parametrize("model", TINY_MODELS)
def test_k_steps_per_call_give_the_losses_of_one(tmp_path, model):
    one = make_trainer(tmp_path, TINY_MODELS[model], 1, "one")
    many = make_trainer(tmp_path, TINY_MODELS[model], 3, "many")
    one.train()
    many.train()
    a, b = one.trackers[0].losses, many.trackers[0].losses
    assert sorted(a) == sorted(b) == list(range(1, 17))  # 8 steps per epoch, padding steps not counted
    np.testing.assert_allclose([b[s] for s in sorted(b)], [a[s] for s in sorted(a)], rtol=0, atol=1e-6)
    for x, y in zip(jax.tree.leaves(one.train_state["params"]), jax.tree.leaves(many.train_state["params"])):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6)
    rows = [[json.loads(line) for line in (t.run_dir / "metrics.jsonl").read_text().splitlines()] for t in (one, many)]
    for ra, rb in zip(*rows):
        assert abs(ra["train/loss"] - rb["train/loss"]) < 1e-6 and ra["val/accuracy"] == rb["val/accuracy"]
        assert ra["time/peak_rss_mb"] > 0
        # XLA's FLOP count x examples/s; a fraction of the device's peak where the table knows it (not a CPU's)
        assert ra["time/model_flops_per_s"] > 0
        if peaks.peak_flops(jax.devices()[0].device_kind, "float32") is None:
            assert ra["time/mfu"] == "unknown"
        else:
            assert 0 < ra["time/mfu"] < 1


MLP = {"name": "mlp", "args": {"num_classes": 10, "hidden": [32]}}
FLOPS = r"""
import sys, pathlib
sys.path.insert(0, ".")
from tests.end_to_end.test_performance import MLP, make_trainer
trainer = make_trainer(pathlib.Path(sys.argv[1]), MLP, 3, "four")
trainer.log_compile()
print(trainer.placement.mesh.size, trainer.compiled.flops_per_example)
"""


def test_the_flop_count_is_the_models_whatever_the_devices_and_steps_per_call(tmp_path):
    """MFU's numerator: at least the MLP's matrix products per example (forward 2(784*32 + 32*10), backward the
    weight gradients and the hidden layer's input gradient), with the optimizer's and the metrics' elementwise work
    over a batch of 16 on top, and the same count at 3 steps per call on 4 devices as at 1 step on 1 device (XLA's
    count of the compiled program is one device's share, with the partitioner's own work)."""
    trainer = make_trainer(tmp_path, MLP, 1, "one")
    trainer.log_compile()
    matmuls = 2 * (784 * 32 + 32 * 10) + 2 * (784 * 32 + 2 * 32 * 10)
    assert matmuls <= trainer.compiled.flops_per_example < 2 * matmuls, trainer.compiled.flops_per_example
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"}
    done = subprocess.run(
        [sys.executable, "-c", FLOPS, str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    devices, flops = done.stdout.split()
    assert devices == "4" and float(flops) == pytest.approx(trainer.compiled.flops_per_example, rel=1e-4)


def test_no_flop_count_where_no_peak_is_known_unless_asked(tmp_path):
    """On a CPU (no peak: no MFU) the step is not lowered a second time to count it: no FLOP count, and the rows say
    "unknown" for both figures."""
    asked = make_trainer(tmp_path, MLP, 1, "asked")
    plain = Trainer(asked.run, tmp_path / "asked", trackers=[StepLosses()])
    plain.begin(startup.from_seed(plain))
    plain.log_compile()
    assert asked.compiled.counting is not None and plain.compiled.counting is None
    assert plain.compiled.flops_per_example is None


def test_no_compilation_after_the_first_epoch_with_auto_steps(tmp_path):
    trainer = make_trainer(tmp_path, TINY_MODELS["mnist_convnext"], "auto", "auto", epochs=1)
    trainer.train()  # its 8 steps: "auto" decides, and its choice compiles, within the first epoch
    assert trainer.first_call_seconds > 0
    compiles = []
    listener = lambda event, duration, **kw: compiles.append(event) if "backend_compile" in event else None
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        trainer.settings = dataclasses.replace(trainer.settings, epochs=3)
        trainer.train()  # the calls compiled in the first are kept
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert compiles == [] and trainer.epoch == 3


def test_device_peaks_and_utilization():
    """The table of dense peaks: each device kind JAX reports finds its own row (variants before their family),
    float16 runs at the bfloat16 rate, and anything else has no peak."""
    from training.devices.peaks import peak_flops, utilization

    assert peak_flops("NVIDIA H100 80GB HBM3", "bfloat16") == 989.5e12
    assert peak_flops("NVIDIA H100 PCIe", "float16") == 756.5e12
    assert peak_flops("NVIDIA H200", "float32") == 494.5e12
    assert peak_flops("NVIDIA A100-SXM4-80GB", "bfloat16") == 312e12
    assert peak_flops("NVIDIA L4", "bfloat16") == 121e12 and peak_flops("NVIDIA L40S", "bfloat16") is None
    assert peak_flops("TPU v5 lite", "bfloat16") == 197e12 and peak_flops("TPU v5p", "bfloat16") == 459e12
    assert peak_flops("TPU v6 lite", "float32") == 918e12 and peak_flops("TPU v4", "bfloat16") == 275e12
    assert peak_flops("cpu", "float32") is None
    assert utilization(2e9, 1000.0, 1e12, 4) == (2e12, 0.5)
    assert utilization(2e9, 1000.0, None, 1) == (2e12, "unknown")
    assert utilization(None, 1000.0, 1e12, 1) == ("unknown", "unknown")


def finished_at_each_dispatch(tmp_path, log_every: int) -> list[bool]:
    """Trains 8 steps of mnist_cnn at one step per call, each call made slow (its logs wait on ~0.1 s of matrix
    products queued behind it, as many as take that long on the device in use: 60 on a CPU took 0.1 ms on a GPU);
    for each call after the first, whether the previous one had finished when it was dispatched."""
    trainer = make_trainer(tmp_path, TINY_MODELS["mnist_cnn"], 1, "r", epochs=1)
    trainer.settings = dataclasses.replace(trainer.settings, log_every=log_every)

    @jax.jit
    def products(loss, n):
        m = jnp.full((384, 384), 1.0 / 384, jnp.float32) + loss * 0
        return jax.lax.fori_loop(0, n, lambda i, m: m @ m, m)[0, 0] - 1.0  # exactly 0: m @ m == m

    jax.block_until_ready(products(0.0, 1))  # compiled
    start = time.perf_counter()
    jax.block_until_ready(products(0.0, 60))
    n = max(60, math.ceil(60 * 0.1 / (time.perf_counter() - start)))

    def slow(loss):
        return products(loss, n)

    finished_at_dispatch, previous = [], []
    train_call = trainer.compiled.train_call

    def slowed_call(k):
        call = train_call(k)

        def slowed(ts, totals, stack):
            if previous:
                finished_at_dispatch.append(previous[-1].is_ready())
            ts, totals, logs = call(ts, totals, stack)
            logs = logs + slow(logs[0, 0])
            previous.append(logs)
            return ts, totals, logs

        return slowed

    trainer.compiled.train_call = slowed_call
    trainer.train()
    assert int(trainer.train_state["step"]) == 8
    return finished_at_dispatch


ON_A_TERMINAL = r"""
import json, sys
from pathlib import Path
sys.path.insert(0, ".")
from tests.end_to_end.test_performance import finished_at_each_dispatch
assert sys.stderr.isatty()
Path(sys.argv[1], "finished.json").write_text(json.dumps(finished_at_each_dispatch(Path(sys.argv[1]), int(sys.argv[2]))))
"""


def on_a_terminal(tmp_path, log_every: int) -> tuple[list[bool], str]:
    """``finished_at_each_dispatch`` in a child process whose terminal is a pseudo-terminal (so the progress bar is
    live, drawn by tqdm as a user sees it); with what the terminal showed."""
    import fcntl
    import pty
    import select
    import struct
    import termios

    try:
        main_fd, terminal = pty.openpty()
    except OSError as error:  # a machine without /dev/ptmx
        pytest.skip(f"no pseudo-terminal here: {error}")
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # 100 columns (a new one has 0)
    command = [sys.executable, "-c", ON_A_TERMINAL, str(tmp_path), str(log_every)]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    child = subprocess.Popen(command, cwd=ROOT, env=env, stdin=terminal, stdout=terminal, stderr=terminal)
    os.close(terminal)
    shown = b""
    while True:
        ready, _, _ = select.select([main_fd], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(main_fd, 65536)
            except OSError:  # the child's end closed
                break
            if not chunk:
                break
            shown += chunk
        elif child.poll() is not None:
            break
    os.close(main_fd)
    assert child.wait(timeout=60) == 0, shown.decode(errors="replace")[-3000:]
    return json.loads((tmp_path / "finished.json").read_text()), shown.decode(errors="replace")


@pytest.mark.parametrize("log_every, terminal", [(1, False), (50, True), (1, True)])
def test_the_loop_dispatches_each_call_before_the_previous_one_ends(tmp_path, log_every, terminal):
    """Nothing the loop shows (step lines, the live bar's loss and learning rate on a real pseudo-terminal, trackers)
    waits on the call just dispatched: when each call is dispatched, the previous one has not finished yet. A loop
    that read a value of the running call (the learning rate computed eagerly, say) would find every previous call
    finished."""
    if terminal:
        finished, shown = on_a_terminal(tmp_path, log_every)
        assert "epoch 1:" in shown and ("step/s" in shown or "s/step" in shown), shown[-2000:]  # tqdm's live bar
    else:
        finished = finished_at_each_dispatch(tmp_path, log_every)
    assert len(finished) == 7
    assert sum(finished) <= 1, finished  # one late thread wake-up on a busy machine at most


@pytest.mark.parametrize(
    "steps, batch_bytes, host_us, device_us, expected",
    [
        (430, 401_920, 300, 50_000, 1),  # a long step: one step per call already hides the host
        (430, 401_920, 300, 7_000, 1),  # under 5%
        (430, 401_920, 300, 5_000, 2),
        (430, 401_920, 300, 1_000, 6),  # 6 pads 430 steps by 2; 7..9 no better
        (469, 401_920, 300, 1_000, 7),  # 469 = 7 x 67: 7 pads nothing
        (430, 401_920, 300, 10, AUTO_MAX_STEPS),  # a trivial step: as many as allowed
        (5, 401_920, 300, 10, 5),  # a short epoch in one call
        (430, AUTO_STACK_BYTES // 4, 300, 10, 4),  # big batches: the prefetched stack stays within its cap
        (430, AUTO_STACK_BYTES * 2, 300, 10, 1),
    ],
)
def test_auto_steps_per_call(steps, batch_bytes, host_us, device_us, expected):
    k, why = auto_steps_per_call(steps, batch_bytes, host_us * 1e-6, device_us * 1e-6)
    assert k == expected and f"{host_us} us of host work per call" in why


def test_auto_counts_what_the_cpu_runtime_pays_per_call():
    """mnist_cnn's step on this CPU (~48 ms, ~2 ms of the loop's work per call): host work alone would ask for one
    step per call, which reached 0.83 of the fused bound; the runtime's cost per call asks for more."""
    assert auto_steps_per_call(469, 401_920, 2e-3, 48e-3)[0] == 1
    k, why = auto_steps_per_call(469, 401_920, 2e-3, 48e-3, AUTO_CPU_CALL_S)
    assert k > 1 and "ms the runtime pays per call" in why
    assert auto_steps_per_call(469, 401_920, 2e-3, 1.25, AUTO_CPU_CALL_S)[0] == 1  # mnist_convnext's long step


def auto_trainer(
    tmp_path, hidden: list, batch: int, n: int, epochs: int = 1, steps_per_call="auto", run="r", tracker=None
):
    """An MLP trained at `steps_per_call` on `n` random examples in batches of `batch` (its step losses kept by
    `tracker`, a ``StepLosses``)."""
    config = validate(
        {
            "name": "auto",
            "seed": 0,
            "model": {"name": "mlp", "args": {"num_classes": 10, "hidden": hidden}},
            "loss": {"name": "cross_entropy"},
            "metrics": [{"name": "accuracy"}],
            "optimizer": {"name": "adamw", "args": {"lr": 1e-3}},
            "data_loader": {"train": {"name": "mnist"}},
            "trainer": {
                "epochs": epochs,
                "steps_per_call": steps_per_call,
                "log_every": 1,
                "save_dir": str(tmp_path),
                "monitor": "off",
            },
        }
    )
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, 16)).astype(np.float32)
    y = rng.integers(0, 10, n).astype(np.int32)
    (tmp_path / run).mkdir()
    assembled = assemble(config)
    assembled.use_data({"train": DataLoader(ArrayDataset(input=x, target=y), batch, shuffle=True, seed=1)})
    trainer = Trainer(assembled, tmp_path / run, trackers=[tracker or StepLosses()])
    trainer.begin(startup.from_seed(trainer))
    return trainer


def test_auto_gives_a_long_step_one_step_per_call(tmp_path, caplog):
    """~0.2 s of matrix products per step against well under a millisecond of the loop's own work (and the CPU
    runtime's cost per call, ``AUTO_CPU_CALL_S``)."""
    trainer = auto_trainer(tmp_path, [4096, 4096], 256, 256 * 7)
    with caplog.at_level(logging.INFO, logger="train"):
        trainer.train()
    assert trainer.steps_per_call.k == 1 and int(trainer.train_state["step"]) == 7
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("steps per call (auto)")]
    assert line.startswith("steps per call (auto): 1; ") and "device time per step" in line


def test_auto_remembers_its_choice_for_the_next_run_of_the_same_step(tmp_path, caplog):
    """A second run of the same step on the same devices starts at the steps per call "auto" chose, untimed, and
    compiles that call only; a remembered file that is not one is ignored (timed afresh)."""
    first = auto_trainer(tmp_path, [8], 8, 8 * 40, run="first")
    first.train()  # 40 steps may not repay K's compile: the first run may stay at one step per call, never the next
    remembered = tmp_path / "cache" / "steps_per_call.json"
    (k,) = json.loads(remembered.read_text()).values()
    assert k > 1
    second = auto_trainer(tmp_path, [8], 8, 8 * 40, run="second")
    with caplog.at_level(logging.INFO, logger="train"):
        second.train()
    assert second.steps_per_call.k == k and list(second.compiled.compiling) == [k]
    assert not second.steps_per_call.timings
    assert not [r for r in caplog.records if r.getMessage().startswith("steps per call (auto)")]
    assert any(f'{k} step(s) per call, as "auto" chose' in r.getMessage() for r in caplog.records)
    remembered.write_text('{"torn": ')
    third = auto_trainer(tmp_path, [8], 8, 8 * 40, run="third")
    third.train()
    assert len(third.steps_per_call.timings) >= 6


class CompiledByEpochEnd(StepLosses):
    """A tracker that holds each epoch's end until "auto"'s chosen call has compiled: the loop itself never waits
    for it, so on a loaded machine a short run could end before the switch this test is about."""

    def __init__(self):
        super().__init__()
        self.trainer = None

    def log_epoch(self, epoch, row, best):
        chosen = self.trainer.steps_per_call.chosen
        if chosen in self.trainer.compiled.compiling:
            self.trainer.compiled.compiling[chosen].result()


def test_auto_gives_a_trivial_step_many_steps_per_call_with_the_numbers_of_one(tmp_path, caplog):
    """A step of microseconds: "auto" times its first calls at one step per call, then switches mid-epoch to the
    K it chose; the losses and parameters are those of one step per call throughout."""
    auto = auto_trainer(tmp_path, [8], 8, 8 * 40, epochs=8, run="auto", tracker=CompiledByEpochEnd())
    auto.trackers[0].trainer = auto  # 320 steps repay K's compile
    one = auto_trainer(tmp_path, [8], 8, 8 * 40, epochs=8, steps_per_call=1, run="one")
    with caplog.at_level(logging.INFO, logger="train"):
        auto.train()
    one.train()
    assert auto.steps_per_call.k > 1
    assert any(r.getMessage().startswith(f"steps per call (auto): {auto.steps_per_call.k}; ") for r in caplog.records)
    a, b = one.trackers[0].losses, auto.trackers[0].losses
    assert sorted(a) == sorted(b) and len(a) == 320
    np.testing.assert_allclose([b[s] for s in sorted(b)], [a[s] for s in sorted(a)], rtol=0, atol=1e-6)
    for x, y in zip(jax.tree.leaves(one.train_state["params"]), jax.tree.leaves(auto.train_state["params"])):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6)


def test_auto_never_waits_for_its_chosen_call_to_compile(tmp_path, monkeypatch):
    """The chosen call's compile held back until the run has ended: the run trains all its steps at one step per
    call, with K chosen, instead of waiting at an epoch's start for it (a loop that waited would sit out the hold)."""
    held, hold_s = threading.Event(), 60.0
    compile_train = Compiled.compile_train

    def held_back(self, state_spec, k):
        if k > 1:
            held.wait(hold_s)
        return compile_train(self, state_spec, k)

    monkeypatch.setattr(Compiled, "compile_train", held_back)
    trainer = auto_trainer(tmp_path, [8], 8, 8 * 40, epochs=8)  # 320 steps repay K's compile
    started = time.perf_counter()
    try:
        trainer.train()
        seconds = time.perf_counter() - started
    finally:
        held.set()
    assert trainer.steps_per_call.chosen > 1 and trainer.steps_per_call.k == 1 and seconds < hold_s
    assert int(trainer.train_state["step"]) == 8 * 40


def test_auto_stays_at_one_step_per_call_where_the_run_is_too_short_to_repay_another_compile(tmp_path, caplog):
    """6 timed calls of a 12-step run leave 6 steps: K's compile is never repaid, so the run compiles its step once
    and the next run of the step starts at K."""
    short = auto_trainer(tmp_path, [8], 8, 8 * 12, run="short")
    with caplog.at_level(logging.INFO, logger="train"):
        short.train()
    assert short.steps_per_call.k == 1 and set(short.compiled.seconds) == {1}
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("steps per call (auto): ")]
    assert "this run stays at one step per call" in line
    k = int(line.split(": ")[1].split(";")[0])
    assert k > 1 and auto_trainer(tmp_path, [8], 8, 8 * 12, run="next").steps_per_call.k == k


def test_auto_is_the_default_and_bad_values_are_named():
    base = {
        "name": "t",
        "model": {"name": "mlp"},
        "loss": {"name": "cross_entropy"},
        "metrics": [],
        "optimizer": {"name": "adam", "args": {"lr": 0.1}},
        "data_loader": {"train": {"name": "mnist"}},
        "trainer": {"monitor": "off"},
    }
    assert validate(base)["trainer"]["steps_per_call"] == "auto"
    with pytest.raises(ConfigError, match='steps_per_call: expected int or "auto", got "fast"'):
        validate({**base, "trainer": {"monitor": "off", "steps_per_call": "fast"}})


def test_process_defaults_only_on_linux_cpu_and_never_over_the_user():
    on = platform.process_defaults({}, "linux", cpu=True)
    assert on == {"GLIBC_TUNABLES": platform.HUGETLB}
    assert platform.process_defaults({}, "linux", cpu=False) == {}
    assert platform.process_defaults({}, "darwin", cpu=True) == {}
    assert platform.process_defaults({platform.SWITCH: "0"}, "linux", cpu=True) == {}
    assert platform.process_defaults({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, "linux", cpu=True) == {}
    assert not platform.cpu_backend_expected({"JAX_PLATFORMS": "cuda,cpu"})
    assert platform.cpu_backend_expected({"JAX_PLATFORMS": "cpu"})


def test_xla_options_only_for_the_measured_cpu_setup():
    train = platform.xla_options("train", "cpu", {}, series="0.10")
    assert train == {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_REDUCE"}
    assert platform.xla_options("eval", "cpu", {}, series="0.10") == {"xla_cpu_experimental_ynn_fusion_type": ""}
    assert platform.xla_options("train", "gpu", {}, series="0.10") == {}
    # re-measured on 0.12: 512-bit vectors, and YNNPACK's matrix products where the step has no convolution
    assert platform.xla_options("train", "cpu", {}, series="0.12") == {**train, "xla_cpu_prefer_vector_width": 512}
    dense = platform.xla_options("train without convolutions", "cpu", {}, series="0.12")
    assert dense["xla_cpu_experimental_ynn_fusion_type"] == "LIBRARY_FUSION_TYPE_DOT,LIBRARY_FUSION_TYPE_REDUCE"
    assert platform.xla_options("train without convolutions", "cpu", {}, series="0.10") == train
    assert platform.xla_options("eval", "cpu", {}, series="0.12")["xla_cpu_prefer_vector_width"] == 512
    assert platform.xla_options("train", "cpu", {}, series="0.11") == {}  # unmeasured jaxlib: XLA may reject them
    assert platform.xla_options("train", "cpu", {"XLA_FLAGS": "--xla_dump_to=/tmp"}, series="0.10") == {}
    assert platform.xla_options("train", "cpu", {platform.SWITCH: "0"}, series="0.10") == {}
    # a large state's initialisation costs more unfused than its unoptimised compile saves
    small, large = platform.INIT_UNOPTIMISED_BYTES - 1, platform.INIT_UNOPTIMISED_BYTES
    assert platform.init_options(small, "cpu", {}) == platform.xla_options("init", "cpu", {}) != {}
    assert platform.init_options(large, "cpu", {}) == {}
    # The options are accepted by the installed XLA (a rejected option is an error at compile time).
    for kind in ("train", "train without convolutions", "eval", "init"):
        options = platform.xla_options(kind, jax.default_backend())
        jax.jit(lambda x: x.sum(0) * 2).lower(np.ones((4, 3), np.float32)).compile(options or None)


def test_the_training_step_kind_follows_its_program():
    image = jax.ShapeDtypeStruct((2, 8, 8, 3), np.float32)
    conv = jax.jit(
        lambda x: jax.lax.conv_general_dilated(
            x, np.ones((3, 3, 3, 4), np.float32), (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
        )
    ).lower(image)
    dense = jax.jit(lambda x: x.reshape(2, -1) @ np.ones((192, 4), np.float32)).lower(image)
    assert platform.train_kind(conv, "cpu") == "train"
    assert platform.train_kind(dense, "cpu") == "train without convolutions"
    assert platform.train_kind(dense, "gpu") == "train"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the malloc default is Linux-only")
@pytest.mark.parametrize("switch, expected", [(None, ["None", "glibc.malloc.hugetlb=1"]), ("0", ["None"])])
def test_apply_re_executes_once_with_the_tunable(switch, expected):
    script = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(REPO)!r})
        from training.devices import platform
        print("image", os.environ.get("GLIBC_TUNABLES"), os.getpid(), flush=True)
        platform.apply()
        print("started", platform.STARTED_AT, flush=True)
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GLIBC_TUNABLES", "_TRAIN", platform.SWITCH))}
    env["JAX_PLATFORMS"] = "cpu"
    if switch is not None:
        env[platform.SWITCH] = switch
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True).stdout
    images = [line.split() for line in out.splitlines() if line.startswith("image")]
    assert [i[1] for i in images] == expected
    assert len({i[2] for i in images}) == 1  # the same process, re-executed in place
    assert len([line for line in out.splitlines() if line.startswith("started")]) == 1
