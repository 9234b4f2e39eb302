"""The import graph of the three packages: no circles, no import of a higher layer, no private
names across modules, no private APIs of libraries, and no framework import in the core.

Every ``import`` counts, also one inside a function: a lazy import still ties two modules
together, and a circle through lazy imports is the same knot a reader has to untie.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("funnel_core", "llama_index_funnel", "langchain_funnel")

#: The one private API we use on purpose: the stdlib has no public regular-expression parser, and
#: ``check_token_pattern`` needs one to refuse patterns with catastrophic backtracking.
ALLOWED_PRIVATE = {("re", "_parser")}


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for f in (ROOT / pkg).rglob("*.py"):
            name = ".".join(f.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = f
    return out


def _imports(module: str, path: Path) -> list[tuple[str, str | None]]:
    """(imported module, imported name or None) for every import statement in the file."""
    out: list[tuple[str, str | None]] = []
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            out += [(base, a.name) for a in node.names]
    return out


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    graph: dict[str, set[str]] = {}
    for m, f in mods.items():
        deps = set()
        for base, name in _imports(m, f):
            target = f"{base}.{name}" if name and f"{base}.{name}" in mods else base
            if target in mods and target != m:
                deps.add(target)
        graph[m] = deps
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_finds_a_planted_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle():
    circles = _cycles(_graph())
    assert circles == [], "import circles (break them by moving the shared piece down a layer):\n" + \
        "\n".join(" <-> ".join(c) for c in circles)


#: The core's layers, from the bottom (docs/architecture.md draws the same list): a module imports
#: only from its own layer or below. A name is a module or subpackage directly under funnel_core.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("units", "errors", "scoring", "text", "counters", "cache", "version"),
    ("settings", "filters", "funnel", "persist", "models", "manifest", "hardware", "index"),
    ("bm25", "embeddings", "llm"),
    ("rerank",),
    ("funnelrag", "granularity", "fbrag", "fbrag_fields", "best_practices"),
    ("train", "evaluation", "backends", "offline"),
    ("cli", "demo", "testing", "__main__"),
)


def _layer(module: str) -> int | None:
    """The layer of a funnel_core module (the package itself is the top); None outside the core."""
    parts = module.split(".")
    if parts[0] != "funnel_core":
        return None
    if len(parts) == 1:
        return len(LAYERS)
    return next((i for i, names in enumerate(LAYERS) if parts[1] in names), -1)


def _upward(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for m, deps in sorted(graph.items()):
        lm = _layer(m)
        for d in sorted(deps):
            ld = _layer(d)
            if lm is not None and ld is not None and ld > lm:
                out.append(f"{m} (layer {lm}) imports {d} (layer {ld})")
    return out


def test_layer_check_finds_a_planted_upward_import():
    graph = {"funnel_core.text": {"funnel_core.evaluation.metrics"}, "funnel_core.evaluation.metrics": set(),
             "funnel_core.rerank.fid": {"funnel_core.units"}}
    assert _upward(graph) == ["funnel_core.text (layer 0) imports funnel_core.evaluation.metrics (layer 5)"]


def test_every_core_module_has_a_layer():
    missing = sorted({m.split(".")[1] for m in _modules() if _layer(m) == -1})
    assert missing == [], f"add these to LAYERS (and docs/architecture.md): {missing}"


def test_no_module_imports_a_layer_above_it():
    up = _upward(_graph())
    assert up == [], "imports that go up a layer (move the shared piece down):\n" + "\n".join(up)


def test_no_private_name_of_another_module_or_library():
    mods = _modules()
    bad = []
    for m, f in mods.items():
        for base, name in _imports(m, f):
            private_name = name is not None and name.startswith("_") and not name.startswith("__")
            private_module = any(p.startswith("_") and not p.startswith("__") for p in base.split(".")) \
                and base.split(".")[0] not in PACKAGES
            if (private_name or private_module) and (base, name) not in ALLOWED_PRIVATE:
                bad.append(f"{f.relative_to(ROOT)}: from {base} import {name}")
    assert bad == [], "\n".join(bad)


def test_core_imports_no_framework_and_adapters_not_each_other():
    mods = _modules()
    bad = []
    for m, f in mods.items():
        roots = {base.split(".")[0] for base, _ in _imports(m, f)}
        if m.startswith("funnel_core") and roots & {"llama_index", "langchain", "langchain_core",
                                                   "llama_index_funnel", "langchain_funnel"}:
            bad.append(m)
        if m.startswith("llama_index_funnel") and roots & {"langchain", "langchain_core", "langchain_funnel"}:
            bad.append(m)
        if m.startswith("langchain_funnel") and roots & {"llama_index", "llama_index_funnel"}:
            bad.append(m)
    assert bad == []


def test_every_error_class_of_the_core_is_a_funnel_error():
    """One root for every exception the core defines, so `except FunnelError` catches them all."""
    import importlib

    from funnel_core.errors import FunnelError

    bad = []
    for m in _modules():
        if not m.startswith("funnel_core") or m.endswith(("offline.ray", "__main__")):
            continue  # the Ray engine imports ray at module level (optional extra)
        module = importlib.import_module(m)
        for name, obj in vars(module).items():
            if (isinstance(obj, type) and issubclass(obj, BaseException) and obj.__module__ == m
                    and not name.startswith("_")  # private control flow that never leaves its module
                    and not issubclass(obj, FunnelError)):
                bad.append(f"{m}.{name}")
    assert bad == [], f"error classes outside FunnelError: {bad}"


#: Packages split by role whose ``__init__`` re-exports the public names of their modules, so
#: ``from funnel_core.persist import save_snapshot`` works whichever module defines it.
REEXPORTING = ("funnel_core.persist", "funnel_core.bm25")


def test_split_packages_reexport_every_public_name_of_their_modules():
    import importlib
    import pkgutil

    bad = []
    for name in REEXPORTING:
        package = importlib.import_module(name)
        for info in pkgutil.iter_modules(package.__path__):
            if info.name.startswith("_"):
                continue
            module = importlib.import_module(f"{name}.{info.name}")
            for public in getattr(module, "__all__", ()):
                if public not in package.__all__ or getattr(package, public, None) is not getattr(module, public):
                    bad.append(f"{name}.{info.name}.{public}")
    assert bad == [], f"not re-exported by its package (add it to the package's imports and __all__): {bad}"


def test_persist_test_hooks_are_patched_where_they_are_read():
    """The save's step hook and fsync live in persist.commit; the package must not hold copies,
    or a test that patched the package would silently patch nothing."""
    from funnel_core import persist
    from funnel_core.persist import commit

    assert callable(commit._fsync_dir) and commit._step_hook is None
    assert not hasattr(persist, "_step_hook") and not hasattr(persist, "_fsync_dir")
