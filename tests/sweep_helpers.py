"""What several sweep test files share: short training flags and a sweep directory on disk."""

from __future__ import annotations

import json
from pathlib import Path

from agent.sweep.trials import Trial, build_trials

# A few thousand CartPole steps with evaluations, logging and checkpoints.
SHORT = [
    "--total-steps",
    "2000",
    "--device",
    "cpu",
    "--set",
    "early_stop=false",
    "--set",
    "learning_starts=200",
    "--set",
    "train_freq=2",
    "--set",
    "buffer_size=5000",
    "--set",
    "eval_interval=1000",
    "--set",
    "eval_episodes=2",
    "--set",
    "confirm_episodes=3",
    "--set",
    "checkpoint_interval=1000",
]


def fake_sweep(tmp_path: Path) -> tuple[dict, list[Trial]]:
    """A finished sweep of 2 configurations x 4 seeds: 7 results, one failed trial."""
    grid = {"sigma0": [0.1, 0.5]}
    trials = build_trials("CartPole-v1", None, {}, [1, 2, 3, 4], grid)
    manifest = {"sweep_id": "x", "env_id": "CartPole-v1", "trials": [t.__dict__ for t in trials]}
    finals = {"0.1": [500.0, 480.0, 100.0, 490.0], "0.5": [20.0, 30.0, 40.0]}
    for t in trials:
        run_dir = tmp_path / t.run_dir
        run_dir.mkdir(parents=True)
        key = str(t.params["sigma0"])
        if t.seed > len(finals[key]):
            (run_dir / "error.txt").write_text("RuntimeError: boom\n\ntraceback")
            continue
        final = finals[key][t.seed - 1]
        result = {
            "status": "finished",
            "global_step": 4000,
            "target_return": 475.0,
            "solved_step": None,
            "final_eval_return": final,
            "wall_time_s": 10.0 * t.seed,
            "eval_curve": [[1000, 10.0], [2000, final], [4000, final]],
        }
        (run_dir / "result.json").write_text(json.dumps(result))
    return manifest, trials
