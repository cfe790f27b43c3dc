"""Writes churn.csv: 2,000 customers of a made-up subscription service, about 1 in 10 of whom leave (churned = 1),
the table as such data comes: a categorical column, empty cells, numbers in their own units.

    plan              "basic", "standard" or "premium" (text); 5% of cells empty
    contract          "monthly" or "yearly" (text)
    tenure_months     1 to 72; 8% of cells empty
    monthly_charges   in currency units, about 20 to 120
    support_calls     0, 1, 2, ... (counts)
    churned           0 or 1, the target

    log-odds of churning = -2.9 + 1.2 [monthly contract] + 0.45 support_calls - 0.045 tenure_months
                           + 0.02 (monthly_charges - 60) + 0.6 [basic plan] + Gaussian noise of std 0.5

No model can rank perfectly: the noiseless log-odds themselves rank all 2,000 rows with a ROC-AUC of 0.79 and a
PR-AUC (average precision) of 0.32, where a random ranking scores 0.5 and the share of positives (0.097). A split of
400 rows holds about 40 positives, so its scores vary by several hundredths around those.

    python data/churn/make_churn.py          # rewrites data/churn/churn.csv, byte for byte the same
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

ROWS = 2000
SEED = 0
PLANS = ("basic", "standard", "premium")
PLAN_EMPTY = 0.05
TENURE_EMPTY = 0.08


def main(path: Path = Path(__file__).with_name("churn.csv")) -> None:
    rng = np.random.default_rng(SEED)
    plan = rng.choice(len(PLANS), ROWS, p=[0.4, 0.4, 0.2])
    monthly = rng.random(ROWS) < 0.6
    tenure = rng.integers(1, 73, ROWS)
    charges = 20 + 25 * plan + rng.normal(30, 12, ROWS).clip(0, 60)
    calls = rng.poisson(1.2, ROWS)
    logit = (
        -2.9
        + 1.2 * monthly
        + 0.45 * calls
        - 0.045 * tenure
        + 0.02 * (charges - 60)
        + 0.6 * (plan == 0)
        + 0.5 * rng.standard_normal(ROWS)
    )
    churned = rng.random(ROWS) < 1 / (1 + np.exp(-logit))
    plan_empty = rng.random(ROWS) < PLAN_EMPTY
    tenure_empty = rng.random(ROWS) < TENURE_EMPTY
    lines = ["plan,contract,tenure_months,monthly_charges,support_calls,churned"]
    for i in range(ROWS):
        cells = [
            "" if plan_empty[i] else PLANS[plan[i]],
            "monthly" if monthly[i] else "yearly",
            "" if tenure_empty[i] else str(tenure[i]),
            f"{charges[i]:.2f}",
            str(calls[i]),
            str(int(churned[i])),
        ]
        lines.append(",".join(cells))
    path.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
