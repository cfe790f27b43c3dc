"""Mixed precision: ``trainer.precision = {"params": "float32", "compute": "bfloat16"}`` (or "float16").

Parameters, optimizer state and checkpoints stay float32. Inside the training step the parameters and the floating
inputs are cast to the compute dtype, the model runs in it, and its outputs are cast back to float32 before the loss
and the metrics, so both are computed in float32. Gradients arrive in float32 through the casts.

float16 has too few exponent bits for small gradients: its policy scales the loss before the backward pass and
divides the gradients after (dynamic loss scaling). A step whose gradients overflow is skipped (parameters and
optimizer state unchanged) and halves the scale; `period` finite steps in a row double it. The scale lives in the
training state (``train_state["loss_scale"]``), so it is checkpointed and a resumed run continues with it.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

COMPUTE_DTYPES = ("float32", "bfloat16", "float16")
KEYS = ("params", "compute", "loss_scale", "period")


class Policy(NamedTuple):
    compute: str = "float32"
    loss_scale: float = 2.0**15  # the initial scale (float16 only)
    period: int = 2000  # finite steps before the scale doubles (float16 only)

    @property
    def casts(self) -> bool:
        return self.compute != "float32"

    @property
    def scaled(self) -> bool:
        return self.compute == "float16"

    def describe(self) -> str:
        """The policy in the start-up log's words."""
        if not self.casts:
            return "float32 throughout"
        scaling = f"; dynamic loss scaling from {self.loss_scale:g}" if self.scaled else ""
        return f"the model in {self.compute}; parameters, optimizer state, loss and metrics in float32{scaling}"

    def to_compute(self, tree):
        """Floating leaves in the compute dtype; integer leaves (token ids, labels) untouched."""
        if not self.casts:
            return tree
        dtype = jnp.dtype(self.compute)
        return jax.tree.map(lambda a: a.astype(dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a, tree)

    def apply(self, model, params, state, inputs, **kwargs):
        """The model run in the compute dtype: (outputs in float32, the new model state in the state's dtypes)."""
        if not self.casts:
            return model(params, state, inputs, **kwargs)
        outputs, new_state = model(self.to_compute(params), state, self.to_compute(inputs), **kwargs)
        return jax.tree.map(lambda a: a.astype(jnp.float32), outputs), like(new_state, state)

    def init_scale(self) -> dict:
        return {"scale": jnp.asarray(self.loss_scale, jnp.float32), "good_steps": jnp.zeros((), jnp.int32)}

    def next_scale(self, scale: dict, finite) -> dict:
        grown = scale["good_steps"] + 1 >= self.period
        return {
            "scale": jnp.where(
                finite, jnp.where(grown, scale["scale"] * 2, scale["scale"]), jnp.maximum(scale["scale"] / 2, 1.0)
            ),
            "good_steps": jnp.where(finite & ~grown, scale["good_steps"] + 1, 0),
        }


def like(tree, reference):
    """`tree`'s leaves in the dtypes of `reference`'s (the model state back in its own dtypes)."""
    return jax.tree.map(lambda a, r: a.astype(r.dtype), tree, reference)


def policy_of(spec) -> Policy:
    """``trainer.precision`` (null: float32 throughout) as a Policy; a ValueError names what is wrong."""
    if spec is None:
        return Policy()
    if not isinstance(spec, dict):
        raise ValueError(
            f'expected null or an object with "compute" (one of {", ".join(COMPUTE_DTYPES)}), got {spec!r}'
        )
    unknown = [key for key in spec if key not in KEYS]
    if unknown:
        raise ValueError(f"{unknown[0]}: unknown key; keys: {', '.join(KEYS)}")
    if spec.get("params", "float32") != "float32":
        raise ValueError(f'params: parameters and optimizer state stay "float32", got {spec["params"]!r}')
    compute = spec.get("compute", "float32")
    if compute not in COMPUTE_DTYPES:
        raise ValueError(f"compute: expected one of {', '.join(COMPUTE_DTYPES)}, got {compute!r}")
    for key in ("loss_scale", "period"):
        if key in spec and compute != "float16":
            raise ValueError(f"{key}: only float16 scales the loss (compute is {compute!r})")
    defaults = Policy._field_defaults
    scale = spec.get("loss_scale", defaults["loss_scale"])
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 1 <= scale <= 2.0**64:
        raise ValueError(f"loss_scale: expected a number from 1 to 2**64, got {scale!r}")
    period = spec.get("period", defaults["period"])
    if isinstance(period, bool) or not isinstance(period, int) or not 1 <= period <= 10**9:
        raise ValueError(f"period: expected an integer from 1 to 10**9, got {period!r}")
    return Policy(compute, float(scale), period)
