"""NoisyLinear: a linear layer with factorised Gaussian parameter noise.

Fortunato et al. 2017, "Noisy Networks for Exploration", section 3 (factorised
noise). The layer computes

    y = x (mu_W + sigma_W * eps_W)^T + (mu_b + sigma_b * eps_b)

with eps_W = f(eps_out) f(eps_in)^T (an outer product, so rank 1), eps_b =
f(eps_out), eps ~ N(0, 1) and f(x) = sgn(x) sqrt(|x|).

Device rules (see docs/design.md): noise is drawn on the device and in the dtype of
``weight_sigma`` and written *in place* into registered buffers, so that the
buffers keep their addresses. A captured CUDA graph reads those addresses; a
reassigned buffer would silently freeze the noise inside the graph.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "FACTORISED_MAX_ROWS",
    "FACTORISED_MIN_WEIGHTS",
    "NoiseBuffers",
    "NoisyLinear",
    "draw_noise",
    "noise_disabled",
    "noise_switched",
    "noisy_layers",
    "noisy_parameter",
    "reset_noise",
    "set_noise",
    "signed_sqrt_",
    "store_factors",
]

# One observation through a large layer (the Nature-CNN head, acting in one env) takes
# the factorised form; elsewhere the two extra matmuls cost more (bench/noisy_forward.py).
# The numpy backend's layers follow the same rule.
FACTORISED_MAX_ROWS = 1
FACTORISED_MIN_WEIGHTS = 1 << 17


class NoisyLinear(nn.Module):
    """Linear layer with factorised Gaussian noise on weights and biases.

    Args:
        in_features: size of each input sample.
        out_features: size of each output sample.
        sigma0: initial noise scale; ``weight_sigma`` and ``bias_sigma`` start at
            ``sigma0 / sqrt(in_features)`` (0.5 in the paper).
        device, dtype: where and in which precision parameters and noise live.

    Noise is used in ``forward`` while ``noise_enabled`` is True (the default);
    switch it for a whole network with :func:`set_noise` or
    :func:`noise_disabled`, independently of ``train()`` / ``eval()``.
    """

    epsilon: torch.Tensor
    weight_epsilon: torch.Tensor

    def __init__(
        self,
        in_features: int,
        out_features: int,
        sigma0: float = 0.5,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if in_features <= 0 or out_features <= 0:
            raise ValueError(
                f"NoisyLinear needs positive sizes, got in_features={in_features}, "
                f"out_features={out_features}"
            )
        if sigma0 < 0:
            raise ValueError(f"sigma0 must be >= 0, got {sigma0}")
        factory = {"device": device, "dtype": dtype}
        self.in_features = in_features
        self.out_features = out_features
        self.sigma0 = float(sigma0)
        self.noise_enabled = True

        self.weight_mu = nn.Parameter(torch.empty(out_features, in_features, **factory))
        self.weight_sigma = nn.Parameter(torch.empty(out_features, in_features, **factory))
        self.bias_mu = nn.Parameter(torch.empty(out_features, **factory))
        self.bias_sigma = nn.Parameter(torch.empty(out_features, **factory))
        # f(eps_in) and f(eps_out) share one buffer: one draw and one f() serve both.
        # Persistent, so that a saved network reproduces its last noisy forward.
        self.register_buffer("epsilon", torch.zeros(in_features + out_features, **factory))
        self.register_buffer("weight_epsilon", torch.zeros(out_features, in_features, **factory))
        self.reset_parameters()
        self.reset_noise()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Initialise as in the paper for factorised noise (section 3.2)."""
        bound = 1.0 / math.sqrt(self.in_features)
        self.weight_mu.uniform_(-bound, bound)
        self.bias_mu.uniform_(-bound, bound)
        self.weight_sigma.fill_(self.sigma0 * bound)
        self.bias_sigma.fill_(self.sigma0 * bound)

    @property
    def epsilon_in(self) -> torch.Tensor:
        """f(eps_in), the input factor of the weight noise: a view of ``epsilon``."""
        return self.epsilon[: self.in_features]

    @property
    def epsilon_out(self) -> torch.Tensor:
        """f(eps_out), the output factor: a view of ``epsilon``."""
        return self.epsilon[self.in_features :]

    @property
    def bias_epsilon(self) -> torch.Tensor:
        """The bias noise, which is the output factor itself (a view, not a copy)."""
        return self.epsilon_out

    def reset_noise(self, generator: torch.Generator | None = None, scale: float = 1.0) -> None:
        """Draw fresh factorised noise into the existing buffers (addresses unchanged).

        The buffers live with ``weight_sigma`` (``.to()`` moves them together), so
        the noise is drawn where the weights are. ``generator`` must be on that
        device; without one, the device's default generator is used. (Buffers
        never require grad, so no autograd context is needed: entering one per
        layer costs more than the noise on a CPU.) ``scale`` multiplies the output
        factor, and so the weight and the bias noise alike (the same draws).
        """
        draw_noise(self.epsilon, self.weight_epsilon, self.in_features, generator, scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.noise_enabled:
            return F.linear(x, self.weight_mu, self.bias_mu)
        bias = noisy_parameter(self.bias_mu, self.bias_sigma, self.epsilon_out)
        if x.dim() == 2 and x.shape[0] <= FACTORISED_MAX_ROWS and (
            self.weight_mu.numel() >= FACTORISED_MIN_WEIGHTS
        ):
            # A few rows through a large layer (acting): the factorised form never builds
            # the noisy weight matrix, x (sigma * eps_out eps_in^T)^T = ((x * eps_in) sigma^T)
            # * eps_out, so it reads each weight matrix once instead of writing a third.
            mean = F.linear(x, self.weight_mu, bias)
            return torch.addcmul(mean, F.linear(x * self.epsilon_in, self.weight_sigma),
                                 self.epsilon_out)  # fmt: skip
        weight = noisy_parameter(self.weight_mu, self.weight_sigma, self.weight_epsilon)
        return F.linear(x, weight, bias)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"sigma0={self.sigma0}, noise_enabled={self.noise_enabled}"
        )


