"""Every random stream of a run, named in one table.

A run is seeded by its ``seed`` alone; each stream below is derived from it and a number
of its own, so the streams never share draws, and one of them can change (a new
evaluation, another augmentation) without moving the others: an exact resume restores
each from the checkpoint. The numbers are part of every trajectory already run: a new
stream takes a new number, an old one keeps its own.

=============  ======  ==========================================================
stream         number  derived as
=============  ======  ==========================================================
TRAIN_ENVS     0       ``episode_seed(seed, env, episode, 0)``: training episodes
EVAL           1       ``episode_seed(seed, round, episode, 1)``: evaluations
CLI_EVAL       2       ``episode_seed(seed, 0, episode, 2)``: ``--eval`` episodes
EXPLORATION    2       ``np.random.default_rng([seed, 2])``: epsilon, the floor, the
                       warm-up (a two-word entropy: no overlap with CLI_EVAL's four)
PROBE          3       ``episode_seed(seed, 0, step, 3)``: the exploration probe at a log
AUGMENT        4       ``SeedSequence([seed, 4])``: the batch augmentation's generator
BEST           5       ``episode_seed(seed, round, episode, 5)``: the episodes that confirm
                       periodic round ``round``'s policy as a candidate for ``best.pt``
GROUP_ACT      10      ``SeedSequence([seed, 10])``: a stacked seed's acting noise
GROUP_UPDATE   11      ``SeedSequence([seed, 11])``: a stacked seed's update noise
=============  ======  ==========================================================

Beside them: torch's global generator, seeded with ``seed`` (network initialisation,
the update noise of a single run, the replay's sampling generator is a
``torch.Generator`` seeded with ``seed``), and an evaluation episode's random actions
(``eval_epsilon``), drawn from ``[seed, stream, round, episode, 7]``.
"""

from __future__ import annotations

__all__ = [
    "AUGMENT",
    "BEST",
    "CLI_EVAL",
    "EVAL",
    "EXPLORATION",
    "GROUP_ACT",
    "GROUP_UPDATE",
    "PROBE",
    "TRAIN_ENVS",
]

TRAIN_ENVS = 0
EVAL = 1
CLI_EVAL = 2
EXPLORATION = 2
PROBE = 3
AUGMENT = 4
BEST = 5
GROUP_ACT = 10
GROUP_UPDATE = 11
