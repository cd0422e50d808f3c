"""TensorBoard events and the progress bar: the only place tensors become floats."""

from __future__ import annotations

import contextlib
import math
import sys
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import nn
from tqdm import tqdm

from agent.noisy import NoiseBuffers, noise_disabled, noise_switched, noisy_layers
from agent.values import greedy_actions, q_values, support_of

if TYPE_CHECKING:
    from agent.replay import Replay

T = TypeVar("T")

__all__ = [
    "Monitor",
    "above_bars",
    "action_disagreement",
    "exploration_probe",
    "exploration_stats",
    "noise_stats",
    "q_gap",
    "warnings_above_bars",
]

# Replay states behind the exploration/* scalars, drawn at each log (batch_size at a time).
PROBE_STATES = 256


@torch.no_grad()
def noise_stats(q_network: nn.Module) -> dict[str, float]:
    """Per noisy layer: mean |sigma| and mean|mu| / mean|sigma| (the exploration signal).

    A ratio that grows means the network is learning to ignore its noise there.
    """
    names = {id(m): n for n, m in q_network.named_modules()}
    stats: dict[str, torch.Tensor] = {}
    for layer in noisy_layers(q_network):
        name = names[id(layer)]
        mu = torch.cat([layer.weight_mu.abs().flatten(), layer.bias_mu.abs()]).mean()
        sigma = torch.cat([layer.weight_sigma.abs().flatten(), layer.bias_sigma.abs()]).mean()
        stats[f"noise/{name}/sigma_mean"] = sigma
        stats[f"noise/{name}/mu_sigma_ratio"] = mu / sigma
    if not stats:
        return {}
    values = torch.stack(list(stats.values())).tolist()  # one host read for all layers
    return dict(zip(stats, values, strict=True))


def _device(q_network: nn.Module) -> torch.device:
    return next(q_network.parameters()).device


def _noise_free_q(q_network: nn.Module, obs: torch.Tensor) -> torch.Tensor:
    with noise_disabled(q_network):
        return q_values(q_network(obs.to(_device(q_network))), support_of(q_network))


def _top_two_gap(q: torch.Tensor) -> torch.Tensor:
    if q.shape[1] < 2:
        return q.new_zeros(())
    top = q.topk(2, dim=1).values
    return (top[:, 0] - top[:, 1]).mean()


def _noisy_greedy(
    q_network: nn.Module, obs: torch.Tensor, draws: int, generator: torch.Generator | None
) -> torch.Tensor:
    """Greedy actions under fresh noise, one sample per chunk, drawn into buffers of its
    own: the layers' noise (the acting noise) is never written."""
    layers = noisy_layers(q_network)
    obs = obs.to(_device(q_network))
    noise = NoiseBuffers(q_network, layers)
    with noise_switched(layers, True):
        actions = []
        for chunk in obs.chunk(max(1, draws)):
            noise.draw(generator)
            actions.append(greedy_actions(noise.forward(chunk), support_of(q_network)))
        return torch.cat(actions)


@torch.no_grad()
def action_disagreement(
    q_network: nn.Module,
    obs: torch.Tensor,
    *,
    draws: int = 1,
    generator: torch.Generator | None = None,
) -> float:
    """Fraction of the states ``obs`` where a fresh noise sample changes the greedy action.

    Compares argmax Q with the noise off (mean weights) and argmax Q under newly drawn
    noise. ``obs`` is split into ``draws`` chunks, each under its own noise sample (a
    noise sample is shared by a whole batch, so one draw for all states would make the
    fraction swing with that one draw). The noise is drawn from ``generator`` (on the
    network's device; ``None`` uses the device's default generator), and every noisy
    layer's noise buffers and on/off switch are restored afterwards, in place (same
    addresses), so acting, learning and a resumed run see exactly what they would have
    without this call. A network without noisy layers gives 0.0.

    About 1 - 1/n_actions when the noise swamps the action values; near 0 when the noise
    no longer changes what the agent does.
    """
    if not noisy_layers(q_network):
        return 0.0
    greedy = _noise_free_q(q_network, obs).argmax(dim=-1)
    noisy = _noisy_greedy(q_network, obs, draws, generator)
    return (noisy != greedy).float().mean().item()


@torch.no_grad()
def q_gap(q_network: nn.Module, obs: torch.Tensor) -> float:
    """Mean gap between the best and second-best noise-free action values over ``obs``.

    What the noise has to overcome to change an action: a gap that grows while the
    noise scale (``noise/*/sigma_mean``) shrinks means exploration is ending.
    """
    return _top_two_gap(_noise_free_q(q_network, obs)).item()


@torch.no_grad()
def exploration_stats(
    q_network: nn.Module, obs: torch.Tensor, *, draws: int, seed: int, noisy: bool = True
) -> dict[str, float]:
    """``exploration/q_gap`` and (when ``noisy``) ``exploration/action_disagreement`` over ``obs``.

    One noise-free forward serves both, and one host read returns them. The noise comes
    from a generator of its own, seeded with ``seed``, on the network's device: no RNG
    stream of training is touched.
    """
    q = _noise_free_q(q_network, obs)
    stats = {"exploration/q_gap": _top_two_gap(q).float()}
    if noisy and noisy_layers(q_network):
        generator = torch.Generator(device=_device(q_network)).manual_seed(seed)
        changed = _noisy_greedy(q_network, obs, draws, generator) != q.argmax(dim=-1)
        stats["exploration/action_disagreement"] = changed.float().mean()
    values = torch.stack(list(stats.values())).tolist()
    return dict(zip(stats, values, strict=True))


