"""Evaluation: batched episodes equal sequential ones, every episode is played once."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import envs.testing  # noqa: F401  (registers the NoisyDQN/ test envs)
from agent.acting import ActionSelector
from agent.evaluate import EvaluationStopped, run_episodes
from agent.networks import QNetwork
from envs import make_env


@pytest.mark.parametrize("copies", [2, 3, 10])
def test_batched_evaluation_equals_one_env_at_a_time(copies: int) -> None:
    torch.manual_seed(0)
    q = QNetwork((4,), 2, (16,))
    one = run_episodes(
        ActionSelector(q, (4,), 1, noise=False), [make_env("CartPole-v1")], 7, seed=3
    )
    many = run_episodes(
        ActionSelector(q, (4,), copies, noise=False),
        [make_env("CartPole-v1") for _ in range(copies)],
        7,
        seed=3,
    )
    np.testing.assert_array_equal(one.returns, many.returns)
    np.testing.assert_array_equal(one.lengths, many.lengths)
    # CartPole pays 1 per step: a return is its episode's length.
    np.testing.assert_array_equal(many.returns, many.lengths)


@pytest.mark.parametrize("vector", ["sync", "async"])
def test_a_vector_env_plays_the_same_episodes_as_a_list_of_envs(vector: str) -> None:
    # More copies than episodes left at the end, epsilon on: the copies that run out of
    # episodes play throwaway ones, and every episode scores as one env at a time.
    from envs import make_vector_env

    torch.manual_seed(0)
    q = QNetwork((4,), 2, (16,))
    listed = run_episodes(ActionSelector(q, (4,), 1, noise=False), [make_env("CartPole-v1")],
                          11, seed=3, epsilon=0.2, n_actions=2)  # fmt: skip
    envs = make_vector_env("CartPole-v1", 4, vector)
    try:
        vectored = run_episodes(ActionSelector(q, (4,), 4, noise=False), envs, 11, seed=3,
                                epsilon=0.2, n_actions=2)  # fmt: skip
        # A stop ends it at the next step there too, and says how many ended.
        calls: list[int] = []

        def policy(batch: np.ndarray) -> np.ndarray:
            calls.append(1)
            return np.ones(len(batch), dtype=np.int64)

        with pytest.raises(EvaluationStopped) as info:
            run_episodes(policy, envs, 11, seed=3, stop=lambda: len(calls) >= 3)
        assert len(calls) == 3 and info.value.played == 0
    finally:
        envs.close()
    np.testing.assert_array_equal(listed.returns, vectored.returns)
    np.testing.assert_array_equal(listed.lengths, vectored.lengths)


def test_every_episode_is_played_to_its_end() -> None:
    # Cue-v0 episodes terminate after exactly 5 steps; the policy always plays 1.
    calls: list[int] = []

    def policy(batch: np.ndarray) -> np.ndarray:
        calls.append(len(batch))
        return np.ones(len(batch), dtype=np.int64)

    result = run_episodes(policy, [make_env("NoisyDQN/Cue-v0") for _ in range(3)], 8, seed=0)
    np.testing.assert_array_equal(result.lengths, np.full(8, 5))
    assert ((result.returns >= 0) & (result.returns <= 5)).all()
    # 8 episodes of 5 steps on 3 copies: ceil(8 / 3) = 3 rounds of 5 batched calls.
    assert calls == [3] * 15


def test_a_stop_raises_before_the_next_step_with_the_episodes_played() -> None:
    from agent.evaluate import EvaluationStopped

    calls: list[int] = []

    def policy(batch: np.ndarray) -> np.ndarray:
        calls.append(len(batch))
        return np.ones(len(batch), dtype=np.int64)

    envs = [make_env("NoisyDQN/Cue-v0") for _ in range(3)]
    # 5-step episodes on 3 copies: after 7 steps the first 3 ended, the next 3 are playing.
    with pytest.raises(EvaluationStopped) as info:
        run_episodes(policy, envs, 8, seed=0, stop=lambda: len(calls) >= 7)
    assert len(calls) == 7 and info.value.played == 3


@pytest.mark.parametrize("copies", [1, 3, 10])
def test_eval_epsilon_draws_per_episode_so_a_score_does_not_depend_on_the_copies(
    copies: int,
) -> None:
    """CartPole under a fixed policy with random actions mixed in at epsilon 0.3: the same
    episodes whatever the number of copies; epsilon 0 is the greedy policy's."""
    torch.manual_seed(0)
    q = QNetwork((4,), 2, (16,))

    def play(epsilon: float, n: int) -> np.ndarray:
        policy = ActionSelector(q, (4,), n, noise=False)
        envs = [make_env("CartPole-v1") for _ in range(n)]
        return run_episodes(policy, envs, 9, seed=5, epsilon=epsilon, n_actions=2).lengths

    greedy = play(0.0, 1)
    np.testing.assert_array_equal(play(0.3, copies), play(0.3, 1))
    assert not np.array_equal(play(0.3, copies), greedy)


