"""The shape of the house: no import circles among ``contextlab`` modules, and
the arrows between the layers point down.

The graph is read with ``ast`` from the source, not by importing it, so it
sees every import a reader sees:

- module-level and function-level imports alike: an import moved into a
  function to dodge a circle still ties the two modules together;
- imports under ``if TYPE_CHECKING:`` too: they run only under mypy, but a
  module that names another in its signatures cannot be read or moved without
  it, so a type-only loop is a loop all the same;
- not what ``importlib.import_module`` loads by name (the policy registry):
  that is a plug-in point, not an arrow.

``from package import name`` is an arrow to ``package.name`` when that is a
module, else to the package. Importing ``a.b.c`` also runs ``a/__init__`` and
``a/b/__init__``; those implicit arrows are left out, as every reader leaves
them out.

The last tests hold ``docs/architecture.md`` to the code: every path it names
exists, and every "module  name" pair in its drawings is a name that module
defines.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "contextlab"

# The layers, lowest first. A module may import its own layer and the ones
# listed as allowed for it; the tests below spell each contract out.
ENGINE = "contextlab.engine"
LIB = "contextlab.lib"
SESSIONS = "contextlab.sessions"
ABOVE_SESSIONS = ("contextlab.dashboard", "contextlab.api", "contextlab.gateway", "contextlab.insights")
# The web stack: the engine and lib run without it (a script, a replay, a benchmark).
WEB_STACK = {"django", "channels", "celery", "daphne"}

def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted((ROOT / PACKAGE).rglob("*.py"))}


def _is_package(name: str) -> bool:
    return modules()[name].name == "__init__.py"


def _absolute(module: str, imported: str | None, level: int) -> str:
    """The absolute name a (possibly relative) ``from ... import`` names."""
    if level == 0:
        return imported or ""
    base = module.split(".")
    if not _is_package(module):
        base.pop()
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, imported] if imported else base)


def _known(name: str) -> str | None:
    """The longest prefix of ``name`` that is a module of the package."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules():
            return candidate
        parts.pop()
    return None


