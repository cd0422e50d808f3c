"""The numpy backend: the CPU fast path of acting and learning, fenced in one package.

One compiler (``program.py``) turns a module's forward into a numpy program with a tape
and hand-written gradients, from one op table (``ops.py``) and its layers
(``layers.py``); acting (``acting.py``) adds batch-1 Q-values and noise drawn in numpy.
Everything else in the agent uses only the names below; whatever does not compile stays
in PyTorch, and is said once (``compiled_or_none``). The networks expected to stay in
PyTorch, without a word: any on another device than the CPU or in another dtype than
float32/float64, and a module that opts out (a ``numpy_backend_opt_out`` class
attribute). Every network ``QNetwork`` builds compiles: MLPs, the MinAtar, Nature and
data-efficient Rainbow CNNs.
"""

from agent.numpy_backend.acting import NumpyForward
from agent.numpy_backend.layers import GradientSink
from agent.numpy_backend.program import (
    NotApplicable,
    NumpyProgram,
    Unsupported,
    compiled_or_none,
    cpu_float_dtype,
)

__all__ = [
    "GradientSink",
    "NotApplicable",
    "NumpyForward",
    "NumpyProgram",
    "Unsupported",
    "compiled_or_none",
    "cpu_float_dtype",
]
