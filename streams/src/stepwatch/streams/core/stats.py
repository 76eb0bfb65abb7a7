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
    return nanmed(rows, 0)


def nanmed(a: np.ndarray, axis: int = -1) -> np.ndarray:
    """Median along ``axis`` skipping NaN (NaN where none): :func:`med` of each lane, in one sort.

    The same values as :func:`med` (up to the sign of a zero): the middle
    value, or the mean of the two middle values computed as ``(lo + hi) * 0.5``.
    """
    nd = a.ndim
    ax = axis % nd
    if ax != nd - 1:  # the lanes last: np.moveaxis without its argument checks
        a = a.transpose(*[i for i in range(nd) if i != ax], ax)
    s = np.sort(a, axis=-1)  # NaN sorts last
    shape, n = s.shape[:-1], s.shape[-1]
    if n == 0:
        return np.full(shape, NAN)
    s = s.reshape(-1, n)
    last_nan = np.isnan(s[:, -1])  # NaN sorts last: a lane with a NaN ends with one
    if not last_nan.any() or (np.isnan(s[:, 0]) == last_nan).all():
        # every lane complete or all NaN (an unmeasured quantity): the middle value(s);
        # an all-NaN lane gives NaN from its own values
        h = n // 2
        mid = s[:, h] if n % 2 else (s[:, h - 1] + s[:, h]) * 0.5
        return mid.reshape(shape)
    count = n - np.isnan(s).sum(axis=1)
    lanes = np.arange(s.shape[0])
    lo = np.maximum((count - 1) // 2, 0)
    hi = np.minimum(count // 2, n - 1)
    lo_v, hi_v = s[lanes, lo], s[lanes, hi]
    mid = np.where(lo == hi, lo_v, (lo_v + hi_v) * 0.5)  # odd count: the middle value itself
    return np.where(count == 0, NAN, mid).reshape(shape)


def nanlowmed(a: np.ndarray) -> np.ndarray:
    """Lower median along the last axis, NaN skipped (NaN where none): the value that at
    least half of each lane's values reach, the smaller middle one of an even count (of
    two values, the smaller). A lane's lower median rises only when most of it does."""
    s = np.sort(a, axis=-1)  # NaN sorts last
    shape, n = s.shape[:-1], s.shape[-1]
    if n == 0:
        return np.full(shape, NAN)
    s = s.reshape(-1, n)
    count = n - np.isnan(s).sum(axis=1)
    low = s[np.arange(s.shape[0]), np.maximum((count - 1) // 2, 0)]
    return np.where(count == 0, NAN, low).reshape(shape)


def nmin(x: np.ndarray) -> float:
    v = x[~np.isnan(x)]
    return float(v.min()) if v.size else NAN


def opt(x: float) -> float | None:
    """NaN -> None, for evidence fields."""
    return None if x != x else x


def rowmed(a: np.ndarray) -> np.ndarray:
    """Median of each row of a 2-D array, NaN skipped; fast (one ``np.partition``) when
    every row is either complete or all NaN (unmeasured), :func:`nanmed` otherwise."""
    n = a.shape[1]
    if n == 0:
        return np.full(a.shape[0], NAN)
    count = np.isnan(a).sum(axis=1)
    if not ((count == 0) | (count == n)).all():
        return nanmed(a, -1)
    h = n // 2
    if n % 2:
        return np.partition(a, h, axis=1)[:, h]
    p = np.partition(a, (h - 1, h), axis=1)
    return (p[:, h - 1] + p[:, h]) * 0.5


def change_point(x: np.ndarray, min_after: int = 1) -> int:
    """Index of the first value after a single upward change in ``x`` (0: the whole
    series is after it): the split that maximises ``k (n - k) / n x (mean after - mean
    before)^2``, the least-squares change-point estimate, with at least ``min_after``
    values after it; NaN values are skipped."""
    v = x[~np.isnan(x)]
    n = len(v)
    if n < 1 + max(min_after, 1):
        return 0
    csum = np.cumsum(v)
    k = np.arange(1, n)
    before = csum[:-1] / k
    after = (csum[-1] - csum[:-1]) / (n - k)
    gain = k * (n - k) / n * (after - before) ** 2
    gain[after <= before] = 0.0
    gain[n - k < min_after] = 0.0
    best = int(np.argmax(gain))
    return best + 1 if gain[best] > 0 else 0


def median_change_point(x: np.ndarray, min_after: int = 1) -> int:
    """Index of the first value after a single upward change in ``x`` (0: none): the
    least-absolute-deviations split, the ``k`` whose two parts lie closest to their own
    medians (the sum of ``|value - its part's median|`` smallest), the part after the
    split having the higher median. :func:`change_point` is the same with squares and
    means; one outlying value there weighs by its square and pulls the split onto
    itself, here it weighs by its distance, as any value does. At least ``min_after``
    values lie after the split. NaN values are skipped (the index then counts the
    other values only)."""
    v = x[~np.isnan(x)]
    n = len(v)
    best, cost = 0, float("inf")
    for k in range(1, n - max(min_after, 1) + 1):
        a, b = v[:k], v[k:]
        ma, mb = med(a), med(b)
        c = float(np.abs(a - ma).sum() + np.abs(b - mb).sum())
        if mb > ma and c < cost:
            best, cost = k, c
    return best
