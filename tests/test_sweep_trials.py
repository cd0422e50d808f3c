"""agent/sweep/trials.py's points: a sweep over several envs with named points, each
trial's config resolved for its own env, run in this process with a hook per finished trial."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from agent.errors import UserError
from agent.sweep.local import run_local
from agent.sweep.trials import Trial, remaining, trials_of_points, write_manifest

SHORT = {"total_steps": 600, "learning_starts": 200, "random_starts": 200, "eval_interval": 0,
         "eval_episodes": 2, "confirm_episodes": 0, "early_stop": False}  # fmt: skip


def test_points_name_their_env_and_their_directory() -> None:
    points = [{"env_id": "CartPole-v1"}, {"env_id": "Acrobot-v1", "n_step": 1}]
    trials = trials_of_points(None, None, SHORT, [3, 4], points, ["cart/a", "acro/b"])
    assert [(t.label, t.seed, t.run_dir) for t in trials] == [
        ("cart/a", 3, "cart/a/seed_3"), ("cart/a", 4, "cart/a/seed_4"),
        ("acro/b", 3, "acro/b/seed_3"), ("acro/b", 4, "acro/b/seed_4"),
    ]  # fmt: skip
    cart, acro = trials[0].config, trials[2].config
    assert cart["env_id"] == "CartPole-v1" and acro["env_id"] == "Acrobot-v1"
    assert acro["n_step"] == 1 and cart["n_step"] == 3  # each point over the overrides
    assert cart["lr"] == 0.004  # CartPole-v1's own YAML, not another env's
    with pytest.raises(ValueError, match="one distinct name per point"):
        trials_of_points(None, None, {}, [1], points, ["same", "same"])
    with pytest.raises(UserError, match=r"grid point acro/b: .*n_step must be >= 1"):
        trials_of_points(None, None, {}, [1], [{"env_id": "Acrobot-v1", "n_step": 0}],
                         ["acro/b"])  # fmt: skip


def test_a_local_sweep_over_two_envs_calls_its_hook_as_each_trial_finishes(
    tmp_path: Path,
) -> None:
    points = [{"env_id": "CartPole-v1"}, {"env_id": "Acrobot-v1"}]
    trials = trials_of_points(None, None, SHORT, [1], points, ["cart", "acro"])
    manifest = {"sweep_id": "x", "env_id": "two envs", "trials": [t.__dict__ for t in trials]}
    write_manifest(tmp_path, manifest)
    landed: list[str] = []

    def on_done(trial: Trial) -> None:
        # The trial's result is on disk when the hook runs.
        assert (tmp_path / trial.run_dir / "result.json").is_file()
        landed.append(trial.name)

    status = run_local(tmp_path, manifest, trials, progress=False, out=io.StringIO(),
                       on_done=on_done)  # fmt: skip
    assert status == 0 and landed == ["cart seed=1", "acro seed=1"]


def test_a_resumed_sweep_finishes_its_started_runs_first_then_keeps_the_manifests_order(
    tmp_path: Path,
) -> None:
    points = [{"env_id": "CartPole-v1"}, {"env_id": "CartPole-v1", "n_step": 1},
              {"env_id": "CartPole-v1", "n_step": 2}]  # fmt: skip
    by_point = trials_of_points(None, None, SHORT, [1, 2], points, ["a", "b", "c"])
    trials = sorted(by_point, key=lambda t: t.seed)  # a seed-major manifest: a1 b1 c1 a2 b2 c2
    for done in ("a/seed_1", "b/seed_1"):
        (tmp_path / done).mkdir(parents=True)
        (tmp_path / done / "result.json").write_text('{"status": "finished"}')
    (tmp_path / "c/seed_2/checkpoints").mkdir(parents=True)
    (tmp_path / "c/seed_2/checkpoints/last.pt").write_bytes(b"")  # stopped mid-run

    order = [t.run_dir for t in remaining(tmp_path, trials)]

    assert order == ["c/seed_1", "c/seed_2", "a/seed_2", "b/seed_2"]


@pytest.mark.parametrize("stack", [True, False], ids=["stacked", "lone"])
def test_a_local_sweep_stacks_image_seeds_unless_asked_for_lone_runs(
    tmp_path: Path, stack: bool
) -> None:
    """Image seeds stack in one process; the Atari 100k report asks for lone runs (as its
    Ray path runs them), and gets them."""
    import json

    short = {"total_steps": 120, "learning_starts": 60, "buffer_size": 500, "batch_size": 4,
             "final_episodes": 1, "eval_envs": 1, "n_step": 1, "device": "cpu",
             "env_kwargs": {}}  # fmt: skip
    points = [{"env_id": "envs.testing:NoisyDQN/Frames-v0"}]
    trials = trials_of_points(None, "der", short, [1, 2], points, ["frames"])
    manifest = {"sweep_id": "x", "env_id": "frames", "trials": [t.__dict__ for t in trials]}
    write_manifest(tmp_path, manifest)
    out = io.StringIO()
    assert run_local(tmp_path, manifest, trials, progress=False, out=out,
                     stack_images=stack) == 0  # fmt: skip
    backends = {json.loads((tmp_path / t.run_dir / "result.json").read_text())["learner_backend"]
                for t in trials}  # fmt: skip
    assert (backends == {"stacked"}) is stack
    assert ("networks stacked" in out.getvalue()) is stack
