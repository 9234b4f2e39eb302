"""tests/README.md names every environment-variable gate a test has: a test that never runs in CI
must say so where a reader looks."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

# os.environ.get("NAME") / os.getenv("NAME") inside a skipif condition
_GATE = re.compile(r"skipif\(\s*not\s+(?:__import__\(\"os\"\)|os)\.(?:environ\.get|getenv)\(\"([A-Z0-9_]+)\"\)")


def _gated_files() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for path in TESTS.rglob("test_*.py"):
        if path.resolve() == Path(__file__).resolve():
            continue
        for name in _GATE.findall(path.read_text(encoding="utf-8")):
            out.setdefault(name, set()).add(path.relative_to(TESTS).as_posix())
    return out


def test_the_gate_finder_sees_both_spellings():
    assert _GATE.findall('@pytest.mark.skipif(not os.environ.get("FUNNEL_SLOW"),') == ["FUNNEL_SLOW"]
    assert _GATE.findall('@pytest.mark.skipif(not __import__("os").environ.get("X_Y"),') == ["X_Y"]


def test_every_environment_gate_and_its_files_are_in_the_readme():
    readme = (TESTS / "README.md").read_text(encoding="utf-8")
    gates = _gated_files()
    assert gates, "no gate found: the pattern no longer matches how the tests are gated"
    missing = [f"{name}: {f}" for name, files in gates.items() for f in sorted(files)
               if f"`{name}=1`" not in readme or f"`{f}`" not in readme]
    assert missing == [], f"name these gates in tests/README.md (## Gates): {missing}"
