"""S seeds in one process: ordinary runs stepped together, their networks stacked.

Each seed is a run as :func:`agent.train.train` builds it (:func:`~agent.train.prepare_run`):
its own environments, replay, episodes, exploration, counters, evaluation, TensorBoard
events, checkpoints and ``result.json``, in a run directory of its own. Only acting and
learning run on the stack (:class:`SeedStack`): one batched forward per step for every
seed's action, one batched update for every seed's gradient step.

Every random stream is the seed's own: its network's initialisation, its episodes, its
exploration and replay sampling (as in a single run), and its acting and update noise
(generators of the group's, :func:`stream_generator`). So no seed's run depends on which
other seeds share the process, or on when they stop.

The seeds' own networks, targets and learners are written from the stack
(:meth:`SeedStack.write_back`) before anything reads them (logging, evaluation,
checkpoints), so a seed's ``last.pt`` and ``best.pt`` are ordinary checkpoints that
``--eval``, ``--video`` and ``--export`` take as they are. ``last.pt`` also holds the
group's noise streams (``seed_group``), with which a group resumes exactly.

A seed that solves its env (early stop) or diverges leaves the stack, and the rest go on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from agent import streams
from agent.checkpoint import resume_exactness
from agent.config import Config
from agent.errors import UserError
from agent.learner import CapturedUpdate, Metrics, NonFiniteError
from agent.monitor import above_bars, warnings_above_bars
from agent.replay import FrameReplayBuffer, ReplayBuffer
from agent.replay.base import Batch
from agent.noisy import noise_switched
from agent.seeds.learner import SeedLearner, diverged
from agent.seeds.stacked import NoiseDraw, seed_state_dict, stack_networks, stacked_noisy_layers
from agent.setup import learner_autocast, update_capture
from agent.signals import StopSignals
from agent.values import greedy_actions, support_of
from agent.train import (
    Member,
    TrainResult,
    close_quietly,
    finish_run,
    learner_settings,
    prepare_run,
    run_outputs,
    train_loop,
)
from envs import inspect_env

__all__ = [
    "GROUP_KEY",
    "SeedStack",
    "check_groupable",
    "check_memory",
    "resume_groups",
    "stacked_greedy",
    "stream_generator",
    "train_group",
]

GROUP_KEY = "seed_group"
"""The key of ``last.pt`` that holds a seed's group-only state (its noise streams)."""

# A stacked seed's acting and update noise (agent/streams.py).
ACT_STREAM, UPDATE_STREAM = streams.GROUP_ACT, streams.GROUP_UPDATE


@torch.inference_mode()
def stacked_greedy(q_network: nn.Module, obs: np.ndarray, device: torch.device) -> np.ndarray:
    """A stacked network's greedy actions ``(S, n)`` for each seed's observations ``obs``
    ``(S, n, *obs_shape)``, under its noise as it stands (one forward, one host read)."""
    output = q_network(torch.from_numpy(obs).to(device))  # (S, n, A[, N])
    return greedy_actions(output, support_of(q_network)).cpu().numpy()


def stream_generator(seed: int, stream: int, device: torch.device) -> torch.Generator:
    """A torch generator for one of a seed's random streams, independent of every other
    seed's and stream's."""
    value = np.random.SeedSequence([seed, stream]).generate_state(2, dtype=np.uint32)
    return torch.Generator(device=device).manual_seed(int(value[0]) << 31 | int(value[1]) >> 1)


def check_groupable(cfgs: list[Config]) -> None:
    """A :class:`UserError` naming what keeps these configs from training as one group."""
    first = cfgs[0].to_dict()
    for cfg in cfgs[1:]:
        differ = [k for k, v in cfg.to_dict().items() if k != "seed" and v != first[k]]
        if differ:
            raise UserError(
                f"seeds of one group must share their config, but {differ[0]} differs: "
                "run them as separate groups"
            )
    if len({cfg.seed for cfg in cfgs}) != len(cfgs):
        raise UserError("a seed is listed twice: list each seed once")


