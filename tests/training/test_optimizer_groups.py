"""Parameter groups (optimizer.groups, ``optimizers.partition``): against optax.multi_transform, one group stepped
alone, the errors, and a run of train.py that resumes bit for bit."""

import json
import re

import jax
import numpy as np
import optax
import pytest

from tests.end_to_end.test_train import data_dir, make_config, params_of, run  # noqa: F401 (data_dir: a fixture)
from training import optimizers as opt
from training.config.components import build_optimizer, run_length_arguments
from training.config.file import ConfigError
from training.config.schema import check_optimizer

RNG = np.random.default_rng(0)
STEPS = 20


def normal(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


PARAMS = {
    "conv": {"weight": normal(3, 3, 2, 4), "bias": normal(4)},
    "blocks": {"1": {"norm": {"scale": 1 + 0.1 * normal(4)}, "dense": {"weight": normal(4, 3), "bias": normal(3)}}},
}
GRADS = [jax.tree.map(lambda p: np.exp(normal()) * normal(*p.shape), PARAMS) for _ in range(STEPS)]
GROUPS = {
    "conv": {
        "params": ["params.conv"],
        "name": "adam",
        "args": {"lr": 0.01, "b1": 0.8},
        "transforms": [{"name": "clip_by_global_norm", "args": {"max_norm": 1.0}}],
    },
    "norm": {"params": ["params.blocks.1.norm"], "name": "sgd", "args": {"lr": 0.05, "momentum": 0.9}},
    "dense": {
        "params": ["params.blocks.1.dense"],
        "name": "adamw",
        "args": {"lr": 0.02, "weight_decay": 0.3, "mask": ["params.blocks.1.dense.weight"]},
    },
}


def built(groups=GROUPS, **section):
    config = {"optimizer": {"groups": groups, **section}, "trainer": {"epochs": 1}}
    check_optimizer(config, "c.json")
    return build_optimizer(config)


def test_groups_train_as_optax_multi_transform():
    """Three groups (Adam after clipping, SGD with momentum, AdamW with a decay mask), 20 steps of random
    gradients: optax.multi_transform with the same transforms per label, within float32 rounding."""
    ours, lr_fn = built()
    labels = {"conv": {"weight": "conv", "bias": "conv"}, "blocks": {"1": {"norm": {"scale": "norm"}}}}
    labels["blocks"]["1"]["dense"] = {"weight": "dense", "bias": "dense"}
    decay = {"conv": False, "blocks": {"1": {"norm": False, "dense": {"weight": True, "bias": False}}}}
    reference = optax.multi_transform(
        {
            "conv": optax.chain(optax.clip_by_global_norm(1.0), optax.adam(0.01, b1=0.8)),
            "norm": optax.sgd(0.05, momentum=0.9),
            "dense": optax.adamw(0.02, weight_decay=0.3, mask=decay),
        },
        labels,
    )
    params, want = PARAMS, PARAMS
    state, ref_state = ours.init(params), reference.init(want)
    assert set(state) == {"conv", "norm", "dense"}
    for grads in GRADS:
        updates, state = jax.jit(ours.update)(grads, state, params)
        params = opt.apply_updates(params, updates)
        ref_updates, ref_state = reference.update(grads, ref_state, want)
        want = optax.apply_updates(want, ref_updates)
    for got, expected in zip(jax.tree.leaves(params), jax.tree.leaves(want)):
        np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-6)
    assert float(lr_fn(0)) == 0.01 and {k: float(f(3)) for k, f in lr_fn.groups.items()} == {
        "conv": 0.01,
        "norm": 0.05,
        "dense": 0.02,
    }


