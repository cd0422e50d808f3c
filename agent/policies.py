"""The policy a run's own figures favour, and loading a saved one: what ``run.py --eval``
and ``--export`` take for a run directory, and the flags that replay a score's episodes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agent.errors import UserError
from agent.usage import command

__all__ = ["favoured_policy", "load_policy", "load_policy_file", "policy_file", "replay_flags"]


def replay_flags(episodes: dict[str, Any]) -> str:
    """Episodes as the flags that replay them."""
    epsilon = f" --epsilon {episodes['epsilon']:g}" if episodes.get("epsilon") else ""
    return (f"--seed {episodes['seed']} --stream {episodes['stream']} --round {episodes['round']} "
            f"--episodes {episodes['episodes']}{epsilon}")  # fmt: skip


def policy_file(path: str | Path) -> Path:
    """The checkpoint that ``--eval`` and ``--export`` take for ``path``: a file as it is;
    for a run directory (or its ``checkpoints/``), the policy its own scores favour, as a
    printed line says: ``best.pt`` where fresh episodes confirmed it above ``last.pt``'s
    final score (or the run has no final score yet), else ``last.pt``; ``last.pt`` too
    where the run made no periodic evaluation (no ``best.pt``); the other of the two where
    that one cannot be read (:func:`load_policy_file`)."""
    return load_policy_file(path)[0]


def load_policy_file(path: str | Path) -> tuple[Path, dict[str, Any]]:
    """:func:`policy_file`'s checkpoint and what it holds, read once.

    Where a run directory's favoured checkpoint cannot be read (cut short, damaged), the
    other one is taken and the printed line says so: a run's best.pt and last.pt are both
    its policies, and one damaged file should not cost the other.
    """
    from agent.checkpoint import UnreadableCheckpoint, load_checkpoint

    path = Path(path)
    if not path.is_dir():
        return path, load_checkpoint(path)
    folder = path if path.name == "checkpoints" else path / "checkpoints"
    best, last = folder / "best.pt", folder / "last.pt"
    if not best.is_file() and not last.is_file():
        raise UserError(
            f"{path} holds no checkpoints/best.pt or last.pt: give a run directory or a "
            f"checkpoint file that {command()} wrote"
        )
    if not best.is_file():
        data = load_checkpoint(last)
        print(f"checkpoint: {last}, the run's latest policy (no best.pt: it made no "
              "periodic evaluation)")  # fmt: skip
        return last, data
    if not last.is_file():
        data = load_checkpoint(best)
        print(f"checkpoint: {best}, the run's best policy (no last.pt beside it)")
        return best, data
    chosen, why = favoured_policy(folder.parent)
    first, other = (best, last) if chosen == "best" else (last, best)
    try:
        data = load_checkpoint(first)
    except UnreadableCheckpoint:
        try:
            data = load_checkpoint(other)
        except UnreadableCheckpoint:
            raise UserError(
                f"neither checkpoint of {folder.parent} can be read (best.pt and last.pt are "
                "truncated or corrupt): give an earlier copy of either"
            ) from None
        kind = "best" if other == best else "latest"
        print(f"checkpoint: {other}, the run's {kind} policy: {first.name}, which its scores "
              "favour, cannot be read (truncated or corrupt)")  # fmt: skip
        return other, data
    print(f"checkpoint: {first}, {why}")
    return first, data


def favoured_policy(run_dir: Path) -> tuple[str, str]:
    """Which of a run's best.pt and last.pt its result.json favours, and why, in words."""
    try:
        result = json.loads((run_dir / "result.json").read_text())
    except (OSError, ValueError):
        result = {}
    best, final = result.get("best_eval_return"), result.get("final_eval_return")
    if best is None or final is None:
        return "best", "the run's best policy (the run has no final score to compare it with)"
    from agent.evaluate import format_return

    best_text, final_text = format_return(best), format_return(final)
    if not result.get("best_confirmed"):
        return "last", (f"the final policy: its score {final_text} is on fresh episodes, "
                        f"best.pt's {best_text} on the periodic round that picked it")  # fmt: skip
    if best > final:
        return "best", (f"the run's best policy: confirmed at {best_text} on fresh episodes, "
                        f"above last.pt's final {final_text}")  # fmt: skip
    return "last", (f"the final policy: its final score {final_text} is at or above best.pt's "
                    f"confirmed {best_text}")  # fmt: skip


def load_policy(
    path: str | Path,
    env_id: str | None,
    device: str | None,
    data: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], Any, Any, dict[str, Any], Any]:
    """(checkpoint, its config, the env's spec, the env's options, online network) for
    ``--eval`` and ``--export``; ``env_id`` None means the checkpoint's own env; ``data``:
    the checkpoint at ``path`` where it was read already (:func:`load_policy_file`).

    The training env's options (``env_kwargs`` and ``wrappers``, as keyword arguments of
    ``make_env``) apply when the env is the training env.
    One torch thread: these are batch-1 forwards while playing the env.
    """
    import torch

    from agent.checkpoint import check_compatible, load_checkpoint
    from agent.config_files import config_from_dict
    from agent.train import build_q_network, resolve_device
    from envs import inspect_env

    if data is None:
        data = load_checkpoint(path)
    cfg = config_from_dict(dict(data["config"]), str(path))
    env_id = env_id or data["env_id"]
    same = env_id == data["env_id"]
    env_options = {
        "env_kwargs": cfg.env_kwargs if same else {},
        "wrappers": cfg.wrappers if same else [],
    }
    spec = inspect_env(env_id, **env_options)
    check_compatible(data, env_id, spec.obs_shape, spec.n_actions)
    torch.set_num_threads(1)
    on = resolve_device(device or "auto")
    q_network = build_q_network(cfg, spec.obs_shape, spec.n_actions, on, spec.obs_dtype)
    q_network.load_state_dict(data["q_network"])
    return data, cfg, spec, env_options, q_network
