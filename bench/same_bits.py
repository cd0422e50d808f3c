"""Are trajectories unchanged to the bit? Short runs of fixed configurations, each reduced
to a digest of everything its ``last.pt`` and ``result.json`` hold but wall times.

    python -m bench.same_bits --out new.json              # this checkout
    python -m bench.same_bits --checkout ../old --out old.json   # another one (a worktree)
    python -m bench.same_bits --compare old.json new.json  # exit 1 where a trajectory differs

A checkout that records more than the other (a new counter in ``last.pt``, a new field
in ``result.json``) is compared on the entries both hold, and the new ones are named.

A refactor that claims to change nothing runs it on both commits; a landing during report
runs checks that their configurations still reproduce. Every case is a ``run.py`` command,
run in the checkout it names, one torch thread.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch



def _der(game: str, *settings: str) -> list[str]:
    """``--config der`` on ``game`` for 2,400 steps (800 updates) and two capped final
    episodes, with ``settings`` (KEY=VALUE) over it."""
    return ["--env", f"{game}NoFrameskip-v4", "--config", "der", "--total-steps", "2400",
            *(arg for setting in settings for arg in ("--set", setting)),
            "--set", "final_episodes=2", "--set", "eval_envs=2",
            "--set", "env_kwargs={max_num_frames_per_episode: 8000}"]  # fmt: skip


# The Atari 100k report's epsilon-greedy arm, as --set (bench/atari100k.py's EPSILON).
_EPSILON = ("exploration=epsilon", "noisy_layers=none", "epsilon_end=0.01",
            "epsilon_fraction=0.05")  # fmt: skip
# (name, run.py arguments): short, but long enough that every case learns, evaluates and
# checkpoints.
CASES: list[tuple[str, list[str]]] = [
    ("cartpole", ["--env", "CartPole-v1", "--total-steps", "3000", "--set", "random_starts=500",
                  "--set", "eval_interval=1500"]),
    ("mountaincar", ["--env", "MountainCar-v0", "--total-steps", "3000",
                     "--set", "random_starts=500", "--set", "eval_interval=1500"]),
    ("cartpole-seeds", ["--env", "CartPole-v1", "--seeds", "2", "--total-steps", "2000",
                        "--set", "random_starts=500", "--set", "eval_interval=1000"]),
    ("cartpole-torch", ["--env", "CartPole-v1", "--total-steps", "3000",
                        "--set", "random_starts=500", "--set", "eval_interval=1500",
                        "--set", "learner_backend=torch"]),
    # The default config: noise held for an episode, drawn again on a repeated observation.
    ("frozenlake-held", ["--env", "FrozenLake-v1", "--total-steps", "4000",
                         "--set", "random_starts=500", "--set", "eval_interval=2000"]),
    ("frozenlake-held-seeds", ["--env", "FrozenLake-v1", "--seeds", "2", "--total-steps",
                               "3000", "--set", "random_starts=500",
                               "--set", "eval_interval=1500"]),
    ("minatar-breakout", ["--env", "MinAtar/Breakout-v0", "--total-steps", "6000",
                          "--set", "learning_starts=1000", "--set", "random_starts=1000",
                          "--set", "eval_interval=3000", "--set", "confirm_episodes=5"]),
    ("minatar-rainbow", ["--env", "MinAtar/SpaceInvaders-v0", "--config", "rainbow",
                         "--total-steps", "5000", "--set", "learning_starts=1000",
                         "--set", "random_starts=1000", "--set", "eval_interval=2500",
                         "--set", "confirm_episodes=5"]),
    ("atari-nature", ["--env", "PongNoFrameskip-v4", "--total-steps", "1200",
                      "--set", "learning_starts=600", "--set", "buffer_size=5000",
                      "--set", "eval_interval=1200", "--set", "eval_episodes=1",
                      "--set", "confirm_episodes=1",
                      "--set", "env_kwargs={max_num_frames_per_episode: 4000}"]),
    ("atari-der", _der("Breakout")),
    # The Atari 100k report's epsilon arm (bench/atari100k.py), and epsilon-greedy on a
    # net that has noisy layers (acting and learning on their mean weights).
    ("atari-der-epsilon", _der("Breakout", *_EPSILON)),
    # A second game beside Breakout (18 actions to its 4), and the third report's noisy arm
    # (der-floor, as --set so that older checkouts run it too).
    ("atari-der-krull", _der("Krull")),
    ("atari-der-epsilon-krull", _der("Krull", *_EPSILON)),
    ("atari-der-floor", _der("Breakout", "noisy_epsilon=0.01")),
    ("cartpole-epsilon-mean", ["--env", "CartPole-v1", "--total-steps", "3000",
                               "--set", "exploration=epsilon", "--set", "random_starts=500",
                               "--set", "eval_interval=1500"]),
    ("cartpole-epsilon-mean-seeds", ["--env", "CartPole-v1", "--seeds", "2", "--total-steps",
                                     "2000", "--set", "exploration=epsilon",
                                     "--set", "random_starts=500",
                                     "--set", "eval_interval=1000"]),
]
# What is not the trajectory: times, where the run was, and the config as saved (which
# grows a key with every new setting; the cases fix the values that matter).
_WALL = {"wall_time_s", "final_eval_wall_s", "run_dir", "config", "pieces"}
# The random streams' saved states, which a change of the checkpoint's layout moves
# while the trajectory (networks, optimizer, replay, counters, results) stays: the
# "trajectory" digest leaves them out, the "full" one keeps them.
_STREAMS = {"rng", "sample_generator", "explore_rng", "selector", "augment", "seed_group",
            "exploration", "version"}  # fmt: skip


def _digest(value: object, h: hashlib._Hash, skip: frozenset = frozenset()) -> None:
    """Feed ``value`` (a checkpoint's nested dicts, lists, tensors and numbers) to ``h``,
    without the top-level keys in ``skip``."""
    if isinstance(value, dict):
        for key in sorted(value, key=str):
            if key in _WALL or key in skip:
                continue
            h.update(str(key).encode())
            _digest(value[key], h)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _digest(item, h)
    elif isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    else:
        h.update(repr(value).encode())


def _entries(value: object, prefix: str, out: dict[str, str]) -> None:
    """A digest of each entry of ``value`` (nested dicts down to their leaves) by path."""
    if isinstance(value, dict):
        for key in value:
            if key not in _WALL:
                _entries(value[key], f"{prefix}/{key}", out)
        return
    h = hashlib.sha256()
    _digest(value, h)
    out[prefix] = h.hexdigest()[:16]


def run_digests(names: list[str], root: Path, work: Path, out=sys.stdout) -> dict[str, str]:
    """Each case's digest, trained by ``root``'s run.py in a directory under ``work``."""
    digests = {}
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for name, args in CASES:
        if names and name not in names:
            continue
        run_dir = work / name
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "run.py", *args, "--run-dir", str(run_dir),
                               "--no-progress"], cwd=root, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)  # fmt: skip
        if done.returncode != 0:  # a case this checkout cannot run (a key it lacks)
            last = (done.stderr.strip().splitlines() or ["?"])[-1]
            digests[name] = f"failed: {last}"
            print(f"{name}: failed ({last})", file=out)
            continue
        full, trajectory = hashlib.sha256(), hashlib.sha256()
        entries: dict[str, str] = {}
        for path in sorted(run_dir.rglob("last.pt")) + sorted(run_dir.rglob("result.json")):
            data = (torch.load(path, weights_only=True) if path.suffix == ".pt"
                    else json.loads(path.read_text()))  # fmt: skip
            for h, skip in ((full, frozenset()), (trajectory, frozenset(_STREAMS))):
                h.update(str(path.relative_to(run_dir)).encode())
                _digest(data, h, skip)
            _entries({k: v for k, v in data.items() if k not in _STREAMS},
                     str(path.relative_to(run_dir)), entries)  # fmt: skip
        digests[name] = {"trajectory": trajectory.hexdigest(), "full": full.hexdigest(),
                         "entries": entries}  # fmt: skip
        print(f"{name}: {digests[name]['trajectory'][:16]} ({time.perf_counter() - start:.0f} s)",
              file=out)  # fmt: skip
    return digests


def compare(a: dict, b: dict) -> tuple[list[str], bool]:
    """A line per case both digest files hold, and whether a trajectory differs."""
    lines, differ = [], False
    for k in sorted(a.keys() & b.keys()):
        failed = [d[k] for d in (a, b) if isinstance(d[k], str)]
        if failed:
            lines.append(f"{k}: not compared ({failed[0]})")
            continue
        if a[k]["trajectory"] == b[k]["trajectory"]:
            laid_out = a[k]["full"] != b[k]["full"]
            lines.append(f"{k}: same" + (" (the random streams' saved states are laid out "
                                         "otherwise)" if laid_out else ""))  # fmt: skip
            continue
        if not ("entries" in a[k] and "entries" in b[k]):
            lines.append(f"{k}: DIFFERENT")
            differ = True
            continue
        # A checkout that records more (a new counter, a new result field) differs in its
        # digest alone: the entries both hold decide.
        ea, eb = a[k]["entries"], b[k]["entries"]
        changed = sorted(e for e in ea.keys() & eb.keys() if ea[e] != eb[e])
        if changed:
            lines.append(f"{k}: DIFFERENT: {', '.join(changed)}")
            differ = True
        else:
            lines.append(f"{k}: same on the {len(ea.keys() & eb.keys())} entries both hold; "
                         f"only in one: {', '.join(sorted(ea.keys() ^ eb.keys()))}")
    return lines, differ


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the digests here (JSON)")
    parser.add_argument("--checkout", default=".", help="the checkout whose run.py trains")
    parser.add_argument("--cases", default="", help="comma-separated case names (default all)")
    parser.add_argument("--compare", nargs=2, metavar=("A", "B"), help="two digest files")
    args = parser.parse_args()
    if args.compare:
        a, b = (json.loads(Path(p).read_text()) for p in args.compare)
        lines, differ = compare(a, b)
        print("\n".join(lines))
        sys.exit(1 if differ else 0)
    names = [n for n in args.cases.split(",") if n]
    with tempfile.TemporaryDirectory() as work:
        digests = run_digests(names, Path(args.checkout).resolve(), Path(work))
    if args.out:
        Path(args.out).write_text(json.dumps(digests, indent=2) + "\n")


if __name__ == "__main__":
    main()
