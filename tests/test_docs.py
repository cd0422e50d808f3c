"""The documentation site builds with no broken link or stale reference; the README and
docs/ link only to files and sections that exist, and name only config keys that exist."""

from __future__ import annotations

import ast
import functools
import json
import re
import shutil
import subprocess
from pathlib import Path

import markdown
import pytest

from agent.config import Config
from agent.config_files import BASE_KEY

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# The research log is dated history: it names the keys of its day, some since renamed.
CURRENT_DOCS = [path for path in DOCS if "research" not in path.relative_to(ROOT).parts]
KEYS = {*Config.__dataclass_fields__, BASE_KEY}  # and a config file's own key

FENCE = re.compile(r"^ *(```|~~~)([^\n]*)\n(.*?)^ *\1 *$", re.M | re.S)
INLINE_CODE = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
SET_KEY = re.compile(r"""--(?:set|grid)[ =]["']?([A-Za-z_]\w*)=""")
YAML_KEY = re.compile(r"([a-z_]\w*):\s")
SNAKE_NAME = re.compile(r"([a-z][a-z0-9]*(?:_[a-z0-9]+)+)(?:\(\))?")
PLACEHOLDERS = {"key", "KEY"}  # --set key=value, --grid KEY=V1,V2
BUILT_ONLY = {"agent/configs"}  # in the wheel: setup.py ships configs/ there
REPO_PATH = re.compile(r"(?<![\w./-])((?:agent|envs|bench|tests|docs|configs|\.ci)/[\w./-]*[\w/])")


def _without_code_blocks(text: str) -> str:
    return FENCE.sub("", text)


def _prose(text: str) -> str:
    """The text as a reader sees links: no code blocks, no inline code."""
    return INLINE_CODE.sub("", _without_code_blocks(text))


def _anchors(text: str) -> set[str]:
    """Every id the page renders, as mkdocs renders it: headings through the toc
    extension, and ``{ #id }`` attribute anchors (which replace a heading's own)."""
    html = markdown.markdown(text, extensions=["toc", "attr_list", "fenced_code", "tables"])
    return set(re.findall(r'\sid="([^"]+)"', html))


@functools.cache
def _anchors_of(path: Path) -> frozenset[str]:
    return frozenset(_anchors(path.read_text()))


@functools.cache
def _code_names() -> frozenset[str]:
    """Every name the code defines or uses (functions, classes, attributes, arguments,
    words of its strings): what a backticked name in the docs may refer to."""
    names: set[str] = set()
    sources = [ROOT / "run.py"]
    sources += [p for d in ("agent", "envs", "bench") for p in (ROOT / d).rglob("*.py")]
    for source in sources:
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Name):
                names.add(node.id)
            elif isinstance(node, ast.Attribute):
                names.add(node.attr)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.keyword) and node.arg:
                names.add(node.arg)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names.update(re.findall(r"\w+", node.value))
    return frozenset(names)


def link_problems(path: Path, text: str) -> list[str]:
    """Markdown links of ``text`` (the contents of ``path``) to a file that does not exist,
    or to an ``#anchor`` that the target page (this one for ``#anchor`` alone) lacks."""
    problems = []
    for target in LINK.findall(_prose(text)):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            problems.append(f"{path.name}: ({target}): no such file")
        elif anchor and dest.suffix == ".md":
            ids = _anchors(text) if dest == path else _anchors_of(dest)
            if anchor not in ids:
                problems.append(f"{path.name}: ({target}): no such section")
    return problems


def path_problems(path: Path, text: str) -> list[str]:
    """Paths into the checkout (``agent/...``, ``configs/...``, ``bench/...``) that
    ``text`` names, in prose or commands, and that do not exist."""
    return [
        f"{path.name}: {name}: no such file or folder"
        for name in REPO_PATH.findall(text)
        if not (ROOT / name).exists() and name.rstrip("/") not in BUILT_ONLY
    ]