def test_one_group_updated_alone_leaves_the_others_bit_for_bit():
    """``.groups[name]`` with ``state[name]``: its own leaves move exactly as the partition moves them, every other
    param and every other group's state stays as it was; with optimizer.frozen (inside a group's prefix) too."""
    groups = {"conv": GROUPS["conv"], "blocks": {**GROUPS["dense"], "params": ["params.blocks"]}}
    optimizer, _ = built(groups, frozen=["params.blocks.1.norm"])
    state = optimizer.init(PARAMS)
    together, together_state = optimizer.update(GRADS[0], state, PARAMS)
    alone, alone_state = optimizer.groups["blocks"].update(GRADS[0], state["blocks"], PARAMS)
    assert jax.tree.structure(alone_state) == jax.tree.structure(state["blocks"])
    for got, want in zip(jax.tree.leaves(alone_state), jax.tree.leaves(together_state["blocks"])):
        assert np.asarray(got).tobytes() == np.asarray(want).tobytes()
    new = opt.apply_updates(PARAMS, alone)
    opt_state = {**state, "blocks": alone_state}
    for key in ("conv", ("blocks", "1", "norm")):  # the other group's and the frozen leaves
        before, after = (PARAMS, new) if key == "conv" else (PARAMS["blocks"]["1"], new["blocks"]["1"])
        name = key if key == "conv" else "norm"
        for got, want in zip(jax.tree.leaves(after[name]), jax.tree.leaves(before[name])):
            assert np.asarray(got).tobytes() == np.asarray(want).tobytes()
    assert opt_state["conv"] is state["conv"]
    moved = opt.apply_updates(PARAMS, together)["blocks"]["1"]["dense"]
    for got, want in zip(jax.tree.leaves(new["blocks"]["1"]["dense"]), jax.tree.leaves(moved)):
        assert np.asarray(got).tobytes() == np.asarray(want).tobytes()
    assert not np.array_equal(moved["weight"], PARAMS["blocks"]["1"]["dense"]["weight"])


@pytest.mark.parametrize(
    ("groups", "said"),
    [
        (
            {"a": {**GROUPS["conv"], "params": ["params.conv"]}, "b": GROUPS["dense"]},
            r"optimizer.groups: params.blocks.1.norm.scale lies in no group \(groups: a, b\); each trained parameter",
        ),
        (
            {"a": {**GROUPS["conv"], "params": ["params.conv", "params.blocks"]}, "b": GROUPS["dense"]},
            "optimizer.groups: params.blocks.1.dense.bias lies in groups a and b; each trained parameter lies in",
        ),
        (
            {"a": {**GROUPS["conv"], "params": ["params.blocks", "params.convv"]}, "b": GROUPS["dense"]},
            "optimizer.groups.a.params.1: 'params.convv' matches no parameter; the model's: params.blocks, params.conv",
        ),
    ],
)
def test_every_leaf_in_exactly_one_group_and_every_prefix_a_match(groups, said):
    optimizer, _ = built(groups)
    with pytest.raises(ValueError, match=said):
        optimizer.init(PARAMS)


@pytest.mark.parametrize(
    ("section", "said"),
    [
        ({"groups": {"a": {**GROUPS["norm"], "args": {"lr": -1.0}}}}, "c.json: optimizer.groups.a.args.lr: "),
        ({"groups": {"a": GROUPS["norm"]}, "name": "adam"}, 'c.json: optimizer.name: with "groups", each group has'),
        ({"groups": {}}, "c.json: optimizer.groups: expected an object of named groups"),
        ({"groups": {"a.b": GROUPS["norm"]}}, "c.json: optimizer.groups: group name 'a.b': expected letters"),
        ({"groups": {"a": {"name": "sgd", "args": {"lr": 0.1}}}}, 'c.json: optimizer.groups.a: expected {"params"'),
        ({"groups": {"a": {**GROUPS["norm"], "params": ["blocks"]}}}, "c.json: optimizer.groups.a.params.0: expected"),
        ({"groups": {"a": {**GROUPS["norm"], "frozen": []}}}, "c.json: optimizer.groups.a.frozen: frozen applies"),
        ({"groups": {"a": {**GROUPS["norm"], "name": "adamm"}}}, "c.json: optimizer.groups.a.name: unknown optimizer"),
        (
            {
                "groups": {
                    "a": {
                        **GROUPS["norm"],
                        "args": {},
                        "schedule": {"name": "reduce_on_plateau", "args": {"init_value": 1}},
                    }
                }
            },
            "c.json: optimizer.groups.a.schedule: reduce_on_plateau is not supported in a group",
        ),
    ],
)
def test_bad_group_configs_are_one_line_at_their_place(section, said):
    config = {"optimizer": section, "trainer": {"epochs": 1}}
    with pytest.raises(ConfigError, match="^" + re.escape(said)) as error:
        check_optimizer(config, "c.json")
        build_optimizer(config, source="c.json")
    assert "\n" not in str(error.value)


