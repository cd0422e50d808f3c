"""Noisy DQN command line (``noisy-dqn``, or ``python run.py`` in a checkout): train,
evaluate a saved policy, resume an interrupted run.

    python run.py --env CartPole-v1                       train with configs/ defaults
    python run.py --eval RUN_DIR                          the policy its scores favour, on its env
    python run.py --export RUN_DIR [--format onnx|torch]  a deployable policy, from the same
    python run.py --resume RUN_DIR                        continue from RUN_DIR/checkpoints/last.pt
    python run.py --env CartPole-v1 --seeds 10 [--grid n_step=1,3]   many seeds (agent/sweep/)

Every user error ends in one line naming the problem and the fix, with exit status 2.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, NoReturn

from agent.policies import load_policy, load_policy_file, replay_flags
from agent.usage import command, install_hint

__all__ = ["build_parser", "entry", "load_policy", "main"]

EXIT_FAILED = 1
EXIT_USER_ERROR = 2
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE

# One BLAS thread for numpy's small matmuls (acting, evaluation), set before numpy is
# imported: a thread per core is many times slower beside other busy processes.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line instead of argparse's usage block.
        self.exit(EXIT_USER_ERROR, f"error: {message} (see {self.prog} --help)\n")


class _HelpFormatter(argparse.HelpFormatter):
    def _split_lines(self, text: str, width: int) -> list[str]:
        # Lines break between words only: a preset such as der-shift-epsilon stays whole.
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog=command(),
        formatter_class=_HelpFormatter,
        description="Train, evaluate or resume a Noisy-Network DQN agent on a gymnasium env.",
        epilog="--list-config lists the configuration keys for --set (docs/configuration.md).",
    )
    p.add_argument(
        "--env", metavar="ENV_ID", help="gymnasium id, e.g. CartPole-v1 or module:Env-v0"
    )
    train = p.add_argument_group("training")
    from agent.config_files import presets  # yaml and the Config class: no torch

    train.add_argument(
        "--config", metavar="FILE|PRESET",
        # Read from configs/presets/: a preset added there is listed with no edit here.
        help=f"YAML file of config overrides, or a shipped preset: {', '.join(presets())}",
    )
    train.add_argument(
        "--seed",
        type=int,
        help="training: seed of everything (config key seed); --eval: seed of its episodes",
    )
    train.add_argument("--total-steps", type=int, metavar="N", help="environment steps to train")
    train.add_argument("--num-envs", type=int, metavar="N", help="vector sub-environments")
    train.add_argument("--device", metavar="DEV", help="auto (default), cpu, cuda or cuda:N")
    train.add_argument("--run-dir", metavar="DIR", help="default runs/<env>__<seed>__<time>")
    train.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config key (YAML value), repeatable: --set lr=3e-4",
    )
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    train.add_argument(
        "--track", action="store_true",
        help="also send the run to Weights & Biases (config key track; the track extra); with "
        "--eval --video, its videos",
    )  # fmt: skip
    train.add_argument(
        "--resume", metavar="RUN_DIR",
        help="continue RUN_DIR from checkpoints/last.pt (where that cannot be read: from "
        "another checkpoint of the run, RUN_DIR/checkpoints/best.pt, approximately)",
    )  # fmt: skip
    train.add_argument(
        "--list-config", action="store_true", help="print every config key with its doc and exit"
    )
    sweep = p.add_argument_group(
        f"sweeps (many seeds, hyperparameter grids; on Ray: {install_hint('sweep')})"
    )
    sweep.add_argument(
        "--seeds",
        metavar="SEEDS",
        help="train these seeds together in this process (networks stacked), or on Ray with "
        "--ray-address: a count (10), a range (1-10) or a list (3,5,8); "
        "--run-dir names the sweep directory, --resume SWEEP_DIR runs what is missing",
    )
    sweep.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="KEY=V1,V2",
        help="cross these values of one config key with the seeds, repeatable: --grid n_step=1,3",
    )
    sweep.add_argument(
        "--ray-address",
        metavar="ADDRESS",
        help="train the sweep's trials on Ray, one process each: HOST:PORT of a cluster "
        "(from `ray start --head`), or local to start Ray over this machine's cores",
    )
    sweep.add_argument(
        "--retries",
        type=int,
        metavar="N",
        help="retry a crashed or killed trial N times (default 1)",
    )
    _policy_arguments(p)
    return p


def _policy_arguments(p: argparse.ArgumentParser) -> None:
    """The evaluation and export flags: what is done with a saved policy."""
    ev = p.add_argument_group("evaluation")
    ev.add_argument(
        "--eval",
        metavar="CHECKPOINT",
        help="evaluate a saved policy: a .pt file, or a run directory (its best.pt where its "
        "confirmed score beats last.pt's final one, else last.pt; a line says which)",
    )
    ev.add_argument("--episodes", type=int, default=10, metavar="N", help="episodes (default 10)")
    ev.add_argument(
        "--stream", type=int, default=2, metavar="N",
        help="seed stream of the episodes (default 2, which training never plays; result.json's "
        "final_eval_episodes and best_eval_episodes name the stream and round of its scores)",
    )  # fmt: skip
    ev.add_argument(
        "--round", type=int, default=0, metavar="N", help="round of the episodes (default 0)"
    )
    ev.add_argument(
        "--epsilon", type=float, metavar="P",
        help="probability of a uniform random action each step (default: the checkpoint's "
        "eval_epsilon, as the run evaluated)",
    )  # fmt: skip
    ev.add_argument(
        "--noise",
        choices=["on", "off"],
        default="off",
        help="act with the noisy weights or the mean weights (default off)",
    )
    ev.add_argument("--video", metavar="DIR", help="record mp4 files here (needs the video extra)")
    ev.add_argument("--json", action="store_true", help="end with one JSON line of the results")
    ex = p.add_argument_group(f"export (onnx needs the export extra: {install_hint('export')})")
    ex.add_argument(
        "--export",
        metavar="CHECKPOINT",
        help="write the noise-free greedy policy of a .pt file as ONNX or torch.export, verified",
    )
    ex.add_argument(
        "--format",
        choices=["onnx", "torch"],  # agent.export.FORMATS (not imported: it imports torch)
        help="onnx (default; or from --out's suffix) or torch (torch.export, .pt2)",
    )
    ex.add_argument("--out", metavar="FILE", help="default: beside the checkpoint, e.g. best.onnx")


def list_config() -> int:
    from agent.config import Config, field_docs

    docs = field_docs()
    defaults = Config()
    for name, doc in docs.items():
        print(f"{name} = {getattr(defaults, name)!r}\n    {doc}")
    return 0


def default_run_dir(env_id: str, seed: int) -> Path:
    name = env_id.split(":", 1)[-1].replace("/", "_")
    return Path("runs") / f"{name}__{seed}__{time.strftime('%Y%m%d-%H%M%S')}"


# Flags that set a config key, with the least value each takes.
def cmd_train(args: argparse.Namespace) -> int:
    from agent.config_files import check_flag_values, load_config, parse_set

    if not args.env:
        _user_error(f"--env is required to train: e.g. {command()} --env CartPole-v1")
    overrides: dict[str, Any] = parse_set(args.set)
    for flag, key in (
        ("seed", "seed"),
        ("total_steps", "total_steps"),
        ("num_envs", "num_envs"),
        ("device", "device"),
    ):
        if getattr(args, flag) is not None:
            overrides[key] = getattr(args, flag)
    if args.track:
        overrides["track"] = True
    from envs import check_env_id

    check_env_id(args.env)
    check_flag_values(args, lambda: load_config(args.env, args.config, parse_set(args.set)))
    cfg = load_config(args.env, args.config, overrides)
    run_dir = Path(args.run_dir) if args.run_dir else default_run_dir(args.env, cfg.seed)
    if (run_dir / "checkpoints" / "last.pt").exists():
        _user_error(
            f"{run_dir} already holds a run: continue it with --resume {run_dir}, "
            "or pass another --run-dir"
        )
    return _run_training(cfg, run_dir, None, progress=not args.no_progress)


def cmd_resume(args: argparse.Namespace) -> int:
    from agent.checkpoint import holds_training, resume_exactness
    from agent.config_files import config_from_dict
    from agent.resume import how_it_ended, resume_checkpoint, resume_source

    for flag in ("config", "seed", "num_envs", "run_dir", "eval"):
        if getattr(args, flag) is not None:
            _user_error(f"--{flag.replace('_', '-')} cannot change a resumed run: drop it")
    if args.set:
        _user_error("--set cannot change a resumed run: drop it (the saved config is used)")
    run_dir, source = resume_source(Path(args.resume))
    data = resume_checkpoint(run_dir, source)
    if args.env and args.env != data["env_id"]:
        _user_error(f"{run_dir} is a run of {data['env_id']}, not {args.env}: drop --env")
    step = int(data["counters"]["global_step"])
    if args.total_steps is not None and args.total_steps <= step:
        _user_error(
            f"{run_dir} already ran {step} steps, --total-steps {args.total_steps} is not "
            f"above them: extend it with --resume {run_dir} --total-steps N, N above {step}"
        )
    saved = dict(data["config"])
    if args.total_steps is not None:
        saved["total_steps"] = args.total_steps
    if args.device is not None:
        saved["device"] = args.device
    cfg = config_from_dict(saved, str(source))
    ended = how_it_ended(run_dir, step)
    if ended and args.total_steps is None:
        _user_error(
            f"{run_dir} {ended}: extend it with --resume {run_dir} --total-steps N, N above {step}"
        )
    source_name = "" if source.name == "last.pt" else f" from {source.name}"
    how = f"saved {resume_exactness(data)}"
    if not holds_training(data):
        how = ("saved as a policy alone: approximate, with a fresh optimizer and an empty "
               "replay buffer (learning pauses for learning_starts steps while it refills)")
    if step >= cfg.total_steps:  # stopped in (or before) its final evaluation
        print(f"resuming {run_dir} at step {step}{source_name}, its last: the final evaluation")
    else:
        print(f"resuming {run_dir} at step {step}{source_name}, {how}")
    return _run_training(cfg, run_dir, data, progress=not args.no_progress)


def _run_training(cfg: Any, run_dir: Path, checkpoint: Any, progress: bool) -> int:
    import signal

    from agent.checkpoint import CheckpointWriteError
    from agent.learner import NonFiniteError
    from agent.evaluate import format_return
    from agent.train import train

    try:
        result = train(cfg, run_dir, checkpoint=checkpoint, progress=progress)
    except NonFiniteError as e:
        print(
            f"error: training diverged ({e}); {run_dir}/checkpoints/last.pt keeps the last good "
            "state: lower lr or set max_grad_norm",
            file=sys.stderr,
        )
        return EXIT_FAILED
    except CheckpointWriteError as e:  # a full disk, a quota, a read-only file system
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FAILED
    if result.status == "interrupted":
        name = signal.Signals(result.stop_signal or signal.SIGINT).name
        how = result.buffer_left_out or "with the replay buffer: the resume is exact"
        done = result.global_step >= cfg.total_steps
        left = ", its final evaluation still to play" if done else ""
        print(
            f"interrupted ({name}) at step {result.global_step}{left}; saved "
            f"{run_dir}/checkpoints/last.pt {how}\n"
            f"resume with: {command()} --resume {run_dir}"
        )
        # The shell's convention for a process ended by a signal: 130 for Ctrl-C, 143 for
        # SIGTERM, so that schedulers and scripts see why it stopped.
        return 128 + (result.stop_signal or signal.SIGINT)
    final = result.final_eval_return
    final_text = "n/a" if final is None else format_return(final)
    solved = (
        f"solved at step {result.solved_step}" if result.solved_step is not None else "not solved"
    )
    print(
        f"{result.status}: {result.global_step} steps in {result.wall_time_s:.1f} s, {solved}, "
        f"final noise-free return {final_text}\n"
        f"evaluate with: {command()} --eval {run_dir}"
    )
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    import signal

    import torch

    from agent.acting import ActionSelector
    from agent.evaluate import (
        EvaluationStopped,
        episodes_named,
        format_return,
        json_ready,
        run_episodes,
    )
    from agent.signals import StopSignals
    from envs import make_env

    if args.episodes < 1:
        _user_error(f"--episodes must be >= 1, got {args.episodes}")
    for flag, value in (("--stream", args.stream), ("--round", args.round)):
        if value < 0:
            _user_error(f"{flag} must be >= 0, got {value}")
    if args.epsilon is not None and not 0 <= args.epsilon <= 1:
        _user_error(f"--epsilon must be in [0, 1], got {args.epsilon}")
    checkpoint, data = load_policy_file(args.eval)
    data, cfg, spec, env_options, q_network = load_policy(checkpoint, args.env, args.device, data)
    env_id = spec.env_id
    device = next(q_network.parameters()).device
    # Several copies play at once; with --video, one copy, so videos are whole episodes in order.
    if args.video:
        from envs.video import video_env

        envs = [video_env(env_id, args.video, **env_options)]
    else:
        envs = [make_env(env_id, **env_options) for _ in range(min(args.episodes, 10))]
    seed = cfg.seed if args.seed is None else args.seed
    epsilon = cfg.eval_epsilon if args.epsilon is None else args.epsilon
    torch.manual_seed(seed)
    selector = ActionSelector(
        q_network, spec.obs_shape, len(envs), device, noise=args.noise == "on"
    )
    stop = StopSignals()  # Ctrl-C or SIGTERM ends the episodes at the next step
    try:
        with stop:
            result = run_episodes(selector, envs, args.episodes, seed=seed,
                                  round_index=args.round, stream=args.stream, epsilon=epsilon,
                                  n_actions=spec.n_actions, stop=stop.requested)  # fmt: skip
    except EvaluationStopped as e:
        assert stop.received is not None
        print(f"interrupted ({signal.Signals(stop.received).name}) after {e.played} of "
              f"{args.episodes} episodes: no score from part of them (fewer --episodes "
              "take less time)", file=sys.stderr)  # fmt: skip
        return 128 + stop.received
    finally:
        for env in envs:
            env.close()  # with --video, writes the last video
    episodes = episodes_named(seed, args.stream, args.round, args.episodes, epsilon)
    print(
        f"{env_id}: mean return {format_return(result.mean)} +/- {format_return(result.std)} "
        f"(standard error {format_return(result.standard_error)}) over {args.episodes} "
        f"episodes (noise {args.noise}, checkpoint {checkpoint}; {replay_flags(episodes)})"
    )
    if args.video:
        written: list[Path] = getattr(envs[0], "written", [])  # the recorder's (video_env)
        names = [p.name for p in written]
        shown = ", ".join(names) if len(names) <= 2 else f"{names[0]} to {names[-1]}"
        print(f"videos written to {args.video}: {shown or 'none'}")
        if args.track or cfg.track:
            _track_videos(checkpoint, cfg, written, int(data["counters"]["global_step"]))
    if args.json:
        print(
            json.dumps(
                json_ready({
                    "env": env_id,
                    "episodes": args.episodes,
                    "mean_return": result.mean,
                    "std_return": result.std,
                    "min_return": float(result.returns.min()),
                    "max_return": float(result.returns.max()),
                    "success_rate": result.success_rate,
                    "mean_length": float(result.lengths.mean()),
                    "noise": args.noise,
                    "standard_error": result.standard_error,
                    "checkpoint": str(checkpoint),
                    "trained_steps": int(data["counters"]["global_step"]),
                    "episode_seeds": episodes,
                })
            )
        )
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from agent.export import FORMATS, ExportMismatch, require_format, write_verified
    from envs import make_env

    checkpoint, data = load_policy_file(args.export)
    suffixes = {suffix: name for name, suffix in FORMATS.items()}
    fmt = args.format or suffixes.get(Path(args.out or "").suffix, "onnx")
    require_format(fmt)  # a missing extra is reported before anything runs
    out = Path(args.out) if args.out else checkpoint.with_suffix(FORMATS[fmt])
    data, _, spec, env_options, q_network = load_policy(checkpoint, args.env, "cpu", data)
    env_id = spec.env_id
    env = make_env(env_id, **env_options)
    try:
        result = write_verified(q_network, env, out, fmt, obs_dtype=data["obs_dtype"])
    except ExportMismatch as e:
        # Not the user's mistake: the exporter or runtime computes another policy.
        print(
            f"error: the exported model does not match {checkpoint}: {e}; nothing written "
            "(please report this)",
            file=sys.stderr,
        )
        return EXIT_FAILED
    finally:
        env.close()
    print(f"wrote {out} ({fmt}), checked against {checkpoint} on {env_id}: {result.summary()}")
    return 0


def _track_videos(checkpoint: Path, cfg: Any, videos: list[Path], step: int) -> None:
    """Send ``--eval --video``'s mp4 files (``videos``, this evaluation's: not those the
    folder held before) to the W&B run of the checkpoint's run directory."""
    from agent.tracking import Tracker

    run_dir = checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else None
    if run_dir is None:
        _user_error(f"--track sends videos to the W&B run of a run directory, and {checkpoint} "
                    "is not in one (RUN_DIR/checkpoints/): drop --track")  # fmt: skip
    tracker = Tracker(run_dir, cfg.wandb_project, cfg.wandb_entity)
    try:
        tracker.videos(videos, step)
    finally:
        tracker.close()
    print(f"{len(videos)} video(s) sent to W&B run {tracker.run.id} ({cfg.wandb_project})")


