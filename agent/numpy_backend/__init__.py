"""The numpy backend: the CPU fast path of acting and learning, fenced in one package.

One compiler (``program.py``) turns a module's forward into a numpy program with a tape
and hand-written gradients, from one op table (``ops.py``) and its layers
(``layers.py``); acting (``acting.py``) adds batch-1 Q-values and noise drawn in numpy.
Everything else in the agent uses only the names below; whatever does not compile stays
in PyTorch.
"""

from agent.numpy_backend.acting import NumpyForward
from agent.numpy_backend.layers import GradientSink
from agent.numpy_backend.program import NumpyProgram, cpu_float_dtype

__all__ = ["GradientSink", "NumpyForward", "NumpyProgram", "cpu_float_dtype"]