def config_key_problems(path: Path, text: str) -> list[str]:
    """Config keys that ``text`` names and :class:`Config` lacks: in ``--set``/``--grid``,
    in backticked ``key: value``, in YAML code blocks, and backticked snake_case names
    that neither the config nor the code defines."""
    named = [(m, "--set") for m in SET_KEY.findall(text) if m not in PLACEHOLDERS]
    for block in FENCE.finditer(text):
        if block.group(2).strip() in ("yaml", "yml"):
            named += [(m, "yaml") for m in re.findall(r"^([a-z_]\w*):", block.group(3), re.M)]
    for code in INLINE_CODE.findall(_without_code_blocks(text)):
        code = code.strip()
        if (m := YAML_KEY.match(code)) is not None:
            named.append((m.group(1), "key: value"))
        elif (m := SNAKE_NAME.fullmatch(code)) is not None and m.group(1) not in _code_names():
            named.append((m.group(1), "a name"))
    return [f"{path.name}: {how} {key!r} is no config key" for key, how in named if key not in KEYS]


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
        # PYTHONPATH: the hook's reference comes from this checkout's Config, not from
        # whichever checkout an editable install of the environment points at.
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": str(Path(mkdocs).parent),
             "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    page = (site / "configuration" / "index.html").read_text()
    for key in Config.__dataclass_fields__:
        assert f"<code>{key}</code>" in page, key
    api = (site / "api" / "index.html").read_text()
    assert "NoisyLinear" in api and "weight_sigma" in api


def test_readme_links_into_the_docs_and_stays_short() -> None:
    readme = (ROOT / "README.md").read_text()
    assert any(target.startswith("docs/") for target in LINK.findall(readme))
    assert len(readme.splitlines()) <= 250


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_lead_to_files_and_sections_that_exist(path: Path) -> None:
    assert link_problems(path, path.read_text()) == []


@pytest.mark.parametrize("path", CURRENT_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_name_only_config_keys_that_exist(path: Path) -> None:
    assert config_key_problems(path, path.read_text()) == []


@pytest.mark.parametrize("path", CURRENT_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_name_only_paths_that_exist(path: Path) -> None:
    assert path_problems(path, path.read_text()) == []


@pytest.mark.parametrize(
    "path", [*CURRENT_DOCS, *sorted((ROOT / "bench").glob("*.py"))],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_bench_scripts_are_run_as_modules_of_the_bench_package(path: Path) -> None:
    # Run as a file, a script cannot import its siblings as bench.<name>.
    assert re.findall(r"python3?\s+bench/\w+\.py", path.read_text()) == []


def test_the_path_check_catches_a_moved_file() -> None:
    page = ROOT / "docs" / "design.md"
    text = page.read_text()
    assert path_problems(page, text + "\nsee `agent/config.py`, `bench/` and envs/make.py\n") == []
    assert path_problems(page, text + "\npython bench/nope.py --quick\n") == [
        "design.md: bench/nope.py: no such file or folder"
    ]


def test_the_link_check_catches_a_missing_file_or_section() -> None:
    gpu = ROOT / "docs" / "gpu.md"
    text = gpu.read_text()
    assert "(design.md#device-rules)" in text  # a { #id } attribute anchor, found
    assert link_problems(gpu, text) == []
    for bad in ("design.md#device-rule", "desing.md#device-rules", "#no-such-heading"):
        broken = text.replace("(design.md#device-rules)", f"({bad})")
        assert link_problems(gpu, broken) == [f"gpu.md: ({bad}): no such " + (
            "file" if bad.startswith("desing") else "section")]
    assert link_problems(gpu, text + "\n[GPU](#gpu)\n") == []  # this page's own heading


def test_the_key_check_catches_a_key_the_config_lacks() -> None:
    page = ROOT / "docs" / "configuration.md"
    text = page.read_text()
    assert config_key_problems(page, text) == []
    for injected, how in [
        ("`--set lr_decay=0.5`", "--set"),
        ('python run.py --env CartPole-v1 --grid "lr_decay=0.1,0.2"', "--set"),
        ("`lr_decay: 0.5`", "key: value"),
        ("`lr_decay`", "a name"),
        ("```yaml\nlr: 0.001\nlr_decay: 0.5\n```", "yaml"),
    ]:
        problems = config_key_problems(page, f"{text}\n{injected}\n")
        assert problems == [f"configuration.md: {how} 'lr_decay' is no config key"], injected
    assert config_key_problems(page, f"{text}\n`--set noise_interval=1` `gamma: 0.9`\n") == []


def test_the_api_page_s_examples_run_training_included(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every Python example of docs/api.md runs as it is written, in a fresh working
    directory; one of them trains a run from Python and reads its result."""
    page = ROOT / "docs" / "api.md"
    fences = FENCE.finditer(page.read_text())
    blocks = [m.group(3) for m in fences if m.group(2).strip() == "python"]
    assert any("train(" in block and "load_config(" in block for block in blocks)
    monkeypatch.chdir(tmp_path)
    for block in blocks:
        exec(compile(block, str(page), "exec"), {"__name__": "__main__"})
    (result_file,) = tmp_path.glob("runs/*/result.json")  # the run directory it names
    assert json.loads(result_file.read_text())["status"] in ("finished", "solved")
    assert (result_file.parent / "checkpoints" / "last.pt").is_file()
