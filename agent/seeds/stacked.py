"""Networks of many seeds as one: every linear layer stacked along a leading seed axis.

S networks of one architecture become one module whose parameters have a leading
dimension S; a forward takes ``(S, B, *obs_shape)`` and gives ``(S, B, n_actions)``,
seed ``i``'s rows computed by seed ``i``'s weights alone (batched matmuls: one kernel
call per layer for all seeds, where S separate networks would pay PyTorch's fixed
cost per op S times). Parameter names are those of the single network, so seed ``i``'s
state dict is every tensor's ``[i]`` (:func:`seed_state_dict`) and loads into a
plain :class:`~agent.networks.QNetwork`.

What stacks: networks whose layers are ``nn.Linear``, :class:`~agent.noisy.NoisyLinear`,
``nn.Conv2d`` and ``nn.Flatten`` between elementwise activations, with no op that mixes
rows: ``QNetwork``'s MLPs, dueling and C51 heads included, and its convolutional torsos
(MinAtar, Nature, data-efficient Rainbow's), ``(S, B, C, H, W)`` in.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from agent.networks import QNetwork
from agent.noisy import NoisyLinear, noisy_parameter, signed_sqrt_, store_factors

__all__ = [
    "NoiseDraw",
    "StackedConv2d",
    "StackedLinear",
    "StackedNoisyLinear",
    "seed_state_dict",
    "stack_networks",
    "stacked_affine",
    "stacked_noisy_layers",
    "with_own_noise",
]


def stacked_affine(bias: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ weight^T + bias`` per seed: ``(S, B, in)``, ``(S, out, in)``, ``(S, out)`` ->
    ``(S, B, out)``, each seed's rows the same to the bit whatever S is.

    A batched matmul with one row (acting, one env per seed) or one column (a dueling
    value stream) goes down a matrix-vector path whose rounding depends on the number of
    seeds; such an operand is doubled for the product and cut back after.
    """
    rows, outs = x.shape[-2], weight.shape[-2]
    if rows == 1:
        x = torch.cat([x, x], dim=-2)
    weight_t = weight.transpose(1, 2)  # (S, in, out)
    if outs == 1:
        weight_t = torch.cat([weight_t, weight_t], dim=-1)
        bias = torch.cat([bias, bias], dim=-1)
    out = torch.baddbmm(bias.unsqueeze(1), x, weight_t)
    return out if rows > 1 and outs > 1 else out[:, :rows, :outs]


