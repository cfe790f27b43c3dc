"""The model's inputs as the exporters see them, from the data's spec (`DataLoader.spec["input"]`): one array or a
dict of named arrays, each with its own dtype and shape, so int32 token ids stay int32 and a dict becomes several
named inputs in every format (a single array is named "input"; a dict's inputs are named by their keys, in sorted
order); and random inputs of that kind, to compare an exported file with the JAX model.

A model whose call declares ``mask`` (a padding mask) takes the batch's mask as one more named input, "mask"
(`with_mask`): random masks keep a leading run of real positions, as padded data does.

Outputs likewise: one array is one output (named "outputs"), a dict of arrays (a model of several outputs) one
named output per key, in sorted order, each judged by its own task.
"""

from __future__ import annotations

import jax
import numpy as np

from inference.predict import MASK  # the named input of a model that declares mask (predict.py ships alone)
from model.modules.module import key_path_str


class Inputs:
    """The model's input tree as the exporters see it: flat, named, with a batch of a given size."""

    def __init__(self, spec, batch: int):
        paths, self.treedef = jax.tree_util.tree_flatten_with_path(spec)
        self.single = not isinstance(spec, dict)
        self.names = ["input"] if self.single else [key_path_str(p) for p, _ in paths]
        self.specs = [jax.ShapeDtypeStruct((batch, *leaf.shape[1:]), leaf.dtype) for _, leaf in paths]

    def tree(self, flat):
        return jax.tree_util.tree_unflatten(self.treedef, list(flat))

    def flat_fn(self, fn):
        """fn of the input tree as a function of the flat inputs, in `names` order."""
        return lambda *flat: fn(self.tree(flat))

    def feed(self, flat: list) -> np.ndarray | dict:
        """What a runner takes: the one array, or the named arrays."""
        return flat[0] if self.single else dict(zip(self.names, flat))

    def described(self) -> list[dict]:
        return [
            {"name": n, "shape": shape_text((None, *s.shape[1:])), "dtype": str(np.dtype(s.dtype))}
            for n, s in zip(self.names, self.specs)
        ]


def shape_text(shape) -> str:
    return "[" + ",".join("B" if d is None else str(d) for d in shape) + "]"


def with_mask(x, mask) -> dict:
    """The named inputs of a model that declares ``mask``: its input ("input", or its own named inputs) and the
    mask."""
    return {**x, MASK: mask} if isinstance(x, dict) else {"input": x, MASK: mask}


def without_mask(x: dict, single: bool):
    """(the model's input, the mask) from `with_mask`'s inputs; `single`: the model takes one array."""
    return (x["input"] if single else {k: v for k, v in x.items() if k != MASK}), x[MASK]


def random_mask(shape: tuple, dtype, rng: np.random.Generator) -> np.ndarray:
    """Masks as padded data holds them: per example, a random number (at least 1) of real positions along the first
    axis of the example, then padding; a mask of one value per example is all ones."""
    if len(shape) < 2:
        return np.ones(shape, dtype)
    real = np.arange(shape[1]) < rng.integers(1, shape[1] + 1, (shape[0], 1))
    return np.broadcast_to(real.reshape(real.shape + (1,) * (len(shape) - 2)), shape).astype(dtype)


def random_inputs(inputs: Inputs, n: int, rng: np.random.Generator, id_bound: dict) -> list[np.ndarray]:
    """Random inputs of batch n: floats normal, integers uniform in [0, id_bound[name]), a padding mask (the input
    named "mask" beside others) as padded data holds it."""
    flat = []
    for name, spec in zip(inputs.names, inputs.specs):
        shape, dtype = (n, *spec.shape[1:]), np.dtype(spec.dtype)
        if name == MASK and not inputs.single:
            flat.append(random_mask(shape, dtype, rng))
        elif np.issubdtype(dtype, np.integer) or dtype == np.bool_:
            flat.append(rng.integers(0, max(id_bound.get(name, 2), 1), shape).astype(dtype))
        else:
            flat.append(rng.standard_normal(shape).astype(dtype))
    return flat


def names_of(output_name: str | list[str]) -> list[str]:
    """The outputs' names: one name, or a list of them (a model of several outputs, in the order fn returns them)."""
    return [output_name] if isinstance(output_name, str) else list(output_name)


class Outputs:
    """The model's outputs as the exporters see them: one array (``single_name``), or a dict of named arrays, each
    named by its key, in sorted order (as ``jax.tree`` flattens a dict); ``tasks``: each output's task. ``spec``:
    the model's output (or its abstract value); None stands for one array."""

    def __init__(self, spec, task: str | dict, single_name: str):
        self.single = not isinstance(spec, dict)
        self.names = [single_name] if self.single else sorted(spec)
        self.tasks = {n: task if isinstance(task, str) else task.get(n, "other") for n in self.names}

    def flat(self, tree) -> list:
        """The outputs of the model (its array, or its dict) as a list in ``names`` order."""
        return [tree] if self.single else [tree[n] for n in self.names]

    def targets(self, tree) -> list:
        """The data's targets in ``names`` order: the one array of one output; named outputs' by name, None for an
        output without a target of its own (a GAN's images and scores, judged against no target)."""
        if tree is None or self.single:
            return [tree] * len(self.names)
        return [tree.get(n) if isinstance(tree, dict) else None for n in self.names]

    def of(self, got) -> list:
        """A runner's answer (one array, or a dict of named arrays) as a list in ``names`` order."""
        return [got] if not isinstance(got, dict) else [got[n] for n in self.names]

    def flat_fn(self, fn):
        """fn returning one array, or the tuple of its named outputs in ``names`` order: what every format holds."""
        return fn if self.single else (lambda *args: tuple(self.flat(fn(*args))))