def test_eval_epsilon_1_plays_uniformly_at_random() -> None:
    seen: list[int] = []

    class Recorder:
        """Wraps Cue-v0's step to record the actions played."""

        def __init__(self) -> None:
            self.env = make_env("NoisyDQN/Cue-v0")

        def reset(self, **kw):
            return self.env.reset(**kw)

        def step(self, action):
            seen.append(int(action))
            return self.env.step(action)

    def policy(batch: np.ndarray) -> np.ndarray:
        return np.zeros(len(batch), dtype=np.int64)  # always 0: any 1 came from epsilon

    run_episodes(policy, [Recorder()], 40, seed=0, epsilon=1.0, n_actions=2)
    assert len(seen) == 200 and 0.35 < np.mean(seen) < 0.65
    with pytest.raises(ValueError, match="n_actions"):
        run_episodes(policy, [Recorder()], 1, seed=0, epsilon=0.5)


def test_round_and_stream_change_the_episodes() -> None:
    def policy(batch: np.ndarray) -> np.ndarray:
        return np.ones(len(batch), dtype=np.int64)

    env = [make_env("NoisyDQN/Cue-v0")]
    a = run_episodes(policy, env, 20, seed=0, round_index=0).returns
    b = run_episodes(policy, env, 20, seed=0, round_index=1).returns
    c = run_episodes(policy, env, 20, seed=0, round_index=0, stream=2).returns
    again = run_episodes(policy, env, 20, seed=0, round_index=0).returns
    np.testing.assert_array_equal(a, again)
    assert not np.array_equal(a, b) and not np.array_equal(a, c)


def test_standard_error_is_the_sample_std_over_sqrt_episodes() -> None:
    from agent.evaluate import EvalResult

    result = EvalResult(np.array([1.0, 3.0, 5.0, 7.0]), np.ones(4, dtype=np.int64))
    assert result.standard_error == pytest.approx(np.std([1, 3, 5, 7], ddof=1) / 2)
    assert EvalResult(np.array([2.0]), np.ones(1, dtype=np.int64)).standard_error == 0.0


def test_success_rate_is_the_share_of_episodes_with_a_positive_return() -> None:
    from agent.evaluate import EvalResult

    lengths = np.ones(5, dtype=np.int64)
    assert EvalResult(np.array([0.0, 0.82, -1.0, 0.5, 0.0]), lengths).success_rate == 0.4
    assert EvalResult(np.zeros(5), lengths).success_rate == 0.0


class _Counters:
    def __init__(self) -> None:
        self.eval_round = 0
        self.best_eval: float | None = None
        self.best_confirmed = False
        self.best_step: int | None = None
        self.best_episodes: dict | None = None
        self.solved_step: int | None = None


def _evaluator(policy, target: float | None, early_stop: bool = True, **kw):  # type: ignore[no-untyped-def]
    from agent.evaluate import Evaluator

    logged: list[tuple[int, dict]] = []
    best: list[int] = []
    state = _Counters()
    evaluate = Evaluator(
        policy, [make_env("envs.testing:NoisyDQN/Cue-v0") for _ in range(2)], state, seed=1,
        episodes=4, confirm_episodes=kw.get("confirm_episodes", 6), confirm_z=1.645,
        target_return=target, early_stop=early_stop, curve=[],
        log=lambda step, scalars: logged.append((step, scalars)),
        on_best=lambda: best.append(state.eval_round),
        best_confirm_episodes=kw.get("best_confirm_episodes", 0),
    )
    return evaluate, state, logged, best


def _perfect(batch: np.ndarray) -> np.ndarray:
    return (batch[:, 0] > 0).astype(np.int64)  # Cue-v0 pays for following its cue


