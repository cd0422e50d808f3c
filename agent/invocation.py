"""How the user started this process, for the commands that hints and messages print.

Its own module because both the command line (:mod:`agent.cli`) and the sweep it starts
(:mod:`agent.sweep`) print commands, and neither may import the other's module for it.
"""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["command"]


def command() -> str:
    """``noisy-dqn`` when started as the installed command, else ``python run.py``."""
    return "noisy-dqn" if Path(sys.argv[0]).name == "noisy-dqn" else "python run.py"