class StackedLinear(nn.Module):
    """S ``nn.Linear`` layers, one per seed: ``(S, B, in) -> (S, B, out)``."""

    def __init__(self, layers: list[nn.Linear]) -> None:
        super().__init__()
        first = layers[0]
        self.seeds = len(layers)
        self.in_features, self.out_features = first.in_features, first.out_features
        self.weight = nn.Parameter(torch.stack([lay.weight.detach() for lay in layers]))
        if first.bias is None:
            raise ValueError("StackedLinear needs layers with a bias")
        self.bias = nn.Parameter(torch.stack([lay.bias.detach() for lay in layers]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return stacked_affine(self.bias, x, self.weight)


class StackedNoisyLinear(nn.Module):
    """S ``NoisyLinear`` layers, one per seed, each with noise of its own.

    ``epsilon`` is ``(S, in + out)`` (f(eps_in), then f(eps_out), as in ``NoisyLinear``)
    and ``weight_epsilon`` ``(S, out, in)``; :class:`NoiseDraw` fills them, seed by
    seed from each seed's generator. ``noise``: forward with the noisy weights (False:
    the mean weights, as epsilon-greedy acts).
    """

    def __init__(self, layers: list[NoisyLinear], noise: bool = True) -> None:
        super().__init__()
        first = layers[0]
        self.seeds = len(layers)
        self.in_features, self.out_features = first.in_features, first.out_features
        self.noise_enabled = noise
        for name in ("weight_mu", "weight_sigma", "bias_mu", "bias_sigma"):
            stacked = torch.stack([getattr(lay, name).detach() for lay in layers])
            setattr(self, name, nn.Parameter(stacked))
        self.register_buffer("epsilon", torch.stack([lay.epsilon for lay in layers]))
        self.register_buffer("weight_epsilon", torch.stack([lay.weight_epsilon for lay in layers]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.noise_enabled:
            return stacked_affine(self.bias_mu, x, self.weight_mu)
        # NoisyLinear's formula, per seed: (S, out, in) and (S, out)
        weight = noisy_parameter(self.weight_mu, self.weight_sigma, self.weight_epsilon)
        bias = noisy_parameter(self.bias_mu, self.bias_sigma, self.epsilon[:, self.in_features :])
        return stacked_affine(bias, x, weight)


class StackedConv2d(nn.Module):
    """S ``nn.Conv2d`` layers, one per seed: ``(S, B, C, H, W) -> (S, B, O, H', W')``;
    ``weight`` ``(S, O, C, kh, kw)``, ``bias`` ``(S, O)`` (or None, as the layers').

    ``grouped`` False: one convolution call per seed, the call the seed's single network
    makes, so the same kernels (bitwise in tests/test_seeds_images.py). On a CPU a grouped
    call's weight gradient sums in another order (relative 1e-6 to 5e-6 in fp32 for the
    first layers of the DER and Nature torsos). ``grouped`` True: one call for all seeds,
    the seeds as groups (``groups=S``, what ``torch.func.vmap`` of a convolution becomes):
    on a GPU, one kernel launch per layer in place of S.
    """

    def __init__(self, layers: list[nn.Conv2d], grouped: bool = False) -> None:
        super().__init__()
        first = layers[0]
        if first.padding_mode != "zeros" or isinstance(first.padding, str):
            raise ValueError("StackedConv2d stacks convolutions with numeric zero padding only")
        self.seeds = len(layers)
        self.grouped = grouped
        self.in_channels, self.out_channels = first.in_channels, first.out_channels
        self.stride, self.padding = first.stride, first.padding
        self.dilation, self.groups = first.dilation, first.groups
        self.weight = nn.Parameter(torch.stack([lay.weight.detach() for lay in layers]))
        if first.bias is None:
            self.register_parameter("bias", None)
        else:
            self.bias = nn.Parameter(torch.stack([lay.bias.detach() for lay in layers]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.grouped:
            return self._grouped(x)
        biases = [None] * self.seeds if self.bias is None else self.bias.unbind(0)
        outs = [
            F.conv2d(xi, wi, bi, self.stride, self.padding, self.dilation, self.groups)
            for xi, wi, bi in zip(x.unbind(0), self.weight.unbind(0), biases, strict=True)
        ]
        return torch.stack(outs)

    def _grouped(self, x: torch.Tensor) -> torch.Tensor:
        # Seed s's channels are groups s*g .. s*g + g - 1 of one convolution (g: the layers'
        # own groups), its filters the matching slice of the outputs.
        seeds, batch = x.shape[0], x.shape[1]
        x = x.transpose(0, 1).reshape(batch, seeds * self.in_channels, *x.shape[3:])
        weight = self.weight.reshape(seeds * self.out_channels, *self.weight.shape[2:])
        bias = None if self.bias is None else self.bias.reshape(-1)
        y = F.conv2d(x, weight, bias, self.stride, self.padding, self.dilation,
                     seeds * self.groups)  # fmt: skip
        return y.reshape(batch, seeds, self.out_channels, *y.shape[2:]).transpose(0, 1)


def _seed_flatten(flatten: nn.Flatten) -> nn.Flatten:
    """``flatten`` for input with a seed axis in front: its dims one further on."""
    start, end = flatten.start_dim, flatten.end_dim
    return nn.Flatten(start + 1 if start >= 0 else start, end + 1 if end >= 0 else end)


def stacked_noisy_layers(module: nn.Module) -> list[StackedNoisyLinear]:
    """Every :class:`StackedNoisyLinear` inside ``module``, in order."""
    return [m for m in module.modules() if isinstance(m, StackedNoisyLinear)]


def stack_networks(
    networks: list[nn.Module], *, noise: bool = True, grouped_conv: bool = False
) -> nn.Module:
    """One module computing ``networks[i]`` on input row block ``i``, for every ``i``;
    ``noise``: its noisy layers forward with noise (False: with their mean weights);
    ``grouped_conv``: each convolution one grouped call for all seeds (a GPU's choice,
    :class:`StackedConv2d`), else a call per seed.

    The networks must share one architecture. Their linear and convolution layers are
    replaced by stacked ones holding copies of their parameters and noise, and flattens
    by ones that keep the seed axis; everything else is the first network's (so its
    forward must keep the seed axis apart: elementwise ops, reductions over trailing
    dimensions). Raises ``ValueError`` for anything else.
    """
    if not networks:
        raise ValueError("stack_networks needs at least one network")
    names = [name for name, _ in networks[0].named_parameters()]
    for net in networks[1:]:
        if [name for name, _ in net.named_parameters()] != names:
            raise ValueError("stack_networks needs networks of one architecture")
    stacked = copy.deepcopy(networks[0])
    modules = [dict(net.named_modules()) for net in networks]
    for name, module in list(stacked.named_modules()):
        if not name:
            continue
        if isinstance(module, NoisyLinear):
            replacement: nn.Module = StackedNoisyLinear([m[name] for m in modules], noise)
        elif type(module) is nn.Linear:
            replacement = StackedLinear([m[name] for m in modules])
        elif type(module) is nn.Conv2d:
            replacement = StackedConv2d([m[name] for m in modules], grouped_conv)
        elif type(module) is nn.Flatten:
            replacement = _seed_flatten(module)
        elif any(p is not None for p in module.parameters(recurse=False)) or isinstance(
            module, (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Flatten, nn.Unflatten)
        ):
            raise ValueError(
                "stack_networks stacks linear and Conv2d layers only, "
                f"not {type(module).__name__}"
            )
        else:
            continue
        parent, _, attr = name.rpartition(".")
        setattr(stacked.get_submodule(parent) if parent else stacked, attr, replacement)
    if isinstance(stacked, QNetwork):  # its noisy layers are stacked ones now
        stacked.refresh_noisy_layers()
    return stacked


def with_own_noise(stacked: nn.Module, noise: bool) -> nn.Module:
    """A copy of ``stacked`` that shares its parameters but has noise buffers and noise
    switches of its own (``noise``: on or off): what a learner updates through without
    touching the acting noise."""
    copied = copy.deepcopy(stacked, memo={id(p): p for p in stacked.parameters()})
    for layer in stacked_noisy_layers(copied):
        layer.noise_enabled = noise
    return copied


def seed_state_dict(stacked: nn.Module, seed_index: int) -> dict[str, torch.Tensor]:
    """Seed ``seed_index``'s state dict: what its single network's ``state_dict()`` holds."""
    return {
        name: tensor[seed_index].clone() for name, tensor in stacked.state_dict().items()
    }


class NoiseDraw:
    """Fresh factorised noise for stacked noisy layers, each seed from its own generator.

    For each seed, one ``normal_`` call on that seed's generator draws every layer's
    factors in order (so a seed's noise depends on its own generator only); then
    the factors and their outer products are made once for all seeds, as
    :func:`~agent.noisy.draw_noise` makes one layer's.
    ``seeds`` (indices) limits a draw to some seeds; the others keep their noise.
    """

    def __init__(self, layers: list[StackedNoisyLinear]) -> None:
        self.layers = layers
        if not layers:
            self.raw = None
            return
        first = layers[0].epsilon
        total = sum(layer.epsilon.shape[1] for layer in layers)
        self.raw = torch.empty(first.shape[0], total, device=first.device, dtype=first.dtype)
        self.sizes = [layer.epsilon.shape[1] for layer in layers]

    @torch.no_grad()
    def __call__(
        self,
        generators: list[torch.Generator],
        scale: float = 1.0,
        seeds: list[int] | None = None,
    ) -> None:
        if self.raw is None:
            return
        which = range(len(generators)) if seeds is None else seeds
        for i in which:
            self.raw[i].normal_(generator=generators[i])
        if seeds is None:
            raw = signed_sqrt_(self.raw)  # (S, total)
        else:
            rows = torch.tensor(list(which), dtype=torch.long)
            raw = signed_sqrt_(self.raw[rows])  # (S', total), a copy
        start = 0
        for layer, size in zip(self.layers, self.sizes, strict=True):
            factors = raw[:, start : start + size]  # (S', in + out)
            start += size
            if seeds is None:
                store_factors(
                    factors, layer.epsilon, layer.weight_epsilon, layer.in_features, scale
                )
                continue
            outer = factors.new_empty(len(rows), layer.out_features, layer.in_features)
            store_factors(factors, factors, outer, layer.in_features, scale)
            layer.epsilon[rows] = factors
            layer.weight_epsilon[rows] = outer

