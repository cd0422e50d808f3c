"""Statistics over the seeds of one configuration, as rliable recommends (Agarwal et al. 2021).

The interquartile mean (IQM) with a percentile bootstrap confidence interval, and the env
steps a run took to solve its task. Plain numpy, usable on any list of per-seed numbers:

    from agent.sweep.stats import bootstrap_ci, iqm
    finals = [500.0, 480.0, 120.0, 495.0, 310.0]
    print(iqm(finals), bootstrap_ci(finals))
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["bootstrap_ci", "difference_ci", "iqm", "iqm_rows", "percentiles", "steps_to_solve"]


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


def bootstrap_ci(
    values: Any,
    statistic: str = "iqm",
    confidence: float = 0.95,
    reps: int = 50_000,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap confidence interval of the IQM (or ``"mean"``) over seeds.

    Resamples the seeds with replacement ``reps`` times (rliable's default of 50 000)
    with a fixed ``seed``, so the same results always give the same interval.
    """
    x = np.asarray(values, dtype=np.float64).ravel()
    if x.size == 0:
        raise ValueError("confidence interval of no values")
    rng = np.random.default_rng(seed)
    samples = x[rng.integers(0, x.size, size=(reps, x.size))]
    stats = iqm_rows(samples) if statistic == "iqm" else samples.mean(axis=1)
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
    """``statistic(a) - statistic(b)`` and its 95% percentile bootstrap CI: (difference,
    low, high). ``paired`` (a seed's run of each, in order): the mean of the per-seed
    differences, the differences resampled together; otherwise ``a`` and ``b`` are each
    resampled alone, with ``statistic`` ``"iqm"`` or ``"mean"``. Rliable's stratified
    bootstrap over games is the Atari report's own (``bench/atari100k.py``)."""
    xa, xb = np.asarray(a, dtype=np.float64).ravel(), np.asarray(b, dtype=np.float64).ravel()
    if xa.size == 0 or xb.size == 0:
        raise ValueError("confidence interval of no values")
    rng = np.random.default_rng(seed)
    if paired:
        if xa.size != xb.size:
            raise ValueError(f"paired runs: {xa.size} against {xb.size}")
        d = xa - xb
        diffs = d[rng.integers(0, d.size, size=(reps, d.size))].mean(axis=1)
        point = float(d.mean())
    else:
        rows = iqm_rows if statistic == "iqm" else (lambda x: x.mean(axis=1))
        sa = xa[rng.integers(0, xa.size, size=(reps, xa.size))]
        sb = xb[rng.integers(0, xb.size, size=(reps, xb.size))]
        diffs = rows(sa) - rows(sb)
        point = iqm(xa) - iqm(xb) if statistic == "iqm" else float(xa.mean() - xb.mean())
    lo, hi = np.percentile(diffs, [2.5, 97.5])
    return point, float(lo), float(hi)


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
