"""``library="flagembedding"`` where FlagEmbedding is installed but does not import (FlagEmbedding
1.4.2 with transformers 5, as in this project's own ``[models]`` install): the error says which
versions disagree and what to use instead, never to install what is installed."""

from __future__ import annotations

import importlib.util

import pytest

from funnel_core.models import flagembedding_error, missing_extra
from funnel_core.rerank.cross_encoder import CrossEncoderScorer


def _flagembedding_imports() -> bool:
    try:
        import FlagEmbedding  # noqa: F401
    except ImportError:
        return False
    return True


def test_an_installed_package_missing_a_module_is_a_version_conflict_not_a_missing_extra():
    err = missing_extra(ModuleNotFoundError("No module named 'transformers.not_a_module'",
                                            name="transformers.not_a_module"))
    msg = str(err)
    assert "transformers" in msg and "is installed" in msg and "version conflict" in msg
    assert "pip install" not in msg
    gone = missing_extra(ModuleNotFoundError("No module named 'gguf'", name="gguf")) \
        if importlib.util.find_spec("gguf") is None else None
    if gone is not None:  # really missing: the extra to install is named
        assert 'pip install "funnel-rag[models]"' in str(gone)


def test_flagembedding_error_names_the_conflict_and_the_alternative():
    if importlib.util.find_spec("FlagEmbedding") is None:
        pytest.skip("FlagEmbedding is not installed here")
    msg = str(flagembedding_error(ModuleNotFoundError(
        "No module named 'transformers.modeling_attn_mask_utils'",
        name="transformers.modeling_attn_mask_utils")))
    assert "is installed but cannot be imported" in msg and "transformers.modeling_attn_mask_utils" in msg
    # the fix is the flagembedding extra (it brings transformers<5), never the models extra again
    assert "library='sentence-transformers'" in msg and '"funnel-rag[flagembedding]"' in msg
    assert "funnel-rag[models]" not in msg


def test_a_missing_flagembedding_names_its_own_extra():
    """FlagEmbedding is not in the models extra (it does not import with transformers 5): where it
    is missing, the error names the extra that installs it with a transformers it imports with."""
    if importlib.util.find_spec("FlagEmbedding") is not None:
        pytest.skip("FlagEmbedding is installed here")
    msg = str(flagembedding_error(ModuleNotFoundError("No module named 'FlagEmbedding'", name="FlagEmbedding")))
    assert 'pip install "funnel-rag[flagembedding]"' in msg and "library='sentence-transformers'" in msg


def test_the_models_extra_leaves_flagembedding_out_and_its_extra_pins_transformers():
    from pathlib import Path

    import tomllib

    extras = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert not any(d.lower().startswith("flagembedding") for d in extras["models"])
    assert any(d.startswith("FlagEmbedding") for d in extras["flagembedding"])
    assert "transformers>=4.45,<5" in extras["flagembedding"]


@pytest.mark.models
def test_the_flagembedding_library_fails_with_what_to_do(tiny_cross_encoder_path):
    """Where FlagEmbedding is installed but does not import here, scoring through it raises the
    explained error (with the installed versions); where it imports, it scores."""
    if importlib.util.find_spec("FlagEmbedding") is None:
        pytest.skip("FlagEmbedding is not installed here")
    scorer = CrossEncoderScorer(tiny_cross_encoder_path, library="flagembedding", device="cpu")
    if _flagembedding_imports():
        assert len(scorer.score("a query", ["a text", "another"])) == 2
        return
    with pytest.raises(ImportError) as err:
        scorer.score("a query", ["a text"])
    msg = str(err.value)
    assert "FlagEmbedding" in msg and "is installed but cannot be imported" in msg
    assert "library='sentence-transformers'" in msg and "funnel-rag[models]" not in msg
