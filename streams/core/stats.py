"""Small robust statistics that skip NaN, cheaper than ``np.nanmedian`` on small arrays."""

from __future__ import annotations

import numpy as np

NAN = float("nan")
MAD_SIGMA = 1.4826  # MAD x this estimates the standard deviation of normal data


def med(x: np.ndarray) -> float:
    """Median of the non-NaN values; NaN when there are none."""
    v = x[~np.isnan(x)]
    n = v.size
    if n == 0:
        return NAN
    v.sort()
    h = n // 2
    return float(v[h]) if n % 2 else float((v[h - 1] + v[h]) * 0.5)


def mad_sigma(x: np.ndarray, center: float | None = None) -> float:
    """Robust standard deviation: 1.4826 x median absolute deviation (NaN skipped)."""
    c = med(x) if center is None else center
    return MAD_SIGMA * med(np.abs(x - c))


def colmed(rows: np.ndarray) -> np.ndarray:
    """Per-column median of a 2-D array, skipping NaN."""
    return np.array([med(rows[:, j]) for j in range(rows.shape[1])])


def nmin(x: np.ndarray) -> float:
    v = x[~np.isnan(x)]
    return float(v.min()) if v.size else NAN


def opt(x: float) -> float | None:
    """NaN -> None, for evidence fields."""
    return None if x != x else x
