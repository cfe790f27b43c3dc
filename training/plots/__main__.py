"""python -m training.plots saved/<name>/<run_id> [-o curves.png]: a run folder's metrics.jsonl drawn as curves.png,
any time (a run still going included); train.py draws it when a run ends."""

import sys

from training.plots.figures import main
from training.run.cli import command

sys.exit(command(main))
