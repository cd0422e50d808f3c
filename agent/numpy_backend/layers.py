"""The layers of a numpy program: linear (plain or noisy) and convolution, forward and
backward, over zero-copy views of the live parameters, and the sink gradients go to."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from agent.noisy import FACTORISED_MAX_ROWS, FACTORISED_MIN_WEIGHTS, NoisyLinear

__all__ = ["GradientSink", "Linear", "TorchConv2d", "Unsupported"]

Array = np.ndarray


class Unsupported(Exception):
    """A part of a module that the numpy backend does not reproduce exactly."""


class GradientSink:
    """Where gradients go: a numpy view per trainable parameter, and which were written.

    ``views[i]`` is the gradient buffer of ``params[i]``; ``written[i]`` turns True
    at the first write (later writes add to it, for a layer used twice). The caller
    zeroes the buffers and calls :meth:`clear` before each backward pass.
    """

    def __init__(self, params: Sequence[torch.Tensor], views: Sequence[Array]) -> None:
        self.index = {id(p): i for i, p in enumerate(params) if p.requires_grad}
        self.views = list(views)
        self.written = [False] * len(self.views)

    def clear(self) -> None:
        """Forget what the last backward wrote (before the next one)."""
        for i in range(len(self.written)):
            self.written[i] = False

    def slot(self, param: torch.Tensor) -> int | None:
        """The index of ``param``'s gradient buffer, None for a frozen or foreign tensor."""
        return self.index.get(id(param))

    def add(self, i: int | None, value: Array) -> None:
        if i is None:
            return
        if self.written[i]:
            self.views[i] += value
        else:
            self.views[i][...] = value
            self.written[i] = True

    def first(self, i: int | None) -> bool:
        """True when buffer ``i`` takes a gradient and has none yet since :meth:`clear`."""
        return i is not None and not self.written[i]

    def add_matmul(self, i: int | None, a: Array, b: Array) -> Array | None:
        """``a @ b`` into buffer ``i`` (written in place when it is the first write);
        returns the buffer."""
        if i is None:
            return None
        if self.written[i]:
            self.views[i] += a @ b
        else:
            np.matmul(a, b, out=self.views[i])
            self.written[i] = True
        return self.views[i]

    def add_product(self, i: int | None, a: Array, b: Array) -> None:
        """``a * b`` into buffer ``i`` (written in place when it is the first write)."""
        if i is None:
            return
        if self.written[i]:
            self.views[i] += a * b
        else:
            np.multiply(a, b, out=self.views[i])
            self.written[i] = True


def _view(t: torch.Tensor) -> Array:
    return t.detach().numpy()