def noisy_parameter(mu: torch.Tensor, sigma: torch.Tensor, epsilon: torch.Tensor) -> torch.Tensor:
    """``mu + sigma * epsilon``, a noisy weight or bias, in one op: the one formula of every
    PyTorch path (a layer, a stack of seeds' layers: shapes broadcast), so that they round
    alike."""
    return torch.addcmul(mu, sigma, epsilon)


def noisy_layers(module: nn.Module) -> list[NoisyLinear]:
    """Every :class:`NoisyLinear` inside ``module`` (found by type, never by name)."""
    return [m for m in module.modules() if isinstance(m, NoisyLinear)]


def reset_noise(module: nn.Module, generator: torch.Generator | None = None) -> None:
    """Resample the noise of every NoisyLinear inside ``module``."""
    for layer in noisy_layers(module):
        layer.reset_noise(generator)


def set_noise(module: nn.Module, enabled: bool) -> None:
    """Switch the noise of every NoisyLinear inside ``module`` on or off (mu only)."""
    for layer in noisy_layers(module):
        layer.noise_enabled = enabled


@contextlib.contextmanager
def noise_disabled(module: nn.Module) -> Iterator[nn.Module]:
    """Context manager: forward with the mean weights only, restoring each layer's switch after."""
    with noise_switched(noisy_layers(module), False):
        yield module


@contextlib.contextmanager
def noise_switched(layers: list[NoisyLinear], enabled: bool) -> Iterator[None]:
    """Context manager: ``layers`` (found once by the caller) with their noise switched
    on or off, each layer's own switch restored after."""
    previous = [layer.noise_enabled for layer in layers]
    try:
        for layer in layers:
            layer.noise_enabled = enabled
        yield
    finally:
        for layer, was in zip(layers, previous, strict=True):
            layer.noise_enabled = was


def draw_noise(
    epsilon: torch.Tensor,
    weight_epsilon: torch.Tensor,
    in_features: int,
    generator: torch.Generator | None = None,
    scale: float = 1.0,
) -> None:
    """Factorised noise into ``epsilon`` (f(eps_in), then f(eps_out)) and ``weight_epsilon``
    (their outer product), in place; ``scale`` multiplies the output factor."""
    epsilon.normal_(generator=generator)
    signed_sqrt_(epsilon)
    store_factors(epsilon, epsilon, weight_epsilon, in_features, scale)


def signed_sqrt_(x: torch.Tensor) -> torch.Tensor:
    """f(x) = sgn(x) sqrt(|x|), in place: standard normals become noise factors."""
    sign = x.sign()
    return x.abs_().sqrt_().mul_(sign)


def store_factors(
    factors: torch.Tensor,
    epsilon: torch.Tensor,
    weight_epsilon: torch.Tensor,
    in_features: int,
    scale: float = 1.0,
) -> None:
    """The factors ``(..., in + out)`` into ``epsilon`` (``factors`` may be it) and their
    outer products f(eps_out) f(eps_in)^T ``(..., out, in)`` into ``weight_epsilon``: one
    layer's noise, or a seed axis of layers' in front. ``scale`` multiplies the output
    factor, and so the weight and the bias noise alike."""
    if factors is not epsilon:
        epsilon.copy_(factors)
    if scale != 1.0:
        epsilon[..., in_features:].mul_(scale)
    if epsilon.dim() == 1:  # one layer's: the cheapest call, as this runs per acting step
        torch.outer(epsilon[in_features:], epsilon[:in_features], out=weight_epsilon)
    else:  # each entry is one product, as in torch.outer: the same bits per seed
        eps_in, eps_out = epsilon[..., :in_features], epsilon[..., in_features:]
        torch.mul(eps_out.unsqueeze(-1), eps_in.unsqueeze(-2), out=weight_epsilon)


class NoiseBuffers:
    """Noise of its own for some noisy layers of ``module``, used in place of theirs.

    A learner update or a diagnostic draws here (:meth:`draw`, the same draws the layers
    would make) and runs ``module`` on it (:meth:`forward`, through
    ``torch.func.functional_call``), so the layers' own buffers, the acting noise that a
    selector or a captured graph reads, are never written. ``tensors`` maps each layer to
    its ``(epsilon, weight_epsilon)``, for a compiled forward that reads them directly.
    """

    def __init__(self, module: nn.Module, layers: list[NoisyLinear]) -> None:
        self.module = module
        self.layers = layers
        self.tensors = {
            layer: (torch.empty_like(layer.epsilon), torch.empty_like(layer.weight_epsilon))
            for layer in layers
        }
        names = {layer: name for name, layer in module.named_modules()}
        self.overrides: dict[str, torch.Tensor] = {}
        for layer, (epsilon, weight_epsilon) in self.tensors.items():
            prefix = f"{names[layer]}." if names[layer] else ""
            self.overrides[prefix + "epsilon"] = epsilon
            self.overrides[prefix + "weight_epsilon"] = weight_epsilon

    def draw(self, generator: torch.Generator | None = None, scale: float = 1.0) -> None:
        """Fresh noise for every layer, in order."""
        for layer, (epsilon, weight_epsilon) in self.tensors.items():
            draw_noise(epsilon, weight_epsilon, layer.in_features, generator, scale)

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        """``module(*args)`` with this noise in the layers' place."""
        if not self.overrides:
            return self.module(*args)
        return torch.func.functional_call(self.module, self.overrides, args)