def test_a_policy_at_the_target_is_confirmed_on_fresh_episodes() -> None:
    evaluate, state, logged, best = _evaluator(_perfect, target=4.5)
    assert evaluate(100) is True
    assert state.eval_round == 2  # the periodic round, then the confirming one
    assert evaluate.curve == [(100, 5.0)] and state.best_eval == 5.0 and len(best) == 1
    assert any("eval/confirm_lower_bound" in scalars for _, scalars in logged)
    # The final score plays a round no evaluation played, and moves no counter.
    assert evaluate.final(200) == 5.0 and state.eval_round == 2


def test_a_stop_ends_the_final_evaluation_at_the_next_step_and_moves_nothing() -> None:
    calls: list[int] = []

    def counting(batch: np.ndarray) -> np.ndarray:
        calls.append(len(batch))
        return _perfect(batch)

    evaluate, state, logged, _ = _evaluator(counting, target=None, confirm_episodes=6)
    # Asked before every step: stopped once the third step was played, no fourth one.
    assert evaluate.final(200, stop=lambda: len(calls) >= 3) is None
    assert len(calls) == 3
    assert evaluate.final_wall_s is None and logged == [] and state.eval_round == 0
    # Played again without a stop, the same episodes score as one never stopped.
    fresh, *_ = _evaluator(_perfect, target=None, confirm_episodes=6)
    assert evaluate.final(200) == fresh.final(200) == 5.0
    assert evaluate.final_wall_s is not None


def _always_one(batch: np.ndarray) -> np.ndarray:
    return np.ones(len(batch), dtype=np.int64)  # right about half the time


def test_a_periodic_round_logs_its_episodes_lengths_and_seconds() -> None:
    from agent.evaluate import Evaluator, run_episodes

    logged: list[tuple[int, dict]] = []
    envs = [make_env("envs.testing:NoisyDQN/CueVaried-v0") for _ in range(2)]
    evaluate = Evaluator(
        _always_one, envs, _Counters(), seed=3, episodes=5, confirm_episodes=0, confirm_z=1.645,
        target_return=None, early_stop=False, curve=[],
        log=lambda step, scalars: logged.append((step, scalars)), on_best=lambda: None,
    )  # fmt: skip
    evaluate(100)
    # The same round played again: episodes of lengths 2..9 drawn from their seeds.
    lengths = run_episodes(_always_one, envs, 5, seed=3, round_index=0).lengths
    assert len(set(lengths.tolist())) > 1
    step, scalars = logged[0]
    assert step == 100
    assert scalars["eval/mean_length"] == pytest.approx(lengths.mean())
    assert scalars["eval/max_length"] == lengths.max()
    assert scalars["eval/seconds"] >= 0


def test_below_the_target_or_without_early_stop_the_run_goes_on() -> None:
    evaluate, state, _, best = _evaluator(_always_one, target=4.5)
    assert evaluate(100) is False and state.eval_round == 1  # no confirmation played
    assert best == [1]
    evaluate, state, _, _ = _evaluator(_perfect, target=4.5, early_stop=False)
    assert evaluate(100) is False and evaluate(200) is False
    # A run that solved once (then extended) does not stop again.
    evaluate, state, _, _ = _evaluator(_perfect, target=4.5)
    state.solved_step = 50
    assert evaluate(100) is False


def test_only_a_better_round_counts_as_the_best() -> None:
    playing = [_always_one]
    evaluate, state, _, best = _evaluator(lambda batch: playing[0](batch), target=None)
    for step, policy in enumerate((_always_one, _perfect, _always_one)):
        playing[0] = policy
        evaluate(step)
    assert best == [1, 2] and state.best_eval == 5.0


def _steady(batch: np.ndarray) -> np.ndarray:
    """Right on a Cue-v0 episode's first step, then always 1: 1 + Binomial(4, 1/2), mean 3."""
    first = batch[:, 1] == 1.0  # steps_left / length: 1 on the first step
    return np.where(first, batch[:, 0] > 0, 1).astype(np.int64)


def _lucky_round(after: float, episodes: int, z: float) -> int:
    """The first round of ``_always_one`` (true mean 2.5) whose ``episodes`` peak by chance
    above ``after`` by more than z of their standard errors: what a short round does."""
    from agent.evaluate import run_episodes

    envs = [make_env("envs.testing:NoisyDQN/Cue-v0") for _ in range(2)]
    for r in range(1, 2_000):
        result = run_episodes(_always_one, envs, episodes, seed=1, round_index=r)
        if result.mean - z * result.standard_error > after:
            return r
    raise AssertionError("no lucky round")


