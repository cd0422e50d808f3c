"""bench/bf16_check.py: the bfloat16 loss against the float32 one, on real frames."""

from __future__ import annotations

import argparse

import pytest

from bench import bf16_check


def test_a_bfloat16_update_differs_from_the_float32_one_a_little_and_points_the_same_way() -> None:
    pytest.importorskip("ale_py")
    pytest.importorskip("cv2")
    args = argparse.Namespace(env="BreakoutNoFrameskip-v4", frames=200, updates=4, every=2)
    out = bf16_check.check("drq-epsilon", args)
    for key in ("loss", "gradient", "step"):
        # bfloat16 keeps 8 bits of mantissa: a difference, well under the values themselves
        assert 0 < out[key]["min"] and out[key]["max"] < 0.2, (key, out[key])
    assert out["cosine"]["min"] > 0.98
