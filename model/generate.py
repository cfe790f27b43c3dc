"""Text from a language model, one character at a time (sample.py and the generate_text callback).

The model sees the last `context` characters; they sit at the start of a fixed (1, context) buffer, padded on the
right, and the next character is drawn from the logits at the last real position (the model is causal, so the
padding cannot change them): one compilation for any prompt and length.
"""

from __future__ import annotations

import jax
import numpy as np


class Generator:
    def __init__(self, model, input_spec, vocabulary: list[str]):
        """`input_spec`: the training batch's input (B, context) ids, whose dtype and context length are used."""
        self.vocabulary = list(vocabulary)
        self.context, self.dtype = input_spec.shape[1], input_spec.dtype

        @jax.jit
        def next_logits(params, state, window, position):
            logits, _ = model(params, state, window, train=False)
            return logits[0, position]

        self.next_logits = next_logits

    def __call__(
        self, params, state, prompt: str, tokens: int, temperature: float = 0.8, top_k: int | None = None, seed: int = 0
    ) -> str:
        """`prompt` and `tokens` characters after it; temperature 0: always the most likely one."""
        rng = np.random.default_rng(seed)
        ids = [self.vocabulary.index(c) for c in prompt]
        for _ in range(tokens):
            recent = ids[-self.context :]
            window = np.zeros((1, self.context), self.dtype)
            window[0, : len(recent)] = recent
            logits = np.asarray(self.next_logits(params, state, window, len(recent) - 1), np.float64)
            if temperature == 0:
                ids.append(int(logits.argmax()))
                continue
            logits = logits / temperature
            if top_k is not None and top_k < len(logits):
                logits[logits < np.sort(logits)[-top_k]] = -np.inf
            p = np.exp(logits - logits.max())
            ids.append(int(rng.choice(len(p), p=p / p.sum())))
        return "".join(self.vocabulary[i] for i in ids)
