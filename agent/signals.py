"""Stop requests: Ctrl-C (SIGINT) and a scheduler's SIGTERM become a flag the loop checks.

A terminal sends SIGINT to the whole foreground process group; Slurm, Kubernetes and
preemptible machines send SIGTERM, then SIGKILL after a grace period. Either one asks
the run to stop at the end of the current step, save ``last.pt`` and say how to
resume; a second one interrupts at once (``KeyboardInterrupt``).
"""

from __future__ import annotations

import signal
from types import FrameType
from typing import Any

__all__ = ["STOP_SIGNALS", "StopSignals", "ignore_stop_signals"]

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopSignals:
    """Context manager: the first SIGINT or SIGTERM sets :attr:`received` (the signal number).

    Outside the main thread (where Python cannot install handlers) it does nothing,
    and the previous handlers are restored on exit.
    """

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        for sig in STOP_SIGNALS:
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: leave signals alone
                break
        return self

    def requested(self) -> bool:
        """True once a stop was asked for (the check a long loop makes every step)."""
        return self.received is not None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested():
            raise KeyboardInterrupt
        self.received = signum

    def __exit__(self, *exc: object) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()


def ignore_stop_signals() -> None:
    """Ignore SIGINT and SIGTERM in this process (a vector env's worker).

    The terminal's Ctrl-C reaches every process of the group; a worker that died of
    it would take the parent's env steps down with it before the parent could save.
    The parent stops the workers itself when it closes the vector env.
    """
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
