"""agent/usage.py: install hints that fit the installation, commands the user ran."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agent import usage

ROOT = Path(__file__).resolve().parent.parent


def _installed_copy(tmp_path: Path) -> Path:
    """The packages laid out as a wheel installs them: in a site-packages directory, with
    no checkout (pyproject.toml) above them."""
    site = tmp_path / "site-packages"
    for package in ("agent", "envs"):
        shutil.copytree(ROOT / package, site / package,
                        ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    return site


def _run_installed(site: Path, code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip


def test_a_checkout_gets_editable_installs_of_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert usage.checkout() == ROOT
    monkeypatch.chdir(ROOT)
    assert usage.install_hint("video") == 'pip install -e ".[video]"'
    monkeypatch.chdir(tmp_path)  # "." would be another directory: the checkout by its path
    assert usage.install_hint("atari,video") == f'pip install -e "{ROOT}[atari,video]"'


def test_an_installed_wheel_gets_the_distribution_with_its_extra(tmp_path: Path) -> None:
    site = _installed_copy(tmp_path)
    code = "from agent import usage; print(usage.__file__); print(usage.install_hint('video'))"
    out = _run_installed(site, code, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [str(site / "agent" / "usage.py"),
                                       'pip install "noisy-dqn[video]"']  # fmt: skip


def test_an_installed_wheels_messages_name_its_install_and_its_command(tmp_path: Path) -> None:
    # A missing extra, as the noisy-dqn console script meets it: minatar not importable.
    site = _installed_copy(tmp_path)
    code = (
        "import sys\n"
        "sys.modules['minatar'] = None\n"
        "sys.argv = ['/venv/bin/noisy-dqn', '--env', 'MinAtar/Breakout-v1']\n"
        "from agent.cli import main\n"
        "code = main()\n"
        "from agent.cli import build_parser\n"
        "print(build_parser().format_help())\n"
        "sys.exit(code)\n"
    )
    out = _run_installed(site, code, cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    (line,) = out.stderr.splitlines()
    assert line.endswith('pip install "noisy-dqn[minatar]"'), line
    assert 'pip install "noisy-dqn[sweep]"' in out.stdout  # --help's sweep group
    assert 'pip install "noisy-dqn[export]"' in out.stdout
    assert "pip install -e" not in out.stdout + out.stderr
    assert out.stdout.startswith("usage: noisy-dqn ")


@pytest.mark.parametrize(
    ("argv0", "expected"),
    [
        ("/home/me/.venv/bin/noisy-dqn", "noisy-dqn"),
        ("run.py", "python run.py"),
        ("../noisy/run.py", "python ../noisy/run.py"),
    ],
)
def test_the_command_is_the_one_the_user_ran(
    monkeypatch: pytest.MonkeyPatch, argv0: str, expected: str
) -> None:
    monkeypatch.setattr(sys, "argv", [argv0, "--env", "CartPole-v1"])
    assert usage.command() == expected