def test_a_round_that_peaks_by_chance_does_not_replace_the_confirmed_best() -> None:
    from agent.evaluate import BEST_STREAM, run_episodes

    playing = [_steady]
    evaluate, state, logged, best = _evaluator(lambda b: playing[0](b), target=None,
                                               best_confirm_episodes=200)  # fmt: skip
    evaluate(0)  # the steady policy: confirmed on 200 fresh episodes
    assert state.best_confirmed and best == [1]
    steady = state.best_eval
    assert steady == pytest.approx(3.0, abs=0.3)
    # Then a worse policy (mean 2.5), until one of its short rounds peaks by chance.
    playing[0] = _always_one
    lucky = _lucky_round(steady, episodes=4, z=1.645)
    for step in range(1, lucky + 1):
        evaluate(step)
    curve = dict(evaluate.curve)
    assert curve[lucky] > steady  # the best round so far: today's rule would save it
    # It was a candidate, confirmed on fresh episodes, and the fresh ones said no.
    (confirmed,) = [s["eval/best_confirm_mean_return"] for step, s in logged
                    if step == lucky and "eval/best_confirm_mean_return" in s]  # fmt: skip
    assert confirmed < steady
    assert best == [1] and state.best_eval == steady and state.best_step == 0
    # The best score names its episodes: played again, they give it to the bit.
    named = state.best_episodes
    assert named["stream"] == BEST_STREAM and named["episodes"] == 200
    envs = [make_env("envs.testing:NoisyDQN/Cue-v0") for _ in range(3)]
    again = run_episodes(_steady, envs, named["episodes"], seed=named["seed"],
                         round_index=named["round"], stream=named["stream"])  # fmt: skip
    assert again.mean == steady


def test_unconfirmed_the_best_is_the_best_round_and_keeps_the_lucky_one() -> None:
    playing = [_steady]
    evaluate, state, _, _ = _evaluator(lambda b: playing[0](b), target=None)
    evaluate(0)
    first = state.best_eval
    playing[0] = _always_one
    lucky = _lucky_round(first, episodes=4, z=0.0)
    for step in range(1, lucky + 1):
        evaluate(step)
    # best_confirm_episodes 0: the rule before, which says so (best_confirmed False).
    assert not state.best_confirmed and state.best_step == lucky
    assert state.best_eval == dict(evaluate.curve)[lucky] > first


def test_a_better_policy_is_confirmed_and_replaces_the_best() -> None:
    playing = [_always_one]
    evaluate, state, logged, best = _evaluator(lambda b: playing[0](b), target=None,
                                               best_confirm_episodes=50)  # fmt: skip
    evaluate(0)
    playing[0] = _perfect
    evaluate(1)
    assert len(best) == 2 and state.best_eval == 5.0 and state.best_step == 1
    # So clear an improvement needs one part of the 50 episodes (a round's 4), not all.
    assert state.best_episodes["episodes"] == 4
    # Nothing beats a perfect score: no further confirmation is played for it.
    evaluate(2)
    assert len(best) == 2
    assert sum("eval/best_confirm_mean_return" in s for _, s in logged) == 2


def test_an_early_stop_confirmation_confirms_the_best_without_more_episodes() -> None:
    from agent.evaluate import EVAL_STREAM

    evaluate, state, logged, _ = _evaluator(_perfect, target=4.5, best_confirm_episodes=50)
    assert evaluate(100) is True
    assert not any("eval/best_confirm_mean_return" in s for _, s in logged)
    assert state.best_confirmed and state.best_eval == 5.0
    assert state.best_episodes["stream"] == EVAL_STREAM and state.best_episodes["round"] == 1


def test_after_an_early_stop_the_final_episodes_score_best_pt() -> None:
    """The confirmation that stops a run is at the target by selection: where best.pt is
    the stopping policy, its score becomes the final evaluation's, on episodes that
    nothing chose; a later piece's final policy leaves it alone."""
    evaluate, state, logged, _ = _evaluator(_steady, target=2.0, best_confirm_episodes=50,
                                            confirm_episodes=6)  # fmt: skip
    assert evaluate(100) is True and state.best_step == 100
    stopping = state.best_eval
    final = evaluate.final(100)
    assert final != stopping  # other episodes: another mean
    assert state.best_eval == final and state.best_episodes == evaluate.final_played
    assert (100, {"eval/best_return": final}) in logged
    # The run extended past its stop: its final policy is another one.
    assert evaluate.final(300) is not None and state.best_eval == final


