"""The exact expected return of saved greedy policies on tabular envs, without sampling.

    python -m bench.exact_value --env FrozenLake-v1 RUN/checkpoints/last.pt [MORE.pt ...]

On a slippery grid world a sampled evaluation is too noisy to rank policies by: on
FrozenLake-v1 the optimal policy's 100-episode mean has a standard error of about 0.04,
and it reaches the 0.70 threshold only 87% of the time. The toy-text envs (FrozenLake,
CliffWalking, Taxi) publish their whole model: ``env.unwrapped.P[s][a]`` lists the
``(probability, next_state, reward, terminated)`` outcomes, and
``initial_state_distrib`` the start states. For a deterministic policy that is enough to
compute its expected return exactly, by dynamic programming over the episode's time
limit (the env's ``max_episode_steps``, ``env_kwargs`` included): the number that any
number of sampled episodes converges to.

The policy is the checkpoint's noise-free greedy policy (what ``--eval`` plays): its
action in every state, read by passing each state through the same observation wrappers
that training and ``--eval`` use (one-hot for a Discrete state). One line per
checkpoint: the expected return, then the action per state.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
import numpy as np

from agent.errors import UserError

__all__ = [
    "TabularModel",
    "exact_value_of_checkpoint",
    "expected_return",
    "greedy_table",
    "optimal_return",
    "state_observation",
]


class TabularModel:
    """A tabular env's model as arrays: outcomes of each (state, action), start distribution
    (raises :class:`UserError` when the env publishes none)."""

    def __init__(self, env: gym.Env) -> None:
        base = env.unwrapped
        transitions = getattr(base, "P", None)
        initial = getattr(base, "initial_state_distrib", None)
        if transitions is None or initial is None:
            raise UserError(
                f"{env.spec.id if env.spec else base}: no transition table (env.unwrapped.P "
                "and initial_state_distrib); the exact value needs a tabular env such as "
                "FrozenLake-v1, CliffWalking-v1 or Taxi-v4"
            )
        self.n_states = len(transitions)
        self.n_actions = len(transitions[0])
        self.initial = np.asarray(initial, dtype=np.float64)  # (S,)
        # Expected reward of one step, and the probability of each non-terminal successor:
        # a terminated outcome adds its reward and ends the episode (nothing after it).
        self.reward = np.zeros((self.n_states, self.n_actions))  # (S, A)
        self.next = np.zeros((self.n_states, self.n_actions, self.n_states))  # (S, A, S)
        for s, by_action in transitions.items():
            for a, outcomes in by_action.items():
                for p, s_next, r, terminated in outcomes:
                    self.reward[s, a] += p * r
                    if not terminated:
                        self.next[s, a, s_next] += p


def expected_return(model: TabularModel, policy: np.ndarray, horizon: int) -> float:
    """Expected undiscounted return of ``policy`` (an action per state) over at most
    ``horizon`` steps from the start distribution: the mean of infinitely many episodes
    cut by the same time limit."""
    states = np.arange(model.n_states)
    reward = model.reward[states, policy]  # (S,)
    next_p = model.next[states, policy]  # (S, S)
    value = np.zeros(model.n_states)  # the return of the 0 steps that are left
    for _ in range(horizon):
        value = reward + next_p @ value
    return float(model.initial @ value)


def optimal_return(model: TabularModel, horizon: int) -> float:
    """The most any policy can expect over at most ``horizon`` steps from the start
    distribution (dynamic programming with a max over actions at every step left): a
    target return above it can only be reached by luck."""
    value = np.zeros(model.n_states)  # the best return of the 0 steps that are left
    for _ in range(horizon):
        value = (model.reward + model.next @ value).max(axis=1)  # (S, A) -> (S,)
    return float(model.initial @ value)


def state_observation(env: gym.Env, state: int) -> np.ndarray:
    """What the Q-network sees in ``state``: the state through ``env``'s observation
    wrappers, innermost first (the same wrappers as in training and ``--eval``)."""
    wrappers = []
    layer = env
    while isinstance(layer, gym.Wrapper):
        wrappers.append(layer)
        layer = layer.env
    obs = state
    for wrapper in reversed(wrappers):
        if isinstance(wrapper, gym.ObservationWrapper):
            obs = wrapper.observation(obs)
    return np.asarray(obs)


def greedy_table(
    env: gym.Env, n_states: int, policy: Callable[[np.ndarray], np.ndarray]
) -> np.ndarray:
    """The action ``policy`` (a batch of observations to actions) takes in every state."""
    batch = np.stack([state_observation(env, s) for s in range(n_states)])
    return np.asarray(policy(batch), dtype=np.int64)


def exact_value_of_checkpoint(env_id: str, checkpoint: str | Path) -> tuple[float, np.ndarray]:
    """(expected return, action per state) of a checkpoint's noise-free greedy policy."""
    from agent.acting import ActionSelector
    from envs import make_env
    from agent.cli import load_policy

    _, _, spec, env_options, q_network = load_policy(checkpoint, env_id, "cpu")
    env = make_env(env_id, **env_options)
    try:
        model = TabularModel(env)
        if spec.max_episode_steps is None:
            raise UserError(
                f"{env_id} has no time limit: train it with env_kwargs "
                "{max_episode_steps: N} so that its episodes end"
            )
        # --eval's policy, noise off, with every state in one batch
        act = ActionSelector(q_network, spec.obs_shape, model.n_states, "cpu", noise=False)
        table = greedy_table(env, model.n_states, act)
        return expected_return(model, table, spec.max_episode_steps), table
    finally:
        env.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--env", required=True, help="the tabular env the checkpoints play")
    p.add_argument("checkpoints", nargs="+", help="saved policies (.pt)")
    args = p.parse_args(argv)
    try:
        for path in args.checkpoints:
            value, table = exact_value_of_checkpoint(args.env, path)
            print(f"{value:.4f}  {path}  actions: {' '.join(map(str, table))}")
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