def available_memory() -> int | None:
    """Bytes of memory available to a new allocation (Linux ``MemAvailable``), or None."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_memory(cfg: Config, obs_shape: tuple[int, ...], obs_dtype: str, seeds: int) -> None:
    """A :class:`UserError` when the seeds' replay buffers (one per seed, allocated up
    front) would not fit in the memory available, before anything is allocated."""
    # The buffer build_agent makes: one frame a transition for integer image stacks.
    frames = cfg.frame_replay and len(obs_shape) == 3 and obs_dtype == "uint8"
    buffer = FrameReplayBuffer if frames else ReplayBuffer
    each = buffer.storage_bytes(
        cfg.buffer_size, obs_shape, np.dtype(obs_dtype), getattr(torch, cfg.dtype)
    )
    free = available_memory()
    if free is not None and seeds * each > 0.9 * free:
        raise UserError(
            f"{seeds} seeds need {seeds * each / 2**30:.1f} GiB of replay "
            f"({each / 2**30:.2f} GiB each, buffer_size {cfg.buffer_size:,}) but "
            f"{free / 2**30:.1f} GiB is available: train fewer seeds at a time "
            "(--seeds 1-8, then --seeds 9-16) or --set buffer_size=N"
        )


@dataclass
class Seed(Member):
    """One seed of a group: its run, its outputs and its own noise streams."""

    act_generator: torch.Generator = dataclasses.field(kw_only=True)
    update_generator: torch.Generator = dataclasses.field(kw_only=True)

    def state_dict(self) -> dict[str, Any]:
        """The seed's own noise streams (``last.pt``'s ``GROUP_KEY``)."""
        return {
            "act_generator": self.act_generator.get_state(),
            "update_generator": self.update_generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.act_generator.set_state(state["act_generator"])
        self.update_generator.set_state(state["update_generator"])
        if "noise_step" in state:  # checkpoint version 1: the group kept the noise counter
            self.run.agent.exploration.noise.load_state_dict({"step": state["noise_step"]})


class SeedStack:
    """The stacked networks, learner and acting noise of the seeds still training: the
    loop's :class:`~agent.train.Learning` for a group.

    Built from the seeds' own networks and learners (so a stack can be rebuilt from them
    at any time: when a seed leaves, or on a resume); :meth:`write_back` puts the stack's
    state back into them.
    """

    def __init__(
        self, seeds: list[Seed], cfg: Config, carry: tuple[SeedLearner, list[int]] | None = None
    ) -> None:
        self.seeds, self.cfg = list(seeds), cfg
        agents = [s.run.agent for s in seeds]
        noisy = agents[0].exploration.noisy  # epsilon-greedy acts on the mean weights
        self.device = next(agents[0].q_network.parameters()).device
        # A GPU pays a launch per convolution call: one grouped call for all seeds there.
        grouped = self.device.type == "cuda"
        self.q_network = stack_networks([a.q_network for a in agents], noise=noisy,
                                        grouped_conv=grouped)  # fmt: skip
        self.target_network = stack_networks([a.target_network for a in agents],
                                             grouped_conv=grouped)  # fmt: skip
        self.target_network.requires_grad_(False)
        self.learner = SeedLearner(
            self.q_network, self.target_network, [s.update_generator for s in seeds],
            **learner_settings(cfg, noisy), autocast=learner_autocast(cfg),
        )  # fmt: skip
        self.learner.load_seed_states([a.learner.state_dict() for a in agents])
        if carry is not None:  # the loss sums since the last log, of the seeds kept
            self.learner.take_running(*carry)
        # On CUDA (capture_graph) the stacked update is one CUDA graph, the seeds' noise
        # streams registered with it; captured at its first batch, as a single run's.
        capture = update_capture(self.device, cfg.capture_graph)
        self._update = self.learner.update if capture is None else CapturedUpdate(
            self.learner, capture, generators=self.learner.generators)
        layers = stacked_noisy_layers(self.q_network)
        self._draw = NoiseDraw(layers) if noisy and layers else None
        self._layers = layers

    @property
    def updates(self) -> int:
        return self.learner.updates

    def act(self, obs: list[np.ndarray]) -> np.ndarray:
        """Greedy actions ``(S, n)`` for each seed's observations ``(n, *obs_shape)``;
        fresh noise is drawn for the seeds whose exploration policy asks for it."""
        fresh = np.array([s.run.agent.exploration.fresh_noise() for s in self.seeds])
        if self._draw is not None and fresh.any():
            which = None if fresh.all() else np.flatnonzero(fresh).tolist()
            self._draw([s.act_generator for s in self.seeds], seeds=which)
        return self._greedy(obs)

    def noise_free(self, obs: list[np.ndarray], actions: np.ndarray) -> np.ndarray:
        """Greedy actions ``(S, n)`` on the stack's mean weights (``actions`` themselves
        for epsilon-greedy, which acts on them)."""
        if self._draw is None:
            return actions
        with noise_switched(self._layers, False):
            return self._greedy(obs)

    def _greedy(self, obs: list[np.ndarray]) -> np.ndarray:
        return stacked_greedy(self.q_network, np.stack(obs), self.device)

    def update(self, batches: list[Batch]) -> None:
        """One gradient step per seed, seed ``i`` on ``batches[i]``; each seed's replay
        gets its per-sample errors (for its priorities, if it keeps any)."""
        errors = self._update(Batch.stack(batches))  # (S, B)
        for seed, batch, seed_errors in zip(self.seeds, batches, errors, strict=True):
            seed.run.agent.replay.update_priorities(batch.indices, seed_errors)

    def sync_target(self) -> None:
        self.learner.sync_target()

    def metrics(self) -> list[Metrics | NonFiniteError | None]:
        """Each seed's learner means since the last call; an error for each that diverged
        (the others go on)."""
        metrics = self.learner.metrics()
        if metrics is None:
            return [None] * len(self.seeds)
        bad = set(diverged(metrics))
        return [NonFiniteError(f"non-finite TD loss ({m.td_loss}) or Q ({m.q_values})")
                if i in bad else m for i, m in enumerate(metrics)]  # fmt: skip

    def without(self, kept: list[int]) -> SeedStack:
        """A stack of the seeds ``kept``, rebuilt from their written-back parts."""
        return SeedStack([self.seeds[i] for i in kept], self.cfg, carry=(self.learner, kept))

    @torch.no_grad()
    def write_back(self) -> None:
        """Each seed's own online and target network and learner from the stack: afterwards
        they hold what a single run of that seed would."""
        states = self.learner.seed_states()
        for i, seed in enumerate(self.seeds):
            agent = seed.run.agent
            agent.q_network.load_state_dict(seed_state_dict(self.q_network, i))
            agent.target_network.load_state_dict(seed_state_dict(self.target_network, i))
            agent.learner.load_state_dict(states[i])


def resume_groups(checkpoints: list[dict[str, Any] | None]) -> list[list[int]]:
    """Indices of ``checkpoints`` (None: a fresh start) by the env step they resume from:
    the seeds that can train as one group (seeds stopped together are at one step)."""
    steps: dict[int, list[int]] = {}
    for i, checkpoint in enumerate(checkpoints):
        step = 0 if checkpoint is None else int(checkpoint["counters"]["global_step"])
        steps.setdefault(step, []).append(i)
    return list(steps.values())


def train_group(
    cfgs: list[Config],
    run_dirs: list[Path],
    checkpoints: list[dict[str, Any] | None],
    *,
    progress: bool = True,
    echo: Callable[[str], Any] = print,
    on_done: Callable[[TrainResult], Any] | None = None,
) -> list[TrainResult | BaseException]:
    """Train one seed per config in this process, the networks stacked; each seed as
    :func:`agent.train.train` would write it to its run directory.

    ``checkpoints[i]``: seed ``i``'s ``last.pt`` to resume from, or None. Every seed must
    be at the same env step (seeds saved together are). Returns, per seed, its result or
    the error that ended it (a diverged network: the other seeds go on). ``on_done`` is
    called with each result as its seed ends.
    """
    check_groupable(cfgs)
    if cfgs[0].eval_vector == "async" and len(cfgs) > 1:
        raise UserError(
            f"eval_vector async: each of the {len(cfgs)} seeds would start "
            f"{cfgs[0].eval_envs} evaluation workers of its own: --set eval_vector=sync"
        )
    spec = inspect_env(cfgs[0].env_id, cfgs[0].env_kwargs, cfgs[0].wrappers)
    check_memory(cfgs[0], spec.obs_shape, spec.obs_dtype, len(cfgs))
    if len(resume_groups(checkpoints)) > 1:
        raise ValueError("the seeds of a group must resume from one env step (resume_groups)")
    wall_start = time.perf_counter()
    results: list[TrainResult | BaseException | None] = [None] * len(cfgs)
    with contextlib.ExitStack() as cleanup:
        seeds = [
            _prepare_seed(cfg, Path(run_dir), checkpoint, cleanup, wall_start)
            for cfg, run_dir, checkpoint in zip(cfgs, run_dirs, checkpoints, strict=True)
        ]
        index = {id(s): i for i, s in enumerate(seeds)}
        cfg = cfgs[0]
        where = Path(run_dirs[0]).parent
        echo(f"{len(seeds)} seeds in one process, networks stacked: run directories in {where}")
        echo(f"watch them with: tensorboard --logdir {where}")
        left_out = seeds[0].checkpoints.buffer_left_out  # one config: the same for every seed
        if left_out is not None:
            echo(f"each seed's checkpoints/last.pt is saved {left_out}")
        step = seeds[0].run.counters.global_step
        if step:
            how = resume_exactness(checkpoints[0] or {})
            echo(f"resuming {len(seeds)} seeds at step {step:,}, saved {how}")
        # Drawn below the lines above: a bar drawn first keeps its first frame with the
        # next line glued to it.
        bar = tqdm(
            total=cfg.total_steps, initial=step, unit="step",
            disable=not (progress and sys.stderr.isatty()), desc=f"{len(seeds)} seeds",
        )  # fmt: skip
        cleanup.callback(bar.close)
        cleanup.enter_context(warnings_above_bars())
        stop = cleanup.enter_context(StopSignals())

        def end(seed: Member, outcome: str | BaseException) -> None:
            assert isinstance(seed, Seed)
            result = _finish(seed, outcome, stop)
            results[index[id(seed)]] = result
            if on_done is not None and isinstance(result, TrainResult):
                above_bars(on_done)(result)  # its line for the seed goes above the bar

        # the loop of a single run, every seed a member; returns once every seed has ended
        train_loop(seeds, SeedStack(seeds, cfg), cfg, stop, end, bar)
    return [r for r in results if r is not None]


def _prepare_seed(
    cfg: Config,
    run_dir: Path,
    checkpoint: dict[str, Any] | None,
    cleanup: contextlib.ExitStack,
    wall_start: float,
) -> Seed:
    """One seed's ordinary run (a resume restores it), with the group's noise streams."""
    run = prepare_run(cfg, run_dir, checkpoint, cleanup, echo=lambda *_: None)
    device = run.agent.replay.device
    monitor, checkpoints, evaluate = run_outputs(run, wall_start, False, lambda: run.obs)
    seed = Seed(
        run, monitor, checkpoints, evaluate,
        act_generator=stream_generator(cfg.seed, ACT_STREAM, device),
        update_generator=stream_generator(cfg.seed, UPDATE_STREAM, device),
    )  # fmt: skip
    run.extra_components[GROUP_KEY] = seed  # its streams go into last.pt
    cleanup.callback(close_quietly, seed.monitor)
    if checkpoint is not None and GROUP_KEY in checkpoint:
        seed.load_state_dict(checkpoint[GROUP_KEY])
    return seed


def _finish(
    seed: Seed, outcome: str | BaseException, stop: StopSignals
) -> TrainResult | BaseException:
    """A seed's end as a single run's (``finish_run``), or its error recorded."""
    if isinstance(outcome, NonFiniteError):
        return _diverged(seed, outcome)
    if isinstance(outcome, BaseException):
        return outcome
    try:
        return finish_run(
            seed.run, seed.monitor, seed.checkpoints, seed.evaluate, seed.run.obs,
            outcome, stop, learner_backend="stacked",  # type: ignore[arg-type]
        )  # fmt: skip
    except NonFiniteError as e:  # diverged since the last log: no last.pt of NaNs
        return _diverged(seed, e)


def _diverged(seed: Seed, error: NonFiniteError) -> NonFiniteError:
    """A seed whose loss or parameters stopped being finite: the error goes to its
    ``error.txt`` (as a sweep records a failed trial); its ``last.pt`` stays the last good
    one, to resume from with other settings."""
    step = seed.run.counters.global_step
    with contextlib.suppress(OSError):
        (seed.run.run_dir / "error.txt").write_text(f"NonFiniteError: {error} (step {step})\n")
    return error
