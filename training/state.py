"""The training state: a dict ``{"params", "state", "opt_state", "step", "rng"}``, plus ``loss_scale`` for float16,
``callbacks`` for the callbacks that update inside the step (an average of the parameters, say) and ``step_state``
for a step that keeps state of its own (its ``init``: docs/steps.md). A run starts from a
fresh one (``init``), continues from a checkpoint's (``restore``) or takes another run's weights (``load_weights``);
each is a function of the assembled run, its optimizer and where the state lives (``training/devices/placement.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from training.devices import compilation_cache, mesh, platform
from training.precision import Policy
from training.run import checkpoint


def fresh(run, optimizer, policy: Policy, seed) -> dict:
    """The state a run starts from: init and dropout keys both derive from `seed`."""
    init_key, rng = jax.random.split(jax.random.PRNGKey(seed))
    inputs = run.model_input_spec()
    params, model_state = run.model.init(init_key, inputs)
    train_state = {
        "params": params,
        "state": model_state,
        "opt_state": optimizer.init(params),
        "step": jnp.zeros((), jnp.int32),
        "rng": rng,
    }
    if policy.scaled:
        train_state["loss_scale"] = policy.init_scale()
    in_step = run.in_step_callbacks()
    if in_step:
        train_state["callbacks"] = {c.name: c.init(params) for c in in_step}
    own = getattr(run.step, "init", None)
    if own is not None:
        train_state["step_state"] = own(run.model, train_state, inputs)
    return train_state


def template(run, optimizer, policy: Policy) -> dict:
    """The state's abstract value (shapes and dtypes, nothing computed)."""
    return jax.eval_shape(lambda: fresh(run, optimizer, policy, 0))


def init(run, optimizer, policy: Policy, seed: int, sharding) -> tuple[dict, str]:
    """A fresh state from `seed` on the mesh, built by one jitted call (no eager per-layer work), and where that
    call's program came from (``compilation_cache.origin``)."""
    lowered = jax.jit(lambda s: fresh(run, optimizer, policy, s), out_shardings=sharding).trace(seed).lower()
    size = sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(lowered.out_info))
    options = platform.init_options(size, jax.default_backend()) or None
    compiled, where = compilation_cache.origin(lambda: lowered.compile(options))
    return compiled(seed), where


def restore(path: Path, abstract: dict, empty_stats: Callable, mesh_) -> tuple[dict, dict, dict | None]:
    """A checkpoint's state on the mesh (every process reads the file; each keeps its shards), its header, and the
    statistics of the epoch under way when it was saved mid-epoch (else None). ``abstract``: the state's template;
    ``empty_stats(abstract)``: the epoch statistics' zeros, their template."""

    def expected(header: dict) -> dict:
        if header.get("position"):
            return {**abstract, "epoch_totals": empty_stats(abstract)}
        return abstract

    tree, header = checkpoint.restore(path, expected, lazy=True)
    totals = tree.pop("epoch_totals", None)
    if totals is not None:
        totals = jax.tree.map(np.asarray, totals)
    return place(tree, mesh.state_shardings(tree, mesh_)), header, totals


def place(tree: dict, shardings: dict) -> dict:
    """A checkpoint's leaves on the mesh: a sharded checkpoint's built device by device from the pieces that overlap
    each device's slice (each process reads only the shard files its devices need), a one-file checkpoint's
    arrays placed whole."""

    def build(leaf, sharding):
        if isinstance(leaf, checkpoint.Sharded):
            return jax.make_array_from_callback(leaf.shape, sharding, leaf.__getitem__)
        return leaf

    placed = mesh.to_mesh(jax.tree.map(build, tree, shardings), shardings)
    sharded = [leaf for leaf in jax.tree.leaves(tree) if isinstance(leaf, checkpoint.Sharded)]
    if sharded:  # the same index on every process: all of them agree here
        bad = [leaf for leaf in sharded if leaf.nonfinite]
        (anywhere,) = mesh.max_over_processes(int(bool(bad)))
        if bad:
            raise checkpoint.CheckpointError(bad[0].refusal())
        if anywhere:
            raise checkpoint.CheckpointError(
                f"{sharded[0].files.index}: another process found NaN/Inf values in its slices (a diverged run?); "
                f"refused"
            )
    return placed


def load_weights(train_state: dict, path: Path, mesh_, exclude: Sequence[str] = ()) -> dict:
    """Fine-tuning: params and model state from another checkpoint into `train_state`. Key paths under an ``exclude``
    prefix (e.g. ``params.head``, a new classifier) keep their fresh values."""
    expected = {"params": train_state["params"], "state": train_state["state"]}
    tree, _ = checkpoint.restore(path, expected, only=("params", "state"), exclude=exclude, lazy=True)
    return {**train_state, **place(tree, mesh.state_shardings(tree, mesh_))}


def eval_params(train_state: dict, evaluated=None):
    """The parameters evaluation uses: the `evaluated` callback's (``Run.evaluated_callback``), else the trained."""
    if evaluated is None:
        return train_state["params"]
    return train_state["callbacks"][evaluated.name]["params"]
