"""count_tokens is the number of ``\\S+`` runs (the cluster budget S is counted with it)."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from funnel_core.text import count_tokens

SPACES = [chr(c) for c in range(0x3001) if chr(c).isspace()]  # tab, newline, NBSP, U+2028, ...


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=st.sampled_from(SPACES + list("ab.é東\u200b\ufeff-"))))
def test_count_tokens_counts_non_space_runs(text):
    assert count_tokens(text) == len(re.findall(r"\S+", text))


def test_count_tokens_by_hand():
    assert count_tokens("  two\u00a0words\n\nand\tfour ") == 4
    assert count_tokens("") == 0
    assert count_tokens("zero\u200bwidth") == 1  # U+200B is not whitespace
