"""funnel_core.scoring (one tie rule, pure ranking) and funnel_core.models (tokenizer locks
without an id()-keyed registry); the old import paths still work."""

from __future__ import annotations

import gc
import threading
import weakref

import pytest

from funnel_core.models import tokenizer_lock
from funnel_core.scoring import TIE_EPS, minmax, normalize_scores, rank_by_scores


def test_one_tie_rule():
    assert minmax([3.0, 3.0]) == [1.0, 1.0] == normalize_scores([2.0, 2.0])
    assert normalize_scores([5.0, 5.0], "zscore") == [0.0, 0.0]
    assert minmax([1.0, 3.0, 2.0]) == [0.0, 1.0, 0.5]
    assert minmax([]) == []
    with pytest.raises(ValueError, match="finite"):
        normalize_scores([1.0, float("nan")])


def test_a_spread_at_the_tie_threshold_counts_as_a_tie():
    """TIE_EPS is "at or below": a spread of exactly TIE_EPS is a tie, under both normalisations."""
    assert TIE_EPS == 1e-12
    # [0, 2e-12]: max - min is 2e-12 (no tie); the population std is exactly 1e-12 (a tie)
    assert normalize_scores([0.0, 2e-12], "zscore") == [0.0, 0.0]
    assert normalize_scores([0.0, 1e-12], "minmax") == [1.0, 1.0]
    assert normalize_scores([0.0, 2e-12], "minmax") == [0.0, 1.0]
    assert normalize_scores([0.0, 4e-12], "zscore") == pytest.approx([-1.0, 1.0])


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


def test_a_missing_models_extra_names_the_install_command():
    """Without torch a reranker failed with a bare "No module named 'torch'"."""
    import subprocess
    import sys

    code = ("import sys\n"
            "for m in ('torch', 'transformers', 'sentence_transformers', 'FlagEmbedding'):\n"
            "    sys.modules[m] = None  # as if the 'models' extra were not installed\n"
            "from funnel_core import Unit\n"
            "from funnel_core.rerank.cross_encoder import CrossEncoderScorer\n"
            "try:\n"
            "    CrossEncoderScorer(model='some/model')('q', [Unit(id='a', text='t')])\n"
            "except ImportError as exc:\n"
            "    print(exc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert 'pip install "funnel-rag[models]"' in out.stdout, out.stdout + out.stderr
    assert "torch" in out.stdout


@pytest.mark.parametrize("name", ["/nonexistent/x", "./models/ce", "~/ce", "a/b/c"])
def test_a_missing_local_folder_is_not_sent_to_the_hub(name):
    """A missing local path was answered with `huggingface-cli download
    /nonexistent/x` (a command that cannot work for a path)."""
    from funnel_core.errors import ModelLoadError
    from funnel_core.models import load_pretrained

    def loader(path):
        raise OSError(f"Repo id must be in the form 'namespace/repo_name': {path!r}")

    with pytest.raises(ModelLoadError, match="no folder") as info:
        load_pretrained(loader, name, "cross-encoder")
    assert "huggingface-cli" not in str(info.value) and name in str(info.value)
    with pytest.raises(ModelLoadError, match="huggingface-cli download org/model"):
        load_pretrained(loader, "org/model", "cross-encoder")  # a hub name: download it
