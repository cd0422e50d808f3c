"""Many seeds and hyperparameter grids: each grid point's seeds together in this process
(networks stacked, :mod:`agent.seeds`), or one process per trial on Ray.

    python run.py --env CartPole-v1 --seeds 10 [--grid sigma0=0.1,0.5 --grid n_step=1,3]
    python run.py --env CartPole-v1 --seeds 10 --ray-address local|HOST:PORT
    python run.py --resume runs/my-sweep            run only the trials that are missing

A sweep directory holds ``sweep.json`` (the manifest: every trial and its resolved config,
written before anything runs), one ordinary run directory per trial
(``<configuration>/seed_<n>/`` with TensorBoard events, checkpoints and ``result.json``),
and at the end ``summary.md``, ``summary.json`` and ``eval_curves.png``.

One module per concern, each usable and tested on its own:

- :mod:`agent.sweep.cli`: ``--seeds`` / ``--grid`` parsing and :func:`cmd_sweep` (run.py's entry)
- :mod:`agent.sweep.trials`: a trial, the grid x seeds product, the manifest, a trial's state
- :mod:`agent.sweep.stats`: IQM, bootstrap confidence interval, steps to solve (numpy only)
- :mod:`agent.sweep.report`: ``summary.json``, ``summary.md`` and ``eval_curves.png``
- :mod:`agent.sweep.local`: a sweep in this process, without Ray
- :mod:`agent.sweep.worker`: one trial, as it runs in a Ray worker
- :mod:`agent.sweep.driver`: Ray start-up, submitting, collecting and retrying trials, the
  display, Ctrl-C and SIGTERM

Only a sweep on Ray needs Ray, and :func:`run_sweep` imports it then: importing this
package (for example ``from agent.sweep import iqm, bootstrap_ci``) does not.
"""

from agent.sweep.cli import cmd_sweep, parse_grid, parse_seeds
from agent.sweep.driver import run_sweep
from agent.sweep.local import run_local
from agent.sweep.report import format_summary, plot_curves, summarize, write_summary
from agent.sweep.stats import bootstrap_ci, iqm, steps_to_solve
from agent.sweep.trials import (
    MANIFEST,
    Trial,
    build_trials,
    is_sweep_dir,
    read_manifest,
    read_result,
    trial_state,
    write_manifest,
)
from agent.sweep.worker import run_trial

__all__ = [
    "MANIFEST",
    "Trial",
    "bootstrap_ci",
    "build_trials",
    "cmd_sweep",
    "format_summary",
    "iqm",
    "is_sweep_dir",
    "parse_grid",
    "parse_seeds",
    "plot_curves",
    "read_manifest",
    "read_result",
    "run_local",
    "run_sweep",
    "run_trial",
    "steps_to_solve",
    "summarize",
    "trial_state",
    "write_manifest",
    "write_summary",
]
