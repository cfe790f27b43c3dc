"""Writes regression.csv: 4,000 rows of 8 features and a target with a known signal and known noise.

    z_k uniform on [-2, 2], x_k = LOC[k] + SCALE[k] z_k     each feature in units of its own
    y   = sin(2 z_1) + 0.5 z_2^2 + z_3 z_4 / 2 + 0.8 tanh(z_5) - 0.5     (z_6, z_7, z_8 carry no signal)
          + Gaussian noise of standard deviation NOISE_STD

The best any model can do is to predict the signal itself: RMSE NOISE_STD = 0.25 and MAE NOISE_STD * sqrt(2 / pi)
= 0.199 on average (a split of a few hundred rows varies by a few percent around that). The features come in very
different units (SCALE spans 0.01 to 1000), so a network trained on them unstandardised struggles.

    python data/regression/make_data.py          # rewrites data/regression/regression.csv, byte for byte the same
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

ROWS = 4000
SEED = 0
NOISE_STD = 0.25
LOC = np.array([0.0, 5.0, -3.0, 100.0, 0.0, 50.0, 1.0, 0.0])
SCALE = np.array([1.0, 2.0, 0.5, 20.0, 1000.0, 10.0, 0.01, 3.0])


def signal(z: np.ndarray) -> np.ndarray:
    return np.sin(2 * z[:, 0]) + 0.5 * z[:, 1] ** 2 + z[:, 2] * z[:, 3] / 2 + 0.8 * np.tanh(z[:, 4]) - 0.5


def main(path: Path = Path(__file__).with_name("regression.csv")) -> None:
    rng = np.random.default_rng(SEED)
    z = rng.uniform(-2.0, 2.0, (ROWS, len(LOC)))
    y = signal(z) + NOISE_STD * rng.standard_normal(ROWS)
    x = LOC + SCALE * z
    names = [f"x{k + 1}" for k in range(len(LOC))] + ["y"]
    lines = [",".join(names)]
    # 5 significant digits: rounding adds noise of relative size 1e-5, nothing next to NOISE_STD
    lines += [",".join(f"{v:.5g}" for v in row) for row in np.column_stack([x, y])]
    path.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
