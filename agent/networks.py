"""Q-networks: a torso named by a key (none for vectors, the MinAtar CNN, the Nature CNN or
data-efficient Rainbow's CNN), a (noisy) Q head, optional dueling, optionally distributional
(C51)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Literal

import torch
from torch import nn

from agent.distributional import make_support
from agent.noisy import NoisyLinear
from agent.noisy import noisy_layers as find_noisy_layers

__all__ = [
    "MIN_NATURE_SIZE",
    "TORSOS",
    "DataEfficientCNN",
    "MinAtarCNN",
    "NatureCNN",
    "QNetwork",
    "resolve_torso",
]

# The smallest frame the Nature CNN takes; smaller images get the MinAtar torso.
MIN_NATURE_SIZE = 36

NoisyLayers = Literal["all", "last", "none"]
DuelingStreams = Literal["hidden", "linear"]
Torso = Literal["auto", "mlp", "minatar", "nature", "der"]
TORSOS: tuple[str, ...] = ("auto", "mlp", "minatar", "nature", "der")


class NatureCNN(nn.Module):
    """The convolutional torso of Mnih et al. 2015 (DQN Nature paper).

    Takes ``(B, C, H, W)`` in the parameters' dtype, already scaled (:class:`QNetwork`
    divides 0-255 frames by its ``input_scale`` before the torso).
    """

    def __init__(
        self,
        in_channels: int,
        height: int,
        width: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.convs = nn.Sequential(
            nn.Conv2d(in_channels, 32, kernel_size=8, stride=4, **factory),
            nn.ReLU(),
            nn.Conv2d(32, 64, kernel_size=4, stride=2, **factory),
            nn.ReLU(),
            nn.Conv2d(64, 64, kernel_size=3, stride=1, **factory),
            nn.ReLU(),
            nn.Flatten(),
        )

        def out_size(size: int, kernel: int, stride: int) -> int:
            return (size - kernel) // stride + 1

        h = out_size(out_size(out_size(height, 8, 4), 4, 2), 3, 1)
        w = out_size(out_size(out_size(width, 8, 4), 4, 2), 3, 1)
        if h <= 0 or w <= 0:
            raise ValueError(
                f"NatureCNN needs frames of at least 36x36, got {height}x{width}"
            )
        self.out_features = 64 * h * w

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.convs(x)


class MinAtarCNN(nn.Module):
    """The torso of MinAtar's DQN (Young & Tian 2019): one 3x3 convolution, 16 filters, ReLU.

    For small images such as MinAtar's 10x10 grids of binary channels. Takes
    ``(B, C, H, W)`` in the parameters' dtype (``QNetwork`` casts; no scaling: the
    observation adapter gives values in [0, 1]).
    """

    def __init__(
        self,
        in_channels: int,
        height: int,
        width: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if height < 3 or width < 3:
            raise ValueError(f"MinAtarCNN needs images of at least 3x3, got {height}x{width}")
        self.conv = nn.Conv2d(in_channels, 16, kernel_size=3, stride=1, device=device, dtype=dtype)
        self.relu = nn.ReLU()
        self.flatten = nn.Flatten()
        self.out_features = 16 * (height - 2) * (width - 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.flatten(self.relu(self.conv(x)))


class DataEfficientCNN(nn.Module):
    """The torso of data-efficient Rainbow (van Hasselt et al. 2019, "When to use parametric
    models in reinforcement learning?"): 32 filters 5x5 stride 5, then 64 filters 5x5
    stride 5, ReLU after each, no padding: 576 features from 84x84 frames.

    Each convolution's stride equals its kernel, so it reads disjoint patches. Takes
    ``(B, C, H, W)`` in the parameters' dtype, already scaled (:class:`QNetwork` divides
    0-255 frames by its ``input_scale`` before the torso).
    """

    KERNEL = 5

    def __init__(
        self,
        in_channels: int,
        height: int,
        width: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        k = self.KERNEL
        h, w = height // k // k, width // k // k
        if h <= 0 or w <= 0:
            raise ValueError(f"DataEfficientCNN needs frames of at least {k * k}x{k * k}, "
                             f"got {height}x{width}")  # fmt: skip
        factory = {"device": device, "dtype": dtype}
        self.convs = nn.Sequential(
            nn.Conv2d(in_channels, 32, kernel_size=k, stride=k, **factory),
            nn.ReLU(),
            nn.Conv2d(32, 64, kernel_size=k, stride=k, **factory),
            nn.ReLU(),
            nn.Flatten(),
        )
        self.out_features = 64 * h * w

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.convs(x)


# The least image (H, W) each convolutional torso takes.
_MIN_IMAGE = {"minatar": 3, "nature": MIN_NATURE_SIZE, "der": DataEfficientCNN.KERNEL**2}


def resolve_torso(obs_shape: Sequence[int], torso: str = "auto") -> str:
    """The torso ``torso`` names for observations of ``obs_shape``: ``auto`` picks by shape
    (``mlp`` for vectors, ``minatar`` for images under 36x36, ``nature`` otherwise).
    ``ValueError`` for a torso that does not fit the observations, naming one that does."""
    shape = tuple(int(s) for s in obs_shape)
    if torso not in TORSOS:
        raise ValueError(f"torso must be one of {', '.join(TORSOS)}, got {torso!r}")
    if len(shape) not in (1, 3):
        raise ValueError(
            f"observations must be vectors (D,) or images (C, H, W), got shape {shape}"
        )
    image = len(shape) == 3
    if torso == "auto":
        if not image:
            return "mlp"
        return "minatar" if min(shape[1:]) < MIN_NATURE_SIZE else "nature"
    if torso == "mlp":
        if not image:
            return torso
        what = "vector observations"
    else:
        least = _MIN_IMAGE[torso]
        if image and min(shape[1:]) >= least:
            return torso
        what = f"images of at least {least}x{least}"
    raise ValueError(
        f"torso {torso} takes {what}, and the observations have shape {shape}: "
        "torso=auto picks one that fits them"
    )


def _linear(
    in_features: int,
    out_features: int,
    noisy: bool,
    sigma0: float,
    factory: dict,
) -> nn.Module:
    if noisy:
        return NoisyLinear(in_features, out_features, sigma0, **factory)
    return nn.Linear(in_features, out_features, **factory)


def _mlp(
    sizes: Sequence[int], noisy: Sequence[bool], sigma0: float, factory: dict
) -> nn.Sequential:
    """Linear layers between consecutive ``sizes``, ReLU after every one but the last."""
    layers: list[nn.Module] = []
    for i, (n_in, n_out) in enumerate(itertools.pairwise(sizes)):
        layers.append(_linear(n_in, n_out, noisy[i], sigma0, factory))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class QNetwork(nn.Module):
    """Action values Q(s, .) for a discrete action space.

    Args:
        obs_shape: shape of one observation: a vector ``(D,)`` or images ``(C, H, W)``.
        n_actions: number of discrete actions.
        hidden_sizes: widths of the hidden linear layers of the head (after the
            torso, if any). With ``dueling`` and ``dueling_streams="hidden"``, the last
            width is the hidden layer of each stream and the others are shared.
        noisy_layers: which linear layers are NoisyLinear: ``"all"`` (every
            linear layer of the head, as in NoisyNet-DQN), ``"last"`` (only the
            output layer of each stream), or ``"none"`` (plain DQN, for
            epsilon-greedy baselines). Convolutions are never noisy.
        sigma0: initial noise scale of the NoisyLinear layers.
        dueling: value and advantage streams, Q = V + A - mean(A)
            (Wang et al. 2016).
        dueling_streams: ``"hidden"``: each stream has a hidden layer of its own (the
            last of ``hidden_sizes``), as in Wang et al. 2016 and Rainbow. ``"linear"``:
            every hidden layer is shared and each stream is one linear layer over the
            last (over the torso's features when there is none, as in Revisiting
            Rainbow's MinAtar network); the head then costs little more than a plain one.
        num_atoms: 1 for action values; N >= 2 for a C51 head (Bellemare et al. 2017):
            logits over N atoms evenly spaced in ``[v_min, v_max]`` for every action,
            the dueling streams combined per atom as Rainbow combines them.
        v_min, v_max: the support of a C51 head (:attr:`support`).
        torso: the layers before the head (:func:`resolve_torso`): ``"auto"`` picks by
            ``obs_shape`` (none for vectors, the MinAtar CNN for images under 36x36, the
            Nature CNN otherwise); ``"mlp"`` (vectors), ``"minatar"``
            (:class:`MinAtarCNN`), ``"nature"`` (:class:`NatureCNN`) or ``"der"``
            (:class:`DataEfficientCNN`).
        input_scale: the observations are divided by it (after the cast to the
            parameters' dtype) before the torso: 255 for 0-255 frames (uint8), which a
            convolutional torso refuses without one; None: taken as they come. The one
            place observations are scaled (:func:`agent.train.build_q_network` sets it
            from the observations' dtype).
        device, dtype: where and in which precision the parameters live.

    ``forward`` gives Q values ``(B, n_actions)``, or with ``num_atoms`` N the logits
    ``(B, n_actions, N)``; :func:`agent.values.q_values` turns either into action values.
    """

    def __init__(
        self,
        obs_shape: Sequence[int],
        n_actions: int,
        hidden_sizes: Sequence[int] = (64, 64),
        *,
        noisy_layers: NoisyLayers = "all",
        sigma0: float = 0.5,
        dueling: bool = False,
        dueling_streams: DuelingStreams = "hidden",
        num_atoms: int = 1,
        v_min: float = -10.0,
        v_max: float = 10.0,
        torso: Torso = "auto",
        input_scale: float | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        obs_shape = tuple(int(s) for s in obs_shape)
        self.torso_name = resolve_torso(obs_shape, torso)
        hidden_sizes = [int(h) for h in hidden_sizes]
        if n_actions < 1:
            raise ValueError(f"n_actions must be >= 1, got {n_actions}")
        if noisy_layers not in ("all", "last", "none"):
            raise ValueError(f"noisy_layers must be 'all', 'last' or 'none', got {noisy_layers!r}")
        if any(h < 1 for h in hidden_sizes):
            raise ValueError(f"hidden sizes must be positive, got {hidden_sizes}")
        if dueling_streams not in ("hidden", "linear"):
            raise ValueError(
                f"dueling_streams must be 'hidden' or 'linear', got {dueling_streams!r}"
            )
        if dueling and dueling_streams == "hidden" and not hidden_sizes:
            raise ValueError(
                "a dueling head with a hidden layer per stream needs at least one hidden layer"
                " (or dueling_streams='linear')"
            )
        if num_atoms < 1:
            raise ValueError(f"num_atoms must be 1 (action values) or >= 2 (C51), got {num_atoms}")
        factory = {"device": device, "dtype": dtype}
        self.obs_shape = obs_shape
        self.n_actions = int(n_actions)
        self.dueling = bool(dueling)
        self.num_atoms = int(num_atoms)
        # The atoms of a C51 head, None for action values. Not persistent: rebuilt from
        # the constructor's arguments, so a state dict holds the parameters only (and a
        # seed's slice of a stacked one stays whole).
        support = make_support(v_min, v_max, self.num_atoms, **factory) if num_atoms > 1 else None
        self.register_buffer("support", support, persistent=False)
        outputs = self.n_actions * self.num_atoms  # per atom: one output per action and atom

        if input_scale is not None and not input_scale > 0:
            raise ValueError(f"input_scale must be > 0 or None, got {input_scale}")
        self.input_scale = None if input_scale is None else float(input_scale)
        if self.torso_name == "mlp":
            self.torso: nn.Module = nn.Identity()
            features = obs_shape[0]
        else:
            cnn = {"minatar": MinAtarCNN, "nature": NatureCNN, "der": DataEfficientCNN}
            self.torso = cnn[self.torso_name](*obs_shape, **factory)
            features = self.torso.out_features

        def noisy_flags(n_layers: int) -> list[bool]:
            if noisy_layers == "all":
                return [True] * n_layers
            if noisy_layers == "last":
                return [False] * (n_layers - 1) + [True]
            return [False] * n_layers

        if not self.dueling:
            sizes = [features, *hidden_sizes, outputs]
            self.head = _mlp(sizes, noisy_flags(len(sizes) - 1), sigma0, factory)
        else:
            # Each stream's layers: its own hidden layer and output, or the output alone.
            stream = [hidden_sizes[-1]] if dueling_streams == "hidden" else []
            shared = [features, *hidden_sizes[: len(hidden_sizes) - len(stream)]]
            shared_flags = [noisy_layers == "all"] * (len(shared) - 1)
            self.head = _mlp(shared, shared_flags, sigma0, factory)
            if len(shared) > 1:
                self.head.append(nn.ReLU())
            flags = noisy_flags(len(stream) + 1)
            self.value = _mlp([shared[-1], *stream, self.num_atoms], flags, sigma0, factory)
            self.advantage = _mlp([shared[-1], *stream, outputs], flags, sigma0, factory)
        # Cached at construction (found by type): resetting noise is on the hot path.
        self._noisy = find_noisy_layers(self)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """``obs``: ``(B, *obs_shape)`` on the network's device -> Q values ``(B, n_actions)``,
        or C51 logits ``(B, n_actions, num_atoms)``. Leading axes before ``B`` pass through
        (a stacked network's seed axis)."""
        if (
            isinstance(obs, torch.Tensor)  # not a traced proxy: its dtype is known
            and obs.dtype == torch.uint8
            and self.input_scale is None
            and self.torso_name != "mlp"
        ):
            raise ValueError(
                "uint8 frames into a convolutional torso need input_scale=255 (QNetwork("
                "..., input_scale=255.0)), or the torso would see 0-255 values"
            )
        obs = obs.to(dtype=self._param_dtype())
        if self.input_scale is not None:  # the one place observations are scaled
            obs = obs / self.input_scale
        x = self.head(self.torso(obs))
        if self.num_atoms == 1:
            if not self.dueling:
                return x
            value = self.value(x)  # (B, 1)
            advantage = self.advantage(x)  # (B, n_actions)
            return value + advantage - advantage.mean(dim=-1, keepdim=True)
        if not self.dueling:
            return x.unflatten(-1, (self.n_actions, self.num_atoms))
        value = self.value(x).unflatten(-1, (1, self.num_atoms))  # (B, 1, N)
        advantage = self.advantage(x).unflatten(-1, (self.n_actions, self.num_atoms))
        return value + advantage - advantage.mean(dim=-2, keepdim=True)

    def _param_dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    @torch.no_grad()
    def reset_noise(self, generator: torch.Generator | None = None) -> None:
        """Resample the noise of every NoisyLinear of the network (a no-op without any)."""
        for layer in self._noisy:
            layer.reset_noise(generator)

    @property
    def is_noisy(self) -> bool:
        return bool(self._noisy)

    def refresh_noisy_layers(self) -> None:
        """Look up the NoisyLinear layers again, after layers were replaced in place
        (a copy whose noisy layers were folded into plain or stacked ones)."""
        self._noisy = find_noisy_layers(self)