class Linear:
    """``nn.Linear`` or ``NoisyLinear``: y = x W^T + b, W = mu + sigma * eps when noisy.

    ``switch`` is the program's noise switch, shared by its layers: ``switch[0]`` None
    uses noise where the layer's ``noise_enabled`` says, True or False overrides it.
    """

    def __init__(
        self,
        layer: nn.Module,
        sink: GradientSink | None,
        switch: list[bool | None],
        noise: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> None:
        self.layer = layer
        self.switch = switch
        self.noisy = isinstance(layer, NoisyLinear)
        slot = sink.slot if sink is not None else (lambda p: None)
        if self.noisy:
            self.weight, self.bias = _view(layer.weight_mu), _view(layer.bias_mu)
            self.weight_sigma, self.bias_sigma = _view(layer.weight_sigma), _view(layer.bias_sigma)
            # The layer's own noise, or buffers read in their place (NoiseBuffers).
            epsilon, weight_epsilon = noise or (layer.epsilon, layer.weight_epsilon)
            self.epsilon = _view(epsilon)  # f(eps_in), then f(eps_out)
            self.weight_epsilon = _view(weight_epsilon)
            self.bias_epsilon = self.epsilon[layer.in_features :]
            self.grad_slots = [
                slot(p)
                for p in (layer.weight_mu, layer.weight_sigma, layer.bias_mu, layer.bias_sigma)
            ]
            # Scratch for the noisy weight: reused, so no allocation per step.
            self._noisy_weight = np.empty_like(self.weight)
        else:
            self.weight = _view(layer.weight)
            self.bias = None if layer.bias is None else _view(layer.bias)
            self.grad_slots = [slot(layer.weight), None if layer.bias is None else slot(layer.bias)]
        self._weight_used = self.weight  # the weight of the last forward (noisy or mean)
        self._noise_used = False

    def forward(self, x: Array) -> Array:
        override = self.switch[0]
        noise = self.noisy and (self.layer.noise_enabled if override is None else override)
        if noise and len(x) <= FACTORISED_MAX_ROWS and self.weight.size >= FACTORISED_MIN_WEIGHTS:
            # Acting through a large layer: the factorised form, as NoisyLinear.forward takes
            # it, reads each weight matrix once and builds no noisy weight.
            self._weight_used, self._noise_used = None, True
            epsilon_in = self.epsilon[: self.layer.in_features]
            y = x @ self.weight.T
            y += self.bias_sigma * self.bias_epsilon + self.bias
            y += ((x * epsilon_in) @ self.weight_sigma.T) * self.bias_epsilon
            return y
        if noise:
            # W = mu + sigma * eps materialised: at these sizes, fewer numpy calls than the
            # factorised form.
            weight = np.multiply(self.weight_sigma, self.weight_epsilon, out=self._noisy_weight)
            weight += self.weight
            bias = self.bias_sigma * self.bias_epsilon
            bias += self.bias
        else:
            weight, bias = self.weight, self.bias
        self._weight_used, self._noise_used = weight, noise
        y = x @ weight.T
        if bias is not None:
            y += bias
        return y

    def backward(self, g: Array, x: Array, need_input: bool, sink: GradientSink) -> Array | None:
        """Parameter gradients into ``sink``; the gradient of ``x`` when ``need_input``."""
        # g: (B, out), x: (B, in). Computed before the weight's buffers change: a later
        # forward would rewrite the noisy weight scratch this reads.
        if self._weight_used is None:  # a factorised forward: the noisy weight, built now
            weight = np.multiply(self.weight_sigma, self.weight_epsilon, out=self._noisy_weight)
            self._weight_used = np.add(weight, self.weight, out=weight)
        grad_input = g @ self._weight_used if need_input else None
        if self.noisy:
            i_mu, i_sigma, i_bias_mu, i_bias_sigma = self.grad_slots
            if not self._noise_used:  # mean weights only: the sigmas got no gradient
                i_sigma = i_bias_sigma = None
        else:
            i_mu, i_bias_mu = self.grad_slots
            i_sigma = i_bias_sigma = None
        if i_sigma is not None and sink.first(i_mu) and sink.first(i_sigma):
            # (out, in): d/d mu, written in place; times eps: d/d sigma, written in place
            grad_weight = sink.add_matmul(i_mu, g.T, x)
            sink.add_product(i_sigma, grad_weight, self.weight_epsilon)
        elif i_sigma is not None:  # a layer used twice: add to what is there
            grad_weight = g.T @ x
            sink.add(i_mu, grad_weight)
            sink.add(i_sigma, np.multiply(grad_weight, self.weight_epsilon, out=grad_weight))
        else:
            sink.add_matmul(i_mu, g.T, x)
        if i_bias_mu is not None or i_bias_sigma is not None:
            grad_bias = g.sum(axis=0)
            sink.add(i_bias_mu, grad_bias)
            if i_bias_sigma is not None:
                sink.add(i_bias_sigma, grad_bias * self.bias_epsilon)
        return grad_input


class TorchConv2d:
    """An ``nn.Conv2d`` on numpy arrays: PyTorch's kernels on zero-copy tensors, live weights.

    numpy has no convolution, and an im2col in numpy is several times slower than
    PyTorch's kernel (docs/research/log.md).
    """

    def __init__(self, layer: nn.Conv2d) -> None:
        if layer.padding_mode != "zeros" or isinstance(layer.padding, str):
            raise Unsupported(f"Conv2d padding {layer.padding!r} ({layer.padding_mode})")
        self.layer = layer
        self.weight, self.bias = layer.weight, layer.bias
        self.options = (layer.stride, layer.padding, layer.dilation, layer.groups)

    def __call__(self, x: Array) -> Array:
        with torch.no_grad():
            return F.conv2d(torch.from_numpy(x), self.weight, self.bias, *self.options).numpy()

    def backward(
        self, g: Array, x: Array, need_input: bool, need_weight: bool, need_bias: bool
    ) -> tuple[Array | None, Array | None, Array | None]:
        """(grad of x, of the weight, of the bias), each None where not asked for."""
        stride, padding, dilation, groups = self.options
        bias_sizes = None if self.bias is None else list(self.bias.shape)
        # oneDNN's backward kernels are about twice as fast on channels-last tensors at
        # these sizes (docs/research/log.md), conversions included.
        channels_last = torch.channels_last
        grads = torch.ops.aten.convolution_backward(
            torch.from_numpy(g).contiguous(memory_format=channels_last),
            torch.from_numpy(x).contiguous(memory_format=channels_last),
            self.weight.detach().contiguous(memory_format=channels_last),
            bias_sizes,
            list(stride),
            list(padding),
            list(dilation),
            False,
            [0, 0],
            groups,
            [need_input, need_weight, need_bias and self.bias is not None],
        )
        return tuple(None if t is None else t.numpy() for t in grads)  # type: ignore[return-value]
