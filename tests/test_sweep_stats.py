"""agent/sweep/stats.py: IQM, bootstrap CI and steps to solve on fixed numbers; no Ray."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from agent.sweep.stats import bootstrap_ci, difference_ci, iqm, steps_to_solve, t_critical

ROOT = Path(__file__).resolve().parent.parent


def test_iqm_is_the_mean_of_the_middle_half() -> None:
    assert iqm([1, 2, 3, 4, 5, 6, 7, 8]) == 4.5  # mean of 3, 4, 5, 6
    assert iqm([0, 0, 0, 100]) == 0.0  # the outlier is trimmed
    assert iqm(range(1, 11)) == 5.5  # 10 values: 2 trimmed at each end (scipy's trim_mean)
    assert iqm([7.0]) == 7.0
    assert iqm([500, 10, 480, 495, 20, 490, 500, 470]) == pytest.approx((470 + 480 + 490 + 495) / 4)


def test_bootstrap_ci_fixed_numbers() -> None:
    # Two seeds: resampled IQMs (= means) are 0, 0.5, 1 with probabilities 1/4, 1/2, 1/4.
    assert bootstrap_ci([0.0, 1.0]) == (0.0, 1.0)
    assert bootstrap_ci([5.0, 5.0, 5.0]) == (5.0, 5.0)
    assert bootstrap_ci([3.0]) == (3.0, 3.0)
    # Same numbers, same interval (fixed bootstrap seed).
    x = [120.0, 500.0, 480.0, 90.0, 500.0, 310.0]
    assert bootstrap_ci(x) == bootstrap_ci(x)
    lo, hi = bootstrap_ci(x)
    assert lo <= iqm(x) <= hi


def test_t_critical_is_students() -> None:
    # The tables' two-sided 95% values, then scipy's over many degrees of freedom.
    for df, t in ((1, 12.706), (2, 4.303), (4, 2.776), (9, 2.262), (30, 2.042)):
        assert t_critical(df) == pytest.approx(t, abs=5e-4)
    assert t_critical(100_000) == pytest.approx(1.95996, abs=1e-4)  # the normal's
    stats = pytest.importorskip("scipy.stats")
    for df, confidence in itertools.product(range(1, 80), (0.8, 0.95, 0.99)):
        expected = stats.t.ppf(0.5 + confidence / 2, df)
        assert t_critical(df, confidence) == pytest.approx(expected, rel=1e-9)
    with pytest.raises(ValueError, match="df >= 1"):
        t_critical(0)


def test_a_paired_difference_of_few_seeds_is_students_t_interval() -> None:
    # Differences 1, 2, 3: mean 2, sd 1, t(2) = 4.303 -> 2 -/+ 4.303 / sqrt(3).
    mean, low, high = difference_ci([11.0, 12.0, 13.0], [10.0, 10.0, 10.0], paired=True)
    assert mean == 2.0
    assert (low, high) == pytest.approx((2 - 4.30265 / 3**0.5, 2 + 4.30265 / 3**0.5), abs=1e-4)
    # Three differences of one sign are not enough to call it (a 1-in-4 chance by coin):
    # resampled, their mean never crosses zero; Student's interval does.
    assert difference_ci([1.0, 2.0, 9.0], [0.0, 0.0, 0.0], paired=True)[1] < 0
    # The same difference on every seed: no spread, the interval is the point.
    assert difference_ci([4.0, 6.0], [1.0, 3.0], paired=True) == (3.0, 3.0, 3.0)
    assert difference_ci([5.0], [1.0], paired=True) == (4.0, -np.inf, np.inf)
    with pytest.raises(ValueError, match="paired runs: 2 against 1"):
        difference_ci([1.0, 2.0], [1.0], paired=True)


def test_an_unpaired_difference_resamples_each_arm_with_its_statistic() -> None:
    # One run in five at 100: the median difference is 0 where the mean's is 20; a
    # resample's median reaches 100 when 3 of its 5 draws do (p = 0.058, above 2.5%).
    a, b = [0.0, 0.0, 0.0, 0.0, 100.0], [0.0] * 5
    assert difference_ci(a, b, "median") == (0.0, 0.0, 100.0)
    assert difference_ci(a, b, "mean")[0] == 20.0
    assert bootstrap_ci(a, "median") == (0.0, 100.0)
    # A name it does not know is refused, not read as the mean.
    for call in (lambda: difference_ci(a, b, "medain"), lambda: bootstrap_ci(a, "max")):
        with pytest.raises(ValueError, match="one of iqm, mean, median"):
            call()


def test_bootstrap_ci_matches_exact_resampling_distribution() -> None:
    # n=4: all 4**4 resamples are equally likely; the bootstrap percentiles converge to theirs.
    x = np.array([10.0, 200.0, 300.0, 500.0])
    exact = sorted(iqm(x[list(idx)]) for idx in itertools.product(range(4), repeat=4))
    lo_exact, hi_exact = np.percentile(exact, [2.5, 97.5])
    lo, hi = bootstrap_ci(x)
    assert lo == pytest.approx(lo_exact, abs=5.0)
    assert hi == pytest.approx(hi_exact, abs=5.0)


def test_steps_to_solve() -> None:
    base = {"target_return": 475.0, "global_step": 9000, "final_eval_return": 100.0}
    assert steps_to_solve({**base, "solved_step": 6000, "eval_curve": []}) == 6000
    curve = [[1000, 20.0], [2000, 480.0], [3000, 300.0]]
    assert steps_to_solve({**base, "solved_step": None, "eval_curve": curve}) == 2000
    low = [[1000, 20.0]]
    assert steps_to_solve({**base, "solved_step": None, "eval_curve": low}) is None
    final = {**base, "final_eval_return": 490.0, "solved_step": None, "eval_curve": low}
    assert steps_to_solve(final) == 9000
    assert steps_to_solve({**base, "target_return": None, "solved_step": None}) is None


# --- usable without Ray -----------------------------------------------------------------------


@pytest.mark.parametrize("module", ["agent.sweep.stats", "agent.sweep"])
def test_importing_the_statistics_does_not_import_ray(module: str) -> None:
    # A fresh interpreter: this one may have imported Ray for other tests. Where Ray is
    # installed, a module-level `import ray` shows in sys.modules; where it is not, the
    # import itself fails. matplotlib is imported only when a plot is drawn.
    code = (
        f"import sys, {module}\n"
        "from agent.sweep import bootstrap_ci, iqm\n"
        "print(iqm([1, 2, 3, 4]), bootstrap_ci([1.0, 1.0]))\n"
        "print(sorted(m for m in ('ray', 'matplotlib') if m in sys.modules))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["2.5 (1.0, 1.0)", "[]"]
