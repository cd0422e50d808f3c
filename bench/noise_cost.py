"""Benchmark: what the noisy layers add to a DER learning step, part by part.

    python -m bench.noise_cost               # about a minute on one core
    python -m bench.noise_cost --rounds 5 --json noise_cost.json

The DER network of ``--config der`` (C51 dueling head, four noisy layers) against the
same network without noisy layers (``der-epsilon``'s), one thread each as training on a
CPU, the two interleaved over ``--rounds`` so drift hits them alike. Per network, the
medians of: a whole update (batch 32 of random frames, the numpy learner); of it, the
update noise drawn for both networks (:meth:`Learner.draw_update_noise`) and Adam's
step (``learner.optimizer.step``); the rest (forwards, loss, backward) by difference;
one action at batch 1 with fresh noise and with the noise held (the selector's
numpy forward). ``python -m bench.atari100k speed`` times the whole learning step of
the two arms; this says where the difference goes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from typing import Any

import numpy as np

from agent.acting.selector import ActionSelector
from agent.setup import limit_cpu_threads
from bench.atari100k import der_batch, der_learner, median_ms

PARTS = ("update", "update noise", "adam step", "forwards and backward", "act, fresh noise",
         "act, noise held")  # fmt: skip


def measure(n_actions: int, noisy: bool, calls: int) -> dict[str, float]:
    """Milliseconds of each of :data:`PARTS` for one network."""
    learner, batch = der_learner(n_actions, noisy), der_batch(n_actions)
    for _ in range(5):  # Adam's moments and the numpy programs in place
        learner.update(batch)
    update = median_ms(lambda: learner.update(batch), calls)
    noise = median_ms(learner.draw_update_noise, calls)
    adam = median_ms(learner.optimizer.step, calls)
    selector = ActionSelector(learner.q_network, (4, 84, 84), 1, noise=noisy, seed=0)
    obs = np.random.default_rng(0).integers(0, 256, (1, 4, 84, 84), dtype=np.uint8)
    fresh = median_ms(lambda: selector(obs, True), 4 * calls)
    held = median_ms(lambda: selector(obs, False), 4 * calls)
    return dict(zip(PARTS, (update, noise, adam, update - noise - adam, fresh, held),
                    strict=True))  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--game-actions", type=int, default=18, help="the game's actions (Krull: 18)")
    p.add_argument("--calls", type=int, default=100, help="timed calls per part and round")
    p.add_argument("--rounds", type=int, default=3, help="rounds of both networks (median)")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args()
    rounds: dict[str, list[dict[str, float]]] = {"der": [], "der-epsilon": []}
    with contextlib.ExitStack() as cleanup:
        limit_cpu_threads(1, cleanup)
        for _ in range(args.rounds):
            for arm, noisy in (("der", True), ("der-epsilon", False)):
                rounds[arm].append(measure(args.game_actions, noisy, args.calls))
    out: dict[str, Any] = {
        arm: {part: float(np.median([r[part] for r in rs])) for part in PARTS}
        for arm, rs in rounds.items()
    }
    print(f"DER network, {args.game_actions} actions, one thread, ms (median of "
          f"{args.rounds} rounds):")  # fmt: skip
    print(f"  {'':24} {'der':>8} {'der-eps':>8} {'noise adds':>10}")
    for part in PARTS:
        noisy, plain = out["der"][part], out["der-epsilon"][part]
        print(f"  {part:24} {noisy:8.3f} {plain:8.3f} {noisy - plain:10.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
