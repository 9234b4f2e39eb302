"""The Python snippets of README.md and docs/*.md name only what they import (that they run:
``test_docs_snippets_run.py``).

Regression: the LangChain snippet of docs/best_practices.md used ``QueryClassifier``
without importing it (``NameError``). Snippets leave the user's own objects (``docs``, ``llm``,
``prompt``...) undefined on purpose, so the rule checked here is narrower: a snippet that uses
a public name of funnel-rag imports it, and every ``from funnel_core... / llama_index_funnel... /
langchain_funnel... import X`` resolves.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
OURS = ("funnel_core", "llama_index_funnel", "langchain_funnel")
BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def _public_names() -> set[str]:
    names: set[str] = set()
    for pkg in OURS:
        names |= set(getattr(importlib.import_module(pkg), "__all__", ()))
    for mod in ("funnel_core.best_practices.classify", "funnel_core.best_practices.fusion",
                "funnel_core.funnelrag.clustered_index", "funnel_core.granularity"):
        names |= set(getattr(importlib.import_module(mod), "__all__", ()))
    return names


def _snippets():
    for page in [DOCS.parent / "README.md", *sorted(DOCS.glob("*.md"))]:
        for i, m in enumerate(BLOCK.finditer(page.read_text(encoding="utf-8"))):
            yield pytest.param(page.name, m.group(1), id=f"{page.name}#{i}")


@pytest.mark.parametrize("page,code", list(_snippets()))
def test_snippet_imports_what_it_uses(page, code):
    try:
        tree = ast.parse(code)
    except SyntaxError:
        pytest.skip("not a complete Python snippet (a fragment or a signature)")
    defined: set[str] = set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                defined.add((a.asname or a.name).split(".")[0])
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(OURS):
                mod = importlib.import_module(node.module)
                for a in node.names:
                    assert a.name == "*" or hasattr(mod, a.name) or importlib.util.find_spec(
                        f"{node.module}.{a.name}") is not None, \
                        f"{page}: `from {node.module} import {a.name}` does not resolve"
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            defined.add(node.id)
        elif isinstance(node, ast.arg):
            defined.add(node.arg)
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    missing = sorted((used - defined) & _public_names())
    assert not missing, f"{page}: the snippet uses {missing} without importing them"