def test_run_length_schedules_are_found_in_groups():
    groups = {
        "a": {
            **GROUPS["norm"],
            "schedule": {"name": "cosine_decay", "args": {"init_value": 0.1, "decay_steps": "all"}},
        },
        "b": {**GROUPS["conv"], "args": {"lr": {"name": "cosine_decay", "args": {"decay_steps": {"epochs": 1}}}}},
    }
    assert run_length_arguments({"optimizer": {"groups": groups}}) == [
        "optimizer.groups.a.schedule.args.decay_steps",
        "optimizer.groups.b.args.lr.args.decay_steps",
    ]


@pytest.mark.slow
def test_two_groups_with_frozen_ema_accumulation_and_bf16_train_and_resume_bitwise(tmp_path, data_dir):  # noqa: F811
    """train.py with two groups (the hidden layer at a tenth of the head's rate, with a cosine over 2 epochs), a frozen
    bias, an EMA, 2 accumulated batches per step and bfloat16 compute: it trains, logs each group's rate, and a run
    stopped after epoch 1 and resumed ends bit for bit where an uninterrupted one does; each step's line names every
    group's rate. A leaf in no group: exit 2."""
    # in epochs, not "all": a run started with --epochs 1 keeps the length it started with when resumed for more
    cosine = {"name": "cosine_decay", "args": {"init_value": 0.003, "decay_steps": {"epochs": 2}}}
    optimizer = {
        "groups": {
            "hidden": {"params": ["params.fc0"], "name": "adamw", "args": {"lr": 0.0003}},
            "head": {"params": ["params.head"], "name": "sgd", "args": {"momentum": 0.9}, "schedule": cosine},
        },
        "frozen": ["params.fc0.bias"],
    }
    changes = {"optimizer": optimizer, "callbacks": [{"name": "ema", "args": {"decay": 0.9}}]}
    trainer = {"trainer__accumulate_steps": 2, "trainer__precision": {"compute": "bfloat16"}}
    config = make_config(tmp_path, data_dir, **changes, **trainer)
    straight = run("train.py", "-c", config, "--run-id", "straight")
    assert straight.returncode == 0, straight.stderr
    assert run("train.py", "-c", config, "--run-id", "split", "--epochs", "1").returncode == 0
    resumed = run("train.py", "-r", tmp_path / "saved/tiny/split/checkpoint-latest.params", "--epochs", "2")
    assert resumed.returncode == 0, resumed.stderr
    a, header_a = params_of(tmp_path / "saved/tiny/straight/checkpoint-latest.params")
    b, header_b = params_of(tmp_path / "saved/tiny/split/checkpoint-latest.params")
    assert header_a["step"] == header_b["step"] and a.keys() == b.keys()
    assert {"opt_state.hidden.0.mu.fc0.weight", "opt_state.head.0.trace.head.weight"} <= set(a)
    assert not any(k.startswith("opt_state") and k.endswith("fc0.bias") for k in a)  # frozen: no state
    for key in a:
        assert a[key].tobytes() == b[key].tobytes(), key
    before, _ = params_of(tmp_path / "saved/tiny/split/checkpoint-epoch_1.params")
    assert a["params.fc0.bias"].tobytes() == before["params.fc0.bias"].tobytes()
    rows = [json.loads(line) for line in (tmp_path / "saved/tiny/straight/metrics.jsonl").read_text().splitlines()]
    assert rows[0]["lr/hidden"] == pytest.approx(0.0003) and rows[0]["lr"] == rows[0]["lr/hidden"]
    assert rows[1]["lr/head"] < rows[0]["lr/head"] < 0.003
    log = (tmp_path / "saved/tiny/straight/train.log").read_text()
    steps = [line for line in log.splitlines() if re.search(r"epoch \d+ step \d+: ", line)]
    assert "epoch 1 step 1: " in steps[0] and "lr/hidden 0.0003  lr/head 0.003  grad_norm" in steps[0]
    assert all("lr/hidden 0.0003  lr/head " in line for line in steps), steps

    optimizer["groups"]["head"]["params"] = ["params.head.weight"]
    bad = run("train.py", "-c", make_config(tmp_path, data_dir, optimizer=optimizer), "--fast-dev-run")
    assert bad.returncode == 2
    assert (
        bad.stderr.strip()
        .splitlines()[-1]
        .endswith(
            "optimizer.groups: params.head.bias lies in no group (groups: hidden, head); each trained parameter lies in "
            "exactly one"
        )
    )