def imported_names(tree: ast.AST, module: str) -> Iterable[str]:
    """Every dotted name ``module`` imports, at any depth of its code."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(module, node.module, node.level)
            for alias in node.names:
                yield f"{source}.{alias.name}" if alias.name != "*" else source


@cache
def graph() -> dict[str, frozenset[str]]:
    """Module -> the ``contextlab`` modules it imports."""
    edges: dict[str, frozenset[str]] = {}
    for name, path in modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        targets = {_known(imported) for imported in imported_names(tree, name)}
        edges[name] = frozenset(t for t in targets if t is not None and t != name)
    return edges


def external_imports(module: str) -> set[str]:
    """Top-level names of what ``module`` imports from outside the package (``django``, ``json``, ...)."""
    tree = ast.parse(modules()[module].read_text(encoding="utf-8"))
    return {name.split(".")[0] for name in imported_names(tree, module) if name.split(".")[0] != PACKAGE}


def circles(edges: dict[str, frozenset[str]]) -> list[tuple[set[str], list[str]]]:
    """Each strongly connected group of two modules or more, with one loop through it (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(start: str) -> None:
        # Iterative, so a deep chain of imports cannot hit the recursion limit.
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.add(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(group)

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return [(group, _loop_through(group, edges)) for group in groups]


def _loop_through(group: set[str], edges: dict[str, frozenset[str]]) -> list[str]:
    """A shortest loop from the group's first member back to itself, for the message."""
    start = min(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(edges[node] & group):
                if child == start:
                    return [*paths[node], start]
                if child not in paths:
                    paths[child] = [*paths[node], child]
                    following.append(child)
        frontier = following
    raise AssertionError(f"no loop through {sorted(group)}")  # pragma: no cover: a group is strongly connected


def _describe(found: list[tuple[set[str], list[str]]]) -> str:
    return "\n".join(f"{len(group)} modules tied: {', '.join(sorted(group))}\n  one loop: " + " -> ".join(loop)
                     for group, loop in found)


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _broken(package: str, forbidden: Iterable[str]) -> list[str]:
    forbidden = tuple(forbidden)
    return [f"{module} -> {target}" for module, targets in sorted(graph().items())
            if _inside(module, package)
            for target in sorted(targets) if any(_inside(target, f) for f in forbidden)]


# -- the graph reader itself -----------------------------------------------------------------------


def test_it_finds_a_circle_and_names_its_modules() -> None:
    edges = {"a": frozenset({"b"}), "b": frozenset({"c"}), "c": frozenset({"a"}), "d": frozenset({"a"})}
    assert circles(edges) == [({"a", "b", "c"}, ["a", "b", "c", "a"])]


def test_it_reads_function_level_relative_and_type_checking_imports() -> None:
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from contextlab.engine.hook import ContextManager\n"
        "def later():\n    from ..core import profile\n    import contextlab.engine.core.tokens\n"
    )
    found = {_known(name) for name in imported_names(tree, "contextlab.engine.policies.base")}
    assert {"contextlab.engine.hook", "contextlab.engine.core.profile", "contextlab.engine.core.tokens"} <= found


def test_it_sees_the_whole_package() -> None:
    assert {"contextlab.engine.hook", "contextlab.api.openapi", "contextlab.sessions.services"} <= set(graph())


# -- the house ---------------------------------------------------------------------------------


def test_it_has_no_import_circle() -> None:
    loops = circles(graph())
    assert not loops, "import circles among contextlab modules:\n" + _describe(loops)


def _outside(package: str, allowed: tuple[str, ...]) -> list[str]:
    return [f"{module} -> {target}" for module, targets in sorted(graph().items()) if _inside(module, package)
            for target in sorted(targets) if not any(_inside(target, a) for a in allowed)]


def _on_web_stack(package: str) -> list[str]:
    return sorted(f"{module} ({', '.join(sorted(external_imports(module) & WEB_STACK))})" for module in graph()
                  if _inside(module, package) and external_imports(module) & WEB_STACK)


def test_it_keeps_the_engine_on_its_own_ground() -> None:
    outside = _outside(ENGINE, (ENGINE,))
    assert not outside, "the engine imports the rest of contextlab:\n" + "\n".join(outside)
    assert not _on_web_stack(ENGINE), f"the engine imports the web stack: {_on_web_stack(ENGINE)}"


# The engine's top level: its packages, the hook as the table of contents of a turn, and how its state is saved.
ENGINE_TOP_LEVEL = {"contextlab.engine.hook", "contextlab.engine.saved_state"}
# The package's top level: the entry points users type (the ``contextlab`` command, the
# client an agent vendors) and the wiring Django and Celery look for by name.
TOP_LEVEL = {"contextlab.__main__", "contextlab.asgi", "contextlab.celery", "contextlab.cli", "contextlab.client",
             "contextlab.settings", "contextlab.urls", "contextlab.wsgi"}


def _loose_modules(package: str) -> set[str]:
    """The modules directly in ``package`` that are not packages themselves."""
    depth = package.count(".") + 1
    return {name for name, path in modules().items()
            if name.startswith(package + ".") and name.count(".") == depth and path.name != "__init__.py"}


def test_it_keeps_the_engine_top_level_to_its_packages_and_the_hook() -> None:
    loose = sorted(_loose_modules(ENGINE) - ENGINE_TOP_LEVEL)
    assert not loose, f"modules loose at the engine's top level (put each in its package): {loose}"


def test_it_keeps_the_top_level_to_entry_points_and_wiring() -> None:
    loose = sorted(_loose_modules(PACKAGE) - TOP_LEVEL)
    assert not loose, f"modules loose at the top of contextlab (support/ or their app): {loose}"


def test_it_keeps_the_engine_core_below_the_rest_of_the_engine() -> None:
    core = f"{ENGINE}.core"
    outside = _outside(core, (core,))
    assert not outside, "engine/core imports the rest of the engine:\n" + "\n".join(outside)


def test_it_keeps_lib_pure() -> None:
    # lib builds on the engine (its messages, its identifiers) and on nothing above.
    outside = _outside(LIB, (ENGINE, LIB))
    assert not outside, "lib imports more than the engine:\n" + "\n".join(outside)
    assert not _on_web_stack(LIB), f"lib imports the web stack: {_on_web_stack(LIB)}"


def test_it_keeps_sessions_below_the_screens_and_the_api() -> None:
    # No exception: the session pages, their routes, the admin and the demo loader are the
    # dashboard's (they render its fragments and forms), so sessions is domain only.
    broken = _broken(SESSIONS, ABOVE_SESSIONS)
    assert not broken, "sessions imports a layer above it:\n" + "\n".join(broken)


# -- the architecture page ---------------------------------------------------------------------

PAGE = ROOT / "docs" / "architecture.md"
# A path of two segments or more (``api/views.py``, ``contextlab/engine/``), not inside a URL.
_PATH = re.compile(r"(?<![\w/.<>-])(\w+(?:/\w+)+(?:\.py|\.html|/)?)(?![\w/])")
# In a drawing: a module and, after it, a name it defines (``api/views.py  session_prepare``).
_MODULE_AND_NAME = re.compile(r"(?<![\w/.])(\w+(?:/\w+)*\.py)[ \t]+([A-Za-z_]\w*(?:\.\w+)?)(?![\w/.(:])")


def _on_disk(path: str) -> Path | None:
    for base in (ROOT, ROOT / PACKAGE):
        if (base / path).exists():
            return base / path
    return None


def _defines(path: Path, dotted: str) -> bool:
    scope: list[ast.stmt] = ast.parse(path.read_text(encoding="utf-8")).body
    for part in dotted.split("."):
        found = next((node for node in scope if part in _names_of(node)), None)
        if found is None:
            return False
        scope = found.body if isinstance(found, ast.ClassDef) else []
    return True


def _names_of(node: ast.stmt) -> set[str]:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {node.name}
    if isinstance(node, ast.Assign | ast.AnnAssign):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return {t.id for t in targets if isinstance(t, ast.Name)}
    if isinstance(node, ast.ImportFrom):  # a re-export, e.g. a package's __init__
        return {alias.asname or alias.name for alias in node.names}
    return set()


def test_it_names_only_modules_that_exist_on_the_architecture_page() -> None:
    text = PAGE.read_text(encoding="utf-8")
    missing = sorted({path for path in _PATH.findall(text) if _on_disk(path) is None}
                     | {name for name in re.findall(r"`(contextlab(?:\.\w+)+)`", text) if name not in modules()})
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_it_names_only_functions_that_exist_on_the_architecture_page() -> None:
    drawings = re.findall(r"```\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.S)
    pairs = [pair for drawing in drawings for pair in _MODULE_AND_NAME.findall(drawing)]
    wrong = [f"{path} {name}" for path, name in pairs
             if (found := _on_disk(path)) is None or not _defines(found, name)]
    assert len(pairs) >= 10, pairs
    assert not wrong, f"docs/architecture.md names what its modules do not define: {wrong}"
