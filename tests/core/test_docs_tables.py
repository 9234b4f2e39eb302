"""The module and class paths that the README's component table and docs/frameworks.md's table
of core stages name (``rerank.cross_encoder``, ``funnelrag.presets.funnelrag``, ...) exist under
``funnel_core``: a renamed or removed module cannot stay in the tables."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SPAN = re.compile(r"`([A-Za-z_][\w.]*)`")


def _core_column(path: Path, header: str, column: int) -> list[tuple[str, tuple[str, ...]]]:
    """The code spans of ``column`` of the Markdown table whose header row starts with
    ``header``, each with the other spans of its cell."""
    lines = path.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    spans: list[tuple[str, tuple[str, ...]]] = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        found = tuple(SPAN.findall(cells[column]))
        spans += [(span, found) for span in found]
    return spans


#: Where a bare class or function name in a table may live (besides funnel_core itself and the
#: modules its cell names): the packages whose ``__init__`` gathers a paper area.
PACKAGES = ("funnelrag", "granularity", "best_practices", "backends.milvus", "embeddings", "offline")


def _resolves(path: str) -> bool:
    """``path`` is a module of funnel_core, or an attribute reached from one (``a.b.Name``)."""
    parts = path.split(".")
    for cut in range(len(parts), -1, -1):
        module = ".".join(["funnel_core", *parts[:cut]])
        try:
            obj = importlib.import_module(module)
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


TABLES = [
    ("README.md", "| paper | funnel_core |", 1),
    ("docs/frameworks.md", "| core stage (`funnel_core`) |", 0),
]
SPANS = [(page, span, cell) for page, header, col in TABLES
         for span, cell in _core_column(ROOT / page, header, col)]


def test_the_tables_name_something():
    assert {page for page, _, _ in SPANS} == {page for page, _, _ in TABLES}
    assert len(SPANS) > 20


@pytest.mark.parametrize("page,span,cell", SPANS, ids=[f"{p}:{s}" for p, s, _ in SPANS])
def test_every_funnel_core_path_in_the_tables_exists(page, span, cell):
    if span in ("runtime", "dtype"):  # keyword arguments named in the speed row
        return
    places = [span] if "." in span else [span, *(f"{p}.{span}" for p in (*cell, *PACKAGES) if p != span)]
    assert any(_resolves(p) for p in places), \
        f"{page} names `{span}`, which is not a module or attribute of funnel_core"
