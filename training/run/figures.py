"""Where a run's figures come from: ``training/plots/`` (curves.png, the confusion matrix, predictions.png, the lr
finder's plot), an optional part. Everything in the core that draws asks ``plots()`` here, the one place that names
it: a project without that folder draws nothing, and the numbers stay in their files (metrics.jsonl, per_class.csv,
lr_finder.csv) and on the console.
"""

from __future__ import annotations

import importlib
import importlib.util

FIGURES = "training.plots.figures"


def plots():
    """The ``training.plots.figures`` module, or None where the project has no ``training/plots/``."""
    if importlib.util.find_spec(FIGURES.rpartition(".")[0]) is None or importlib.util.find_spec(FIGURES) is None:
        return None
    return importlib.import_module(FIGURES)
