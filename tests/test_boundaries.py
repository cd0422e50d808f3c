"""Boundaries between modules, read from the source (AST): no import circle among the
modules of agent/ and envs/, no module reaching into another's private names, every
name imported from a module of the project listed in that module's ``__all__``, and no
script editing ``sys.path`` to import its neighbours."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("agent", "envs", "bench")

Sources = dict[str, tuple[str, bool]]  # dotted name -> (source, is a package's __init__)


def project_sources(packages: tuple[str, ...] = PACKAGES) -> Sources:
    sources: Sources = {}
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            sources[".".join(parts[:-1] if is_package else parts)] = (path.read_text(), is_package)
    return sources


@functools.cache
def _parse(text: str) -> ast.Module:
    return ast.parse(text)  # the trees are only read: one parse per text serves every check


def _parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _imports(name: str, is_package: bool, tree: ast.AST) -> list[tuple[str, str | None, int]]:
    """(module, imported name or None for ``import module``, line) of every import,
    at any depth (an import inside a function runs too), relative ones resolved."""
    found: list[tuple[str, str | None, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, None, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                package = name.split(".") if is_package else name.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                module = ".".join([*package, *([module] if module else [])])
            found += [(module, alias.name, node.lineno) for alias in node.names]
    return found


def import_graph(sources: Sources) -> dict[str, set[str]]:
    """Module -> the project modules its imports run: the module imported, the submodule
    a ``from package import submodule`` names, and the packages above them (their
    ``__init__`` runs first), less the importer's own packages."""
    graph: dict[str, set[str]] = {}
    for name, (text, is_package) in sources.items():
        own = set(_parents(name))
        edges: set[str] = set()
        for module, imported, _ in _imports(name, is_package, _parse(text)):
            targets = [module] if imported is None else [module, f"{module}.{imported}"]
            for target in targets:
                for runs in (*_parents(target), target):
                    if runs in sources and runs != name and runs not in own:
                        edges.add(runs)
        graph[name] = edges
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _own_private_names(tree: ast.AST) -> set[str]:
    """Private names a module defines: its functions, classes and module or class level
    names, and the attributes it sets on ``self``/``cls``."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id in ("self", "cls")
        ):
            names.add(node.attr)
    return {n for n in names if _private(n)}


def private_reaches(sources: Sources) -> list[str]:
    """Uses of another project module's private names: ``from module import _name``,
    ``module._name``, and ``obj._name`` (or ``getattr``/``hasattr``/``setattr`` of it)
    where ``_name`` is private to another module of the project and not defined here."""
    trees = {name: _parse(text) for name, (text, _) in sources.items()}
    own = {name: _own_private_names(tree) for name, tree in trees.items()}
    problems = []
    for name, tree in trees.items():
        is_package = sources[name][1]
        elsewhere = set().union(*(names for other, names in own.items() if other != name))
        elsewhere -= own[name]
        module_aliases: set[str] = set()
        for module, imported, line in _imports(name, is_package, tree):
            if module.split(".")[0] not in PACKAGES:
                continue
            if imported is not None and _private(imported) and module != name:
                problems.append(f"{name}:{line}: from {module} import {imported}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                module_aliases |= {a.asname for a in node.names if a.asname and a.name in trees}
            elif isinstance(node, ast.ImportFrom) and node.module:
                module_aliases |= {
                    a.asname or a.name for a in node.names if f"{node.module}.{a.name}" in trees
                }
        for node in ast.walk(tree):
            attr, on = None, None
            if isinstance(node, ast.Attribute) and _private(node.attr):
                attr, on = node.attr, node.value
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr", "setattr")
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)
                and _private(node.args[1].value)
            ):
                attr, on = node.args[1].value, node.args[0]
            if attr is None or (isinstance(on, ast.Name) and on.id in ("self", "cls")):
                continue
            if attr in elsewhere or (isinstance(on, ast.Name) and on.id in module_aliases):
                problems.append(f"{name}:{node.lineno}: {ast.unparse(on)}.{attr}")
    return problems


def _all_of(tree: ast.Module) -> set[str] | None:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return set(ast.literal_eval(node.value))
    return None


def names_outside_all(sources: Sources) -> list[str]:
    """``from module import name`` of a project module whose ``__all__`` (which it must
    have) does not list ``name`` (a submodule imported by name is not checked)."""
    trees = {name: _parse(text) for name, (text, _) in sources.items()}
    problems = []
    for name, tree in trees.items():
        for module, imported, line in _imports(name, sources[name][1], tree):
            if imported is None or module not in trees or f"{module}.{imported}" in trees:
                continue
            public = _all_of(trees[module])
            if public is None or imported not in public:
                problems.append(f"{name}:{line}: {imported} is not in {module}.__all__")
    return problems


def sys_path_edits(sources: Sources) -> list[str]:
    """Modules that change ``sys.path`` to import their neighbours as top-level modules."""
    return [
        f"{name}:{node.lineno}: {ast.unparse(node)}"
        for name, (text, _) in sources.items()
        for node in ast.walk(_parse(text))
        if isinstance(node, ast.Attribute) and ast.unparse(node.value) == "sys.path"
    ]


def _with(sources: Sources, module: str, old: str, new: str) -> Sources:
    text, is_package = sources[module]
    assert old in text, (module, old)
    return {**sources, module: (text.replace(old, new, 1), is_package)}


def test_no_import_circle_among_agent_and_envs() -> None:
    assert circles(import_graph(project_sources(("agent", "envs")))) == []


def test_no_module_reaches_into_another_modules_private_names() -> None:
    assert private_reaches(project_sources()) == []


def test_names_imported_from_a_module_are_in_its_all() -> None:
    assert names_outside_all(project_sources()) == []


def test_no_module_edits_sys_path() -> None:
    # bench/ scripts are modules of the bench package (python -m bench.suite).
    assert sys_path_edits(project_sources()) == []
    edited = _with(project_sources(), "bench.suite", "\n__all__", (
        "\nimport sys\nsys.path.insert(0, 'bench')\n__all__"))
    (found,) = sys_path_edits(edited)
    assert found.startswith("bench.suite:") and found.endswith(": sys.path.insert")


def test_the_circle_check_catches_a_lazy_import_through_a_package() -> None:
    # agent/cli.py imports agent.sweep inside a function; a sweep module that imports
    # agent.cli back closes a circle through agent/sweep/__init__.py.
    sources = project_sources(("agent", "envs"))
    closed = _with(
        sources, "agent.sweep.driver",
        "from agent.usage import command\n", "from agent.cli import build_parser\n",
    )  # fmt: skip
    found = circles(import_graph(closed))
    assert len(found) == 1 and {"agent.cli", "agent.sweep", "agent.sweep.driver"} <= set(found[0])


def test_the_private_check_catches_an_import_an_alias_and_an_attribute() -> None:
    sources = project_sources()
    for module, old, new, problem in [
        ("agent.sweep.cli", "from agent.config_files import coerce_value",
         "from agent.config_files import _apply", "from agent.config_files import _apply"),
        ("bench.noisy_forward", "noisy.FACTORISED_MIN_WEIGHTS = 0",
         "noisy._rank_one = 0", "noisy._rank_one"),
        ("agent.seeds.stacked", "        stacked.refresh_noisy_layers()\n",
         "        stacked._noisy = []\n", "stacked._noisy"),
        ("agent.export", "if isinstance(folded, QNetwork):",
         'if hasattr(folded, "_noisy"):', "folded._noisy"),
    ]:
        found = private_reaches(_with(sources, module, old, new))
        assert len(found) == 1 and found[0].startswith(f"{module}:"), (module, found)
        assert found[0].endswith(problem), found


def test_the_all_check_catches_a_name_left_out() -> None:
    sources = project_sources()
    left_out = _with(sources, "agent.train", '    "crossed",\n', "")
    assert names_outside_all(left_out) == [
        f"agent.seeds.group:{line}: crossed is not in agent.train.__all__"
        for _, imported, line in _imports("agent.seeds.group", False,
                                          _parse(sources["agent.seeds.group"][0]))
        if imported == "crossed"
    ]  # fmt: skip


def test_no_module_of_agent_passes_600_lines_and_no_function_100() -> None:
    # A file or a function past these sizes does several jobs: split it by job.
    too_long = []
    for name, (text, _) in project_sources(("agent",)).items():
        if text.count("\n") > 600:
            too_long.append(f"{name}: {text.count(chr(10))} lines")
        for node in ast.walk(_parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > 100:
                    too_long.append(f"{name}.{node.name}: {lines} lines")
    assert not too_long, too_long
