"""Shared test set-up: markers, devices, and a recorder of aten ops for sync checks."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

# One thread, as in training on CPU: tests run beside other processes on 2 cores.
torch.set_num_threads(1)

CUDA = torch.cuda.is_available()

# Devices every component is tested on: CPU always, CUDA when present.
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]

# aten ops that force the host to wait for the device or move data off it.
SYNCING_OPS = {
    "aten._local_scalar_dense",  # .item(), bool(tensor), Python control flow on values
    "aten.nonzero",
    "aten.nonzero_static",
    "aten.masked_select",
    "aten.unique",
    "aten._unique2",
    "aten.equal",
    "aten.is_nonzero",
    "aten.allclose",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--runslow", action="store_true", help="run tests marked slow")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    skip_slow = pytest.mark.skip(reason="slow: run with --runslow")
    for item in items:
        if "gpu" in item.keywords and not CUDA:
            item.add_marker(skip_gpu)
        if "slow" in item.keywords and not config.getoption("--runslow"):
            item.add_marker(skip_slow)


class OpRecorder(TorchDispatchMode):
    """Records every aten op (name, and device of its outputs) dispatched inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []
        self.devices_out: list[tuple[str, str]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        kwargs = kwargs or {}
        name = func._schema.name  # e.g. "aten::add"
        self.ops.append(name.replace("::", "."))
        out = func(*args, **kwargs)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        for o in outs:
            if isinstance(o, torch.Tensor):
                self.devices_out.append((name, o.device.type))
        return out

    def syncing_ops(self) -> set[str]:
        return {op for op in self.ops if op in SYNCING_OPS}

    def ops_leaving(self, device_type: str) -> list[tuple[str, str]]:
        """Ops whose output landed on another device than ``device_type`` (e.g. copies to CPU)."""
        return [(op, d) for op, d in self.devices_out if d != device_type]


@pytest.fixture
def op_recorder() -> type[OpRecorder]:
    return OpRecorder


# A checkpoint in seconds: a short CartPole-sized run, no periodic evaluation, one final
# evaluation episode. For tests that need a real checkpoint file, not a learned policy.
TINY_RUN = {
    "learning_starts": 200,
    "train_freq": 2,
    "buffer_size": 2_000,
    "eval_interval": 0,
    "eval_episodes": 1,
    "confirm_episodes": 1,
    "early_stop": False,
    "checkpoint_interval": 100_000,
    "device": "cpu",
}


def train_checkpoint(run_dir: Path, env_id: str, total_steps: int, **overrides: Any) -> Path:
    """Train ``env_id`` for ``total_steps`` with :data:`TINY_RUN`; the path of its last.pt."""
    from agent.config_files import load_config
    from agent.train import train

    settings = {**TINY_RUN, "total_steps": total_steps, **overrides}
    settings["learning_starts"] = min(total_steps, settings["learning_starts"])
    train(load_config(env_id, overrides=settings), run_dir, progress=False, echo=lambda _: None)
    return Path(run_dir) / "checkpoints" / "last.pt"


# A bar frame as tqdm draws it: "| 120/400 [00:01<00:02, 95.2step/s, return=21.0]".
BAR_FRAME = re.compile(r"\|\s*\d+/\d+ \[[^\]]*\]")


def run_in_a_terminal(
    args: list[str], timeout: float = 240, env: dict[str, str] | None = None
) -> tuple[int, list[str]]:
    """``python run.py ARGS`` with a pseudo-terminal of 120 columns as its stdin, stdout
    and stderr, as a user's shell runs it: (exit status, the lines the screen shows).

    A line shows what was written on it after each carriage return wrote over it (the
    way a progress bar redraws itself and is cleared); escape sequences are dropped."""
    import fcntl
    import os
    import pty
    import select
    import struct
    import subprocess
    import sys
    import termios
    import time

    root = Path(__file__).resolve().parent.parent
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen([sys.executable, "run.py", *args], cwd=root, stdin=slave,
                            stdout=slave, stderr=slave, close_fds=True,
                            env=None if env is None else {**os.environ, **env})  # fmt: skip
    os.close(slave)
    raw, deadline = b"", time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # the child closed the terminal (EIO)
                    break
                if not chunk:
                    break
                raw += chunk
            elif proc.poll() is not None:
                break
        else:
            proc.kill()
            raise AssertionError(f"{args} ran past {timeout} s: {raw[-2000:]!r}")
        code = proc.wait(timeout=30)
    finally:
        os.close(master)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", raw.decode(errors="replace"))
    lines = []
    for written in text.split("\n"):
        cells: list[str] = []
        column = 0
        for char in written:
            if char == "\r":
                column = 0
                continue
            if column < len(cells):
                cells[column] = char
            else:
                cells.append(char)
            column += 1
        lines.append("".join(cells).rstrip())
    return code, lines


def text_after_a_bar(lines: list[str]) -> list[str]:
    """The lines where text follows a progress bar's frame: a message glued to a bar."""
    return [line for line in lines
            if (m := BAR_FRAME.search(line)) and line[m.end():].strip()]  # fmt: skip
