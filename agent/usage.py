"""How this copy of Noisy DQN was installed and started, for the commands that messages
print: the user can paste them as they are.

* :func:`install_hint`: ``pip install -e ".[video]"`` where the code runs from a source
  checkout (an editable install, or ``python run.py`` in the checkout), ``pip install
  "noisy-dqn[video]"`` where it was installed from a wheel; pip then adds the extra's
  packages to the installed copy.
* :func:`command`: ``noisy-dqn`` or ``python run.py``, whichever the user ran.

No import of torch or gymnasium here: ``--help`` prints install hints.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

__all__ = ["DISTRIBUTION", "checkout", "command", "install_hint"]

DISTRIBUTION = "noisy-dqn"

# The package's own directory, one level below the checkout root.
_PACKAGE_ROOT = Path(__file__).resolve().parent.parent


def _is_our_checkout(root: Path) -> bool:
    try:
        text = (root / "pyproject.toml").read_text()
    except OSError:
        return False
    return re.search(rf'^name\s*=\s*"{DISTRIBUTION}"', text, re.MULTILINE) is not None


def checkout() -> Path | None:
    """The source checkout this code runs from (an editable install, or ``python run.py``
    in the checkout), or None where it runs from an installed wheel (site-packages).

    Where the code lives decides, rather than pip's records: ``python run.py`` in a
    checkout imports the checkout's code even beside an installed wheel, and an editable
    install's code is the checkout's (its symlinks or import hooks resolve there).
    """
    return _PACKAGE_ROOT if _is_our_checkout(_PACKAGE_ROOT) else None


def install_hint(extra: str) -> str:
    """The pip command that installs the extra ``extra`` (e.g. ``video``, or
    ``atari,video``) into this installation."""
    root = checkout()
    if root is None:
        return f'pip install "{DISTRIBUTION}[{extra}]"'
    return f'pip install -e ".[{extra}]"' if _in(root) else f'pip install -e "{root}[{extra}]"'


def command() -> str:
    """How the user started us, for the commands that hints print: ``noisy-dqn``, or
    ``python`` and the script as it was typed (``python run.py``)."""
    script = sys.argv[0] if sys.argv else ""
    name = Path(script).name
    if name.startswith(DISTRIBUTION):  # the console script (noisy-dqn, noisy-dqn.exe)
        return DISTRIBUTION
    if name == "run.py":
        return f"python {shlex.quote(script)}"
    # Library use (a notebook, a test): the command this installation offers.
    root = checkout()
    if root is None or not (root / "run.py").is_file():
        return DISTRIBUTION
    return "python run.py" if _in(root) else f"python {shlex.quote(str(root / 'run.py'))}"


def _in(directory: Path) -> bool:
    """True when the working directory is ``directory``."""
    try:
        return Path.cwd().resolve() == directory
    except OSError:  # the working directory was removed
        return False

