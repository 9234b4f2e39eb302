"""Fixtures of the evaluation tests."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="session")
def _machine_description_loaded():
    """Every report records ``funnel_core.hardware.describe()``, which imports torch (about 2 s,
    once per process); pay it at session setup rather than inside the first fast test."""
    from funnel_core.hardware import describe

    describe()
