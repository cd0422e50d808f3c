"""Does a bfloat16 loss learn what the float32 one does? The numbers, before any run.

    python -m bench.bf16_check                           # der and drq-epsilon, Krull
    python -m bench.bf16_check --nets drq-epsilon --updates 300 --every 10 --json out.json

Along a float32 run of updates on real frames (a replay of ``--frames`` random-policy
transitions of the game, through the run's own preprocessing), every ``--every`` updates
the float32 learner's state is copied into a twin whose loss runs under bfloat16 autocast
(``Learner(autocast=torch.bfloat16)``; parameters, gradients and Adam stay float32), and
from that one state, batch and noise both compute: the loss, the gradient (before
clipping) and one clipped Adam step. Printed per network: the relative differences
``|bf16 - fp32| / |fp32|`` (norms for the gradient and the step) as median and maximum over
the checks, and the cosine between the two gradients. The updates run eagerly: the
compiled update fuses other ops but rounds its products alike. A numerical check only;
whether bfloat16 costs learning is for runs on tuning seeds to say.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import statistics
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agent.config_files import load_config
from agent.learner import Learner
from agent.replay import Batch
from agent.setup import build_q_network, learner_settings, limit_cpu_threads
from bench.acting import machine
from envs import make_env

NETS = ("der", "drq-epsilon")


def frames(
    env_id: str, config: str, count: int, seed: int = 0
) -> tuple[dict[str, np.ndarray], int]:
    """``count`` transitions of a uniform random policy, as the run's env gives them, and
    the number of actions."""
    cfg = load_config(env_id, config)
    env = make_env(env_id, env_kwargs=cfg.env_kwargs, wrappers=cfg.wrappers)
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    out: dict[str, list[Any]] = {"obs": [], "actions": [], "rewards": [], "next_obs": [],
                                 "dones": []}  # fmt: skip
    for _ in range(count):
        action = int(rng.integers(env.action_space.n))
        next_obs, reward, terminated, truncated, _ = env.step(action)
        for key, value in (("obs", obs), ("actions", action), ("rewards", np.sign(reward)),
                           ("next_obs", next_obs), ("dones", float(terminated))):  # fmt: skip
            out[key].append(value)
        obs = env.reset()[0] if terminated or truncated else next_obs
    n_actions = int(env.action_space.n)
    env.close()
    return {key: np.asarray(values) for key, values in out.items()}, n_actions


def twin_step(learner: Learner, batch: Batch, seed: int) -> tuple[float, torch.Tensor, list]:
    """The update's loss, its gradient (before clipping) and the parameters' change after
    one clipped Adam step, under noise seeded ``seed``: the update, step by step."""
    before = [p.detach().clone() for p in learner.optimizer.params]
    torch.manual_seed(seed)
    learner.draw_update_noise()
    learner.optimizer.zero_grad()
    loss, _, _ = learner.loss(batch)
    loss.backward()
    grad = learner.optimizer.flat_grad.clone()
    if learner.max_grad_norm is not None:
        learner.optimizer.clip_grad_norm_(learner.max_grad_norm)
    learner.optimizer.step()
    step = [p.detach() - b for p, b in zip(learner.optimizer.params, before, strict=True)]
    return float(loss.detach()), grad, step


def check(name: str, args: argparse.Namespace) -> dict[str, Any]:
    env_id = args.env
    cfg = load_config(env_id, name)
    data, n_actions = frames(env_id, name, args.frames)
    torch.manual_seed(0)
    net = build_q_network(cfg, data["obs"].shape[1:], n_actions, torch.device("cpu"), "uint8")
    settings = learner_settings(cfg, cfg.exploration == "noisy")
    fp32 = Learner(net, copy.deepcopy(net).requires_grad_(False), **settings, backend="torch")
    rng = np.random.default_rng(1)
    diffs: dict[str, list[float]] = {"loss": [], "gradient": [], "step": [], "cosine": []}
    for i in range(args.updates):
        pick = rng.integers(len(data["obs"]), size=cfg.batch_size)
        batch = Batch(torch.from_numpy(data["obs"][pick]), torch.from_numpy(data["actions"][pick]),
                      torch.from_numpy(data["rewards"][pick]).float(),
                      torch.from_numpy(data["next_obs"][pick]),
                      torch.from_numpy(data["dones"][pick]).float(),
                      torch.full((cfg.batch_size,), cfg.gamma**cfg.n_step), None,
                      torch.ones(cfg.batch_size) if cfg.prioritized_replay else None)  # fmt: skip
        if i % args.every == 0:
            bf16 = Learner(copy.deepcopy(fp32.q_network), copy.deepcopy(fp32.target_network),
                           **settings, backend="torch", autocast=torch.bfloat16)  # fmt: skip
            bf16.optimizer.load_state_dict(fp32.optimizer.state_dict())
            probe = Learner(copy.deepcopy(fp32.q_network), copy.deepcopy(fp32.target_network),
                            **settings, backend="torch")  # fmt: skip
            probe.optimizer.load_state_dict(fp32.optimizer.state_dict())
            l32, g32, s32 = twin_step(probe, batch, seed=i)
            l16, g16, s16 = twin_step(bf16, batch, seed=i)
            s32_flat = torch.cat([s.flatten() for s in s32])
            s16_flat = torch.cat([s.flatten() for s in s16])
            diffs["loss"].append(abs(l16 - l32) / abs(l32))
            diffs["gradient"].append(float((g16 - g32).norm() / g32.norm()))
            diffs["step"].append(float((s16_flat - s32_flat).norm() / s32_flat.norm()))
            diffs["cosine"].append(float(torch.nn.functional.cosine_similarity(g16, g32, dim=0)))
        torch.manual_seed(10_000 + i)
        fp32.update(batch)
        if (i + 1) % cfg.target_update_interval == 0:
            fp32.sync_target()
    out = {key: {"median": statistics.median(v), "max": max(v), "min": min(v)}
           for key, v in diffs.items()}  # fmt: skip
    print(f"{name} ({len(diffs['loss'])} checks over {args.updates} fp32 updates): "
          + "; ".join(f"{k} median {v['median']:.2e}, max {v['max']:.2e}"
                      for k, v in out.items() if k != "cosine")
          + f"; gradient cosine min {out['cosine']['min']:.4f}", flush=True)  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nets", default=",".join(NETS), help=f"presets, of {', '.join(NETS)}")
    parser.add_argument("--env", default="KrullNoFrameskip-v4")
    parser.add_argument("--frames", type=int, default=2_000, help="random-policy transitions")
    parser.add_argument("--updates", type=int, default=300, help="float32 updates along the run")
    parser.add_argument("--every", type=int, default=10, help="a check every this many")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    with contextlib.ExitStack() as cleanup:
        limit_cpu_threads(1, cleanup)
        out: dict[str, Any] = {"machine": machine(), "env": args.env, "nets": {}}
        print(out["machine"])
        for name in args.nets.split(","):
            out["nets"][name] = check(name, args)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