def _user_error(message: str) -> NoReturn:
    from agent.errors import UserError

    raise UserError(message)


def _is_sweep(args: argparse.Namespace) -> bool:
    """--seeds, --grid, --ray-address or --retries, or --resume of a sweep directory."""
    if args.seeds is not None or args.grid or args.ray_address is not None:
        return True
    if args.retries is not None:
        return True
    from agent.sweep import is_sweep_dir

    return bool(args.resume) and is_sweep_dir(args.resume)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from agent.errors import UserError

    try:
        if args.list_config:
            return list_config()
        if args.export:
            return cmd_export(args)
        if _is_sweep(args):
            from agent.sweep import cmd_sweep

            return cmd_sweep(args)
        if args.resume:
            return cmd_resume(args)
        if args.eval:
            return cmd_eval(args)
        return cmd_train(args)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR


def _import_torch() -> None:
    """Import torch with the cyclic garbage collector paused, and freeze what it made.

    torch's import creates some 200k objects that live as long as the process; full
    collections during the import, and every one after it, would walk them all again
    to find nothing (docs/research/log.md has what this saves).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        import torch  # noqa: F401
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()


def entry() -> int:
    """The command line as a process runs it (``noisy-dqn``, ``python run.py``): torch
    imported with the collector paused, then :func:`main`."""
    if not {"-h", "--help", "--list-config"} & set(sys.argv):
        _import_torch()
    try:
        try:
            code = main()
        finally:
            sys.stdout.flush()  # a reader that left shows here, not at interpreter exit
    except BrokenPipeError:
        # The reader of our output has gone (`noisy-dqn --list-config | head -5`): stop
        # quietly, with the status of a process that SIGPIPE ended, as Unix tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    # The process ends here: the collections at interpreter shutdown would walk every
    # object made since (gymnasium, tensorboard, the run's own) for garbage nobody needs.
    gc.freeze()
    return code


if __name__ == "__main__":
    sys.exit(entry())
