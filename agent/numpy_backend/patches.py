"""A convolution whose stride equals its kernel, as a reshape and a matrix product.

Such a convolution (no padding, no dilation, one group) reads disjoint ``k x k`` patches,
so it is ``patches(x) @ W^T``: no im2col with overlaps, no convolution kernel. What costs
is cutting the patches, a transpose with runs of ``k`` elements; the program keeps that
cost low three ways:

* its outputs stay channels-last, ``(B, Ho, Wo, O)``, so the next such convolution cuts
  patches with runs of ``k * O`` contiguous elements (its weight is permuted to match,
  a small copy per forward) and only a flatten puts channels first again;
* the transpose moves each run of ``k`` elements as one item (a numpy void dtype of
  ``k`` elements), not element by element;
* at the input, it runs before the cast to floats and the scaling: on uint8 frames, a
  quarter of the bytes (:class:`InputChain`).

Rows stay rows: every array keeps the batch as its first axis, which the program's
backward over the first rows of a forward relies on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

__all__ = [
    "InputChain",
    "patch_conv_geometry",
    "patches",
    "unpatch",
]

Array = np.ndarray


def patch_conv_geometry(layer: object) -> int | None:
    """The kernel ``k`` of an ``nn.Conv2d`` that reads disjoint ``k x k`` patches (square
    kernel, stride equal to it, no padding or dilation, one group), else None."""
    kernel = tuple(getattr(layer, "kernel_size", ()))
    if len(kernel) != 2 or kernel[0] != kernel[1]:
        return None
    k = kernel[0]
    same = (
        tuple(layer.stride) == (k, k)  # type: ignore[attr-defined]
        and tuple(layer.dilation) == (1, 1)  # type: ignore[attr-defined]
        and layer.groups == 1  # type: ignore[attr-defined]
        and not isinstance(layer.padding, str)  # type: ignore[attr-defined]
        and tuple(layer.padding) == (0, 0)  # type: ignore[attr-defined]
    )
    return k if same else None


def _runs(x: Array, axis_len: int, k: int) -> Array:
    """``x``'s last axis (of ``axis_len`` used elements) as ``axis_len // k`` items of ``k``
    elements each (a void dtype), so that a transpose moves whole runs."""
    x = x[..., :axis_len]
    if x.strides[-1] != x.itemsize:
        x = np.ascontiguousarray(x)
    return x.view(np.dtype((np.void, k * x.itemsize)))


def patches(x: Array, k: int, channels_last: bool) -> Array:
    """The ``k x k`` patches of ``x``, ``(B, Ho, Wo, K)`` with ``Ho = H // k``, ``Wo = W // k``
    (trailing rows and columns dropped, as the convolution drops them).

    ``x`` is ``(B, C, H, W)`` (patches ordered ``(C, k, k)``, as a convolution's weight)
    or, ``channels_last``, ``(B, H, W, C)`` (patches ordered ``(k, k, C)``).
    """
    if channels_last:
        b, h, w, c = x.shape
        ho, wo = h // k, w // k
        # (B, Ho, k, Wo, k*C): each patch row is k*C contiguous elements
        rows = _runs(x[:, : ho * k, : wo * k].reshape(b, ho * k, wo * k * c), wo * k * c, k * c)
        cut = rows.reshape(b, ho, k, wo).transpose(0, 1, 3, 2)
        return np.ascontiguousarray(cut).view(x.dtype).reshape(b, ho, wo, k * k * c)
    b, c, h, w = x.shape
    ho, wo = h // k, w // k
    rows = _runs(x[:, :, : ho * k], wo * k, k)  # (B, C, Ho*k, Wo) runs of k
    cut = rows.reshape(b, c, ho, k, wo).transpose(0, 2, 4, 1, 3)  # (B, Ho, Wo, C, k)
    return np.ascontiguousarray(cut).view(x.dtype).reshape(b, ho, wo, c * k * k)


def unpatch(g: Array, k: int, shape: Sequence[int], channels_last: bool) -> Array:
    """The adjoint of :func:`patches`: ``g`` ``(B, Ho, Wo, K)`` written back where each
    patch came from in an array of ``shape`` (its batch from ``g``), zeros elsewhere."""
    b, ho, wo, _ = g.shape
    out = np.zeros((b, *shape[1:]), dtype=g.dtype)
    if channels_last:
        c = shape[3]
        region = out[:, : ho * k, : wo * k].reshape(b, ho, k, wo, k, c)
        region[...] = g.reshape(b, ho, wo, k, k, c).transpose(0, 1, 3, 2, 4, 5)
    else:
        c = shape[1]
        region = out[:, :, : ho * k, : wo * k].reshape(b, c, ho, k, wo, k)
        region[...] = g.reshape(b, ho, wo, c, k, k).transpose(0, 3, 1, 4, 2, 5)
    # Splitting axes of a slice is a view, so the writes above land in out.
    assert np.shares_memory(region, out)
    return out


class InputChain:
    """Elementwise steps between a program's input and the patches cut from it (a cast to
    floats, then a division or product by numbers), applied after the cut instead of
    before: the transpose then moves the input's own bytes (uint8 frames), and the
    arithmetic reads contiguous patches. Each step is a numpy function of one array."""

    def __init__(self, steps: Sequence[Callable[[Array], Array]]) -> None:
        self.steps = list(steps)

    def __call__(self, x: Array) -> Array:
        for step in self.steps:
            x = step(x)
        return x
