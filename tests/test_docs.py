"""The documentation site builds with no broken link or stale reference, and the README
points only at files that exist."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from agent.config import Config

ROOT = Path(__file__).resolve().parent.parent


def test_the_site_builds_strictly_with_the_generated_configuration_reference(
    tmp_path: Path,
) -> None:
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    mkdocs = shutil.which("mkdocs")
    assert mkdocs is not None
    site = tmp_path / "site"
    out = subprocess.run(
        [mkdocs, "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": str(Path(mkdocs).parent)},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    page = (site / "configuration" / "index.html").read_text()
    for key in Config.__dataclass_fields__:
        assert f"<code>{key}</code>" in page, key
    api = (site / "api" / "index.html").read_text()
    assert "NoisyLinear" in api and "weight_sigma" in api


def test_readme_links_to_files_that_exist() -> None:
    readme = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    local = [t for t in targets if not re.match(r"[a-z]+://", t)]
    assert local, "the README links into the docs"
    missing = [t for t in local if not (ROOT / t).exists()]
    assert missing == []
    assert len(readme.splitlines()) <= 250
