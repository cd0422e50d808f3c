"""Statistics over the seeds of one configuration, as rliable recommends (Agarwal et al. 2021).

The interquartile mean (IQM) with a percentile bootstrap confidence interval, a paired
difference with Student's t interval, and the env steps a run took to solve its task.
Plain numpy, usable on any list of per-seed numbers:

    from agent.sweep.stats import bootstrap_ci, iqm
    finals = [500.0, 480.0, 120.0, 495.0, 310.0]
    print(iqm(finals), bootstrap_ci(finals))
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = [
    "bootstrap_ci",
    "difference_ci",
    "iqm",
    "iqm_rows",
    "percentiles",
    "steps_to_solve",
    "t_critical",
    "verdict",
]


def iqm(values: Any) -> float:
    """Interquartile mean: the mean of the middle 50% (``scipy.stats.trim_mean(x, 0.25)``)."""
    x = np.sort(np.asarray(values, dtype=np.float64).ravel())
    if x.size == 0:
        raise ValueError("iqm of no values")
    k = int(0.25 * x.size)
    return float(x[k : x.size - k].mean())


def iqm_rows(samples: np.ndarray) -> np.ndarray:
    """The IQM of each row of ``samples`` (e.g. bootstrap resamples x seeds) at once."""
    n = samples.shape[1]
    k = int(0.25 * n)
    return np.sort(samples, axis=1)[:, k : n - k].mean(axis=1)


# Each statistic's value on every row of a resample matrix (resamples x seeds) at once.
_ROWS = {
    "iqm": iqm_rows,
    "mean": lambda samples: samples.mean(axis=1),
    "median": lambda samples: np.median(samples, axis=1),
}


def _rows(statistic: str) -> Any:
    try:
        return _ROWS[statistic]
    except KeyError:
        raise ValueError(f"statistic {statistic!r}: one of {', '.join(_ROWS)}") from None


def bootstrap_ci(
    values: Any,
    statistic: str = "iqm",
    confidence: float = 0.95,
    reps: int = 50_000,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap confidence interval of the IQM (or ``"mean"``, ``"median"``)
    over seeds.

    Resamples the seeds with replacement ``reps`` times (rliable's default of 50 000)
    with a fixed ``seed``, so the same results always give the same interval.
    """
    rows = _rows(statistic)
    x = np.asarray(values, dtype=np.float64).ravel()
    if x.size == 0:
        raise ValueError("confidence interval of no values")
    rng = np.random.default_rng(seed)
    stats = rows(x[rng.integers(0, x.size, size=(reps, x.size))])
    tail = 100 * (1 - confidence) / 2
    lo, hi = np.percentile(stats, [tail, 100 - tail])
    return float(lo), float(hi)


def difference_ci(
    a: Any,
    b: Any,
    statistic: str = "iqm",
    paired: bool = False,
    reps: int = 50_000,
    seed: int = 0,
) -> tuple[float, float, float]:
    """``statistic(a) - statistic(b)`` and its 95% CI: (difference, low, high).

    ``paired`` (a seed's run of each, in order): the mean of the per-seed differences
    with Student's t interval. A percentile bootstrap of so few differences is far too
    narrow: of three that share a sign, no resample's mean crosses zero, so it would
    call a coin's 1-in-4 chance a difference. One pair gives no interval (-inf, inf).
    Otherwise ``a`` and ``b`` are each resampled alone (percentile bootstrap), with
    ``statistic`` ``"iqm"``, ``"mean"`` or ``"median"``. Rliable's stratified bootstrap
    over games is the Atari report's own (``bench/atari100k.py``)."""
    rows = _rows(statistic)
    xa, xb = np.asarray(a, dtype=np.float64).ravel(), np.asarray(b, dtype=np.float64).ravel()
    if xa.size == 0 or xb.size == 0:
        raise ValueError("confidence interval of no values")
    if paired:
        if xa.size != xb.size:
            raise ValueError(f"paired runs: {xa.size} against {xb.size}")
        d = xa - xb
        point = float(d.mean())
        if d.size == 1:
            return point, -math.inf, math.inf
        half = t_critical(d.size - 1) * float(d.std(ddof=1)) / math.sqrt(d.size)
        return point, point - half, point + half
    rng = np.random.default_rng(seed)
    sa = xa[rng.integers(0, xa.size, size=(reps, xa.size))]
    sb = xb[rng.integers(0, xb.size, size=(reps, xb.size))]
    diffs = rows(sa) - rows(sb)
    point = float(rows(xa[None])[0] - rows(xb[None])[0])
    lo, hi = np.percentile(diffs, [2.5, 97.5])
    return point, float(lo), float(hi)


def verdict(low: float, high: float) -> str:
    """Where a difference's confidence interval lies against zero: ``"ahead"`` above it,
    ``"behind"`` below it, ``"level"`` across it."""
    return "ahead" if low > 0 else "behind" if high < 0 else "level"


def _t_within(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with ``df`` degrees of freedom, in closed form
    (Abramowitz & Stegun 26.7.3 and 26.7.4: a finite series in cos(theta))."""
    theta = math.atan(t / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    if df % 2 == 1:
        term, total = math.cos(theta), 0.0
        for k in range(1, (df - 1) // 2 + 1):  # cos, (2/3) cos^3, (2*4)/(3*5) cos^5, ...
            total += term
            term *= c2 * (2 * k) / (2 * k + 1)
        return 2 / math.pi * (theta + math.sin(theta) * total)
    term, total = 1.0, 0.0
    for k in range(1, df // 2 + 1):  # 1, (1/2) cos^2, (1*3)/(2*4) cos^4, ...
        total += term
        term *= c2 * (2 * k - 1) / (2 * k)
    return math.sin(theta) * total


def t_critical(df: int, confidence: float = 0.95) -> float:
    """The two-sided critical value of Student's t: P(|T| <= t) = ``confidence``
    (4.303 for 2 degrees of freedom at 95%), by bisection on the closed form."""
    if df < 1 or not 0 < confidence < 1:
        raise ValueError(f"t_critical needs df >= 1 and 0 < confidence < 1, got {df}, {confidence}")
    low, high = 0.0, 1.0
    while _t_within(high, df) < confidence:
        high *= 2
    for _ in range(200):
        mid = (low + high) / 2
        if _t_within(mid, df) < confidence:
            low = mid
        else:
            high = mid
        if high - low <= 1e-12 * high:
            break
    return (low + high) / 2


def steps_to_solve(result: dict[str, Any]) -> int | None:
    """Env steps until the policy first counted as solved, or None.

    The confirmed early stop (``solved_step``) when training stopped on it; otherwise the
    first periodic evaluation >= target_return; otherwise the end of training when the
    final evaluation reached it.
    """
    target = result.get("target_return")
    if result.get("solved_step") is not None:
        return int(result["solved_step"])
    if target is None:
        return None
    for step, value in result.get("eval_curve") or []:
        if value >= target:
            return int(step)
    final = result.get("final_eval_return")
    if final is not None and final >= target:
        return int(result["global_step"])
    return None


def percentiles(values: list[float]) -> dict[str, float] | None:
    """Median, quartiles and interquartile range of ``values``; None when there are none."""
    if not values:
        return None
    q25, med, q75 = np.percentile(np.asarray(values, dtype=np.float64), [25, 50, 75])
    return {"median": float(med), "q25": float(q25), "q75": float(q75), "iqr": float(q75 - q25)}
