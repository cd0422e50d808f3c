"""Acting on the numpy backend: Q-values at batch 1 and fresh noise, without PyTorch's
per-op cost."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

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
        # All noise factors are drawn by one generator call into one buffer, then
        # scattered into the layers' epsilon views (f(eps_in), then f(eps_out)).
        self._epsilons = [layer.epsilon for layer in program.noisy_linears]
        # The outer products by torch.outer through views of the same memory: the same
        # products as numpy's multiply.outer, by a vectorised kernel (log: #noise-cost).
        self._weight_epsilons = [
            torch.from_numpy(layer.weight_epsilon) for layer in program.noisy_linears
        ]
        sizes = [len(epsilon) for epsilon in self._epsilons]
        self._draw = np.empty(sum(sizes), dtype=self.dtype)
        self._draw_torch = torch.from_numpy(self._draw)
        self._scratch = np.empty(sum(sizes), dtype=self.dtype)
        ends = np.cumsum([0, *sizes]).tolist()
        self._segments = [
            (start, start + layer.layer.in_features, end)
            for start, end, layer in zip(ends[:-1], ends[1:], program.noisy_linears, strict=True)
        ]

    @classmethod
    def build(cls, module: nn.Module, rng: np.random.Generator) -> NumpyForward:
        """Compile ``module``; :class:`~agent.numpy_backend.program.Unsupported` (or
        ``NotApplicable``) names what does not compile."""
        return cls(NumpyProgram.build(module), rng)

    def resample(self) -> None:
        """Fresh factorised noise, f(x) = sgn(x) sqrt(|x|), written into the layers' buffers."""
        if not self._epsilons:
            return
        draw, scratch = self._draw, self._scratch
        self.rng.standard_normal(out=draw, dtype=self.dtype)
        np.sqrt(np.abs(draw, out=scratch), out=scratch)
        np.copysign(scratch, draw, out=draw)
        for epsilon, weight_epsilon, (a, b, c) in zip(
            self._epsilons, self._weight_epsilons, self._segments, strict=True
        ):
            epsilon[...] = draw[a:c]
            torch.outer(self._draw_torch[b:c], self._draw_torch[a:b], out=weight_epsilon)

    def q_values(self, obs: np.ndarray, noise: bool) -> np.ndarray:
        """The module's output for ``obs``: noisy weights where ``noise``, else the means."""
        return self.program.forward(obs, noise=noise)
