"""Action selection (``ActionSelector``), one backend per file: see ``selector.py``."""

from agent.acting.graph import CapturedGraph, capture_cuda_graph, capture_eager, make_act_fn
from agent.acting.selector import ActionSelector, Backend

__all__ = [
    "ActionSelector",
    "Backend",
    "CapturedGraph",
    "capture_cuda_graph",
    "capture_eager",
    "make_act_fn",
]