def exploration_probe(
    q_network: nn.Module, replay: Replay, batch_size: int, seed: int, noisy: bool
) -> dict[str, float]:
    """:func:`exploration_stats` over ``PROBE_STATES`` states drawn from ``replay``.

    Generators of its own, seeded with ``seed``: no training RNG stream moves. Samples
    of ``batch_size``, the size the pinned staging slots were made for.
    """
    generator = torch.Generator(device=replay.generator_device).manual_seed(seed)
    draws = max(1, PROBE_STATES // batch_size)
    obs = torch.cat([replay.sample(batch_size, generator).obs for _ in range(draws)])
    return exploration_stats(q_network, obs, draws=draws, seed=seed, noisy=noisy)


@contextlib.contextmanager
def warnings_above_bars() -> Iterator[None]:
    """While it holds, a Python warning (an env's deprecation, the learner's note that
    its update runs eagerly) lifts the progress bars off the terminal, is written, and
    the bars are drawn again below it, instead of landing on a bar's line."""
    show = warnings.showwarning

    def shown(*args: Any, **kwargs: Any) -> None:
        with tqdm.external_write_mode(file=sys.stderr):
            show(*args, **kwargs)

    warnings.showwarning = shown
    try:
        yield
    finally:
        warnings.showwarning = show


def above_bars(write: Callable[[T], Any]) -> Callable[[T], None]:
    """``write`` for what may print while a progress bar is on screen (the learner's news
    at its first update, a seed's line as it ends): the bars are lifted off the terminal,
    ``write`` runs, and the bars are drawn again below. Without a bar, ``write`` as it is."""

    def lifted(item: T) -> None:
        with tqdm.external_write_mode():
            write(item)

    return lifted


class Monitor:
    """Writes scalars to TensorBoard and drives a tqdm progress bar.

    Args:
        run_dir: where the event files go.
        total_steps: length of the bar.
        initial_step: the step a resumed run starts from: where the bar starts, and the
            events logged past it before the run was resumed are hidden.
        progress: show the bar (only when stderr is a terminal, unless forced).
        tracker: a second logger that gets every scalar and the results too
            (:class:`~agent.tracking.Tracker`, ``--track``), or None.
    """

    def __init__(
        self,
        run_dir: Path,
        total_steps: int,
        initial_step: int = 0,
        progress: bool = True,
        tracker: Any = None,
    ) -> None:
        # Imported here: tensorboard costs ~1 s of start-up that evaluation does not need.
        from torch.utils.tensorboard import SummaryWriter

        # A resumed run hides what the run it resumes logged after its checkpoint (a run
        # killed outright logs past its last.pt): TensorBoard purges steps >= purge_step.
        purge_step = initial_step + 1 if initial_step else None
        self.writer = SummaryWriter(str(run_dir), purge_step=purge_step)
        self.recent_returns: deque[float] = deque(maxlen=20)
        self.bar: tqdm | None = None
        """The progress bar, once :meth:`start_progress` drew it (None before, or where
        there is none)."""
        self._bar_span = (total_steps, initial_step)
        self._show_bar = progress and sys.stderr.isatty()
        self._while_shown = contextlib.ExitStack()  # what holds while the bar is on screen
        self._bar_step = initial_step
        self._sps_time = time.perf_counter()
        self._sps_step = initial_step
        self.tracker = tracker

    def episode(self, step: int, episodic_return: float, length: int) -> None:
        self.scalars(step, {"charts/episodic_return": episodic_return,
                            "charts/episodic_length": length})  # fmt: skip
        self.recent_returns.append(episodic_return)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)
        if self.tracker is not None:
            self.tracker.log(step, values)

    def sps(self, step: int) -> float:
        """Environment steps per second since the previous call, logged as charts/SPS."""
        now = time.perf_counter()
        sps = (step - self._sps_step) / max(now - self._sps_time, 1e-9)
        self._sps_time, self._sps_step = now, step
        self.scalars(step, {"charts/SPS": sps})
        return sps

    def start_progress(self) -> None:
        """Draw the progress bar (where it shows), below the lines printed before: a bar
        drawn first would keep its first frame there with the next line glued to it.
        Until :meth:`close`, Python warnings are written above it, not onto its line."""
        if self._show_bar and self.bar is None:
            total, initial = self._bar_span
            self.bar = tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True,
                            smoothing=0.05)  # fmt: skip
            self._while_shown.enter_context(warnings_above_bars())

    def progress(self, step: int, **postfix: Any) -> None:
        if not self._show_bar:
            return
        self.start_progress()
        assert self.bar is not None
        self.bar.update(step - self._bar_step)
        self._bar_step = step
        if self.recent_returns:
            postfix["return"] = f"{sum(self.recent_returns) / len(self.recent_returns):.1f}"
        self.bar.set_postfix(postfix, refresh=False)

    def hparams(self, config: dict[str, Any], results: dict[str, float]) -> None:
        """Hyperparameters with the run's results (TensorBoard's HPARAMS tab), whose values
        it reads from the run's own scalars of those tags (logged at their steps).

        Written into the run's events file: ``add_hparams`` would open a second one and log
        each result again at step 0."""
        from torch.utils.tensorboard.summary import hparams

        flat = {
            k: (v if isinstance(v, (int, float, str, bool)) else str(v))
            for k, v in config.items()
        }
        clean = {k: v for k, v in results.items() if isinstance(v, float) and math.isfinite(v)}
        for summary in hparams(flat, clean):
            self.writer.file_writer.add_summary(summary)
        if self.tracker is not None:
            self.tracker.summary(clean)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        self._while_shown.close()
        self.writer.flush()
        self.writer.close()
        if self.tracker is not None:
            self.tracker.close()