def test_the_final_evaluation_logs_its_mean_length_and_names_its_episodes() -> None:
    from agent.evaluate import EVAL_STREAM, Evaluator, run_episodes

    logged: list[tuple[int, dict]] = []
    envs = [make_env("envs.testing:NoisyDQN/CueVaried-v0") for _ in range(2)]
    state = _Counters()
    state.eval_round = 3
    evaluate = Evaluator(
        _always_one, envs, state, seed=3, episodes=5, confirm_episodes=7, confirm_z=1.645,
        target_return=None, early_stop=False, curve=[],
        log=lambda step, scalars: logged.append((step, scalars)), on_best=lambda: None,
    )  # fmt: skip
    mean = evaluate.final(100)
    named = evaluate.final_played
    assert named == {"seed": 3, "stream": EVAL_STREAM, "round": 3, "episodes": 7, "epsilon": 0.0}
    again = run_episodes(_always_one, envs, 7, seed=3, round_index=3)
    assert len(set(again.lengths.tolist())) > 1  # lengths 2..9: a mean that can be wrong
    assert mean == again.mean
    assert evaluate.final_mean_length == pytest.approx(again.lengths.mean())
    assert logged == [(100, {"eval/final_mean_return": mean,
                             "eval/final_mean_length": evaluate.final_mean_length})]


def test_a_round_played_in_parts_scores_as_the_whole() -> None:
    from agent.evaluate import run_episodes

    envs = [make_env("envs.testing:NoisyDQN/CueVaried-v0") for _ in range(3)]
    kw = {"seed": 5, "round_index": 2, "stream": 5, "epsilon": 0.3, "n_actions": 2}
    whole = run_episodes(_always_one, envs, 11, **kw)
    parts = [run_episodes(_always_one, envs, n, first=first, **kw)
             for first, n in ((0, 4), (4, 4), (8, 3))]  # fmt: skip
    assert np.concatenate([p.returns for p in parts]).tolist() == whole.returns.tolist()
    assert np.concatenate([p.lengths for p in parts]).tolist() == whole.lengths.tolist()


def _cut_short(path: Path) -> None:
    """``path`` truncated to half its bytes, as a copy that stopped half-way leaves it."""
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def test_eval_of_a_run_plays_its_other_checkpoint_where_the_favoured_one_cannot_be_read(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from agent import cli
    from conftest import train_checkpoint

    last = train_checkpoint(tmp_path / "run", "CartPole-v1", 1_000, eval_interval=500)
    run_dir, best = last.parent.parent, last.parent / "best.pt"
    intact = {p: p.read_bytes() for p in (best, last)}
    written = json.loads((run_dir / "result.json").read_text())

    def evaluated(favoured: Path, **figures: object) -> tuple[str, str]:
        """(the checkpoint --eval RUN played, its line saying which) with ``favoured``,
        the one the run's figures favour, cut short."""
        for path, raw in intact.items():
            path.write_bytes(raw)
        (run_dir / "result.json").write_text(json.dumps({**written, **figures}))
        _cut_short(favoured)
        capsys.readouterr()
        assert cli.main(["--eval", str(run_dir), "--episodes", "1", "--json",
                         "--device", "cpu"]) == 0  # fmt: skip
        out = capsys.readouterr().out.splitlines()
        (line,) = [x for x in out if x.startswith("checkpoint:")]
        return json.loads(out[-1])["checkpoint"], line

    taken, line = evaluated(last, best_confirmed=True, best_eval_return=3.0, final_eval_return=4.0)
    assert taken == str(best) and str(best) in line and "last.pt" in line
    taken, line = evaluated(best, best_confirmed=True, best_eval_return=4.0, final_eval_return=3.0)
    assert taken == str(last) and str(last) in line and "best.pt" in line
    # Neither can be read: one line, exit status 2.
    _cut_short(last)
    code = cli.main(["--eval", str(run_dir), "--episodes", "1", "--device", "cpu"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Errno" not in lines[0], lines
