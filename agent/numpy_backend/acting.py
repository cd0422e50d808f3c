"""Acting on the numpy backend: Q-values at batch 1 and fresh noise, without PyTorch's
per-op cost."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from agent.noisy import store_factors
from agent.numpy_backend.program import NumpyProgram

__all__ = ["NumpyForward"]


class NumpyForward:
    """Q-values of a module as a numpy program, and its noise drawn with a numpy generator.

    Build it with :meth:`build` (which raises as :meth:`NumpyProgram.build` does), then
    :meth:`q_values` per step and :meth:`resample` whenever fresh noise is due. The noise
    is written into the layers' own buffers (views), so ``module(obs)`` afterwards
    reproduces exactly the noise the action used.
    """

    def __init__(self, program: NumpyProgram, rng: np.random.Generator) -> None:
        self.program = program
        self.dtype = program.dtype
        self.rng = rng
        # All noise factors are drawn by one generator call into one buffer (numpy: a
        # figure in docs/performance.md, #noise-draw), then stored into each layer's buffers
        # as every other path stores them (store_factors, through views of the same memory).
        layers = program.noisy_linears
        sizes = [len(layer.epsilon) for layer in layers]
        self._draw = np.empty(sum(sizes), dtype=self.dtype)
        self._scratch = np.empty(sum(sizes), dtype=self.dtype)
        draw = torch.from_numpy(self._draw)
        ends = np.cumsum([0, *sizes]).tolist()
        # each layer's (its factors in the draw, its epsilon, its weight_epsilon, in_features)
        self._stores = [
            (draw[start:end], torch.from_numpy(layer.epsilon),
             torch.from_numpy(layer.weight_epsilon), layer.layer.in_features)
            for start, end, layer in zip(ends[:-1], ends[1:], layers, strict=True)
        ]  # fmt: skip

    @classmethod
    def build(cls, module: nn.Module, rng: np.random.Generator) -> NumpyForward:
        """Compile ``module``; :class:`~agent.numpy_backend.program.Unsupported` (or
        ``NotApplicable``) names what does not compile."""
        return cls(NumpyProgram.build(module), rng)

    def resample(self) -> None:
        """Fresh factorised noise, f(x) = sgn(x) sqrt(|x|), written into the layers' buffers."""
        if not self._stores:
            return
        draw, scratch = self._draw, self._scratch
        self.rng.standard_normal(out=draw, dtype=self.dtype)
        np.sqrt(np.abs(draw, out=scratch), out=scratch)  # f(x) = sgn(x) sqrt(|x|)
        np.copysign(scratch, draw, out=draw)
        for factors, epsilon, weight_epsilon, in_features in self._stores:
            store_factors(factors, epsilon, weight_epsilon, in_features)

    def q_values(self, obs: np.ndarray, noise: bool) -> np.ndarray:
        """The module's output for ``obs``: noisy weights where ``noise``, else the means."""
        return self.program.forward(obs, noise=noise)
