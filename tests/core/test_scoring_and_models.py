"""funnel_core.scoring (one tie rule, pure ranking) and funnel_core.models (tokenizer locks
without an id()-keyed registry); the old import paths still work."""

from __future__ import annotations

import gc
import threading
import weakref

import pytest

from funnel_core.models import tokenizer_lock
from funnel_core.scoring import minmax, normalize_scores, rank_by_scores


def test_one_tie_rule():
    assert minmax([3.0, 3.0]) == [1.0, 1.0] == normalize_scores([2.0, 2.0])
    assert normalize_scores([5.0, 5.0], "zscore") == [0.0, 0.0]
    assert minmax([1.0, 3.0, 2.0]) == [0.0, 1.0, 0.5]
    assert minmax([]) == []
    with pytest.raises(ValueError, match="finite"):
        normalize_scores([1.0, float("nan")])


def test_rank_by_scores_is_stable_and_pure():
    scores = [0.5, 0.9, 0.5, 0.1]
    assert rank_by_scores(scores) == [1, 0, 2, 3]  # the two 0.5 keep their input order
    assert rank_by_scores(scores, top_n=2) == [1, 0]
    assert rank_by_scores(scores, threshold=0.5) == [1, 0, 2]
    assert scores == [0.5, 0.9, 0.5, 0.1]


def test_tokenizer_lock_lives_on_the_tokenizer():
    class Tok:
        pass

    a, b = Tok(), Tok()
    assert tokenizer_lock(a) is tokenizer_lock(a) and tokenizer_lock(a) is not tokenizer_lock(b)
    assert isinstance(tokenizer_lock(a), type(threading.Lock()))
    ref = weakref.ref(a)
    del a
    gc.collect()
    assert ref() is None  # nothing keeps a dead tokenizer (or its lock) alive
    import funnel_core.rerank.base as base

    assert not hasattr(base, "_TOKENIZER_LOCKS")


def test_old_import_paths():
    from funnel_core.best_practices.fusion import normalize_scores as f
    from funnel_core.models import LazyModel, load_pretrained, resolve_device
    from funnel_core.models import tokenizer_lock as t
    from funnel_core.rerank.cross_encoder import minmax as m
    from funnel_core.scoring import sigmoid

    assert f is normalize_scores and m is minmax and t is tokenizer_lock
    assert sigmoid(0.0) == 0.5 and LazyModel and load_pretrained and resolve_device
