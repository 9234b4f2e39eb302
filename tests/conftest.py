"""Shared fixtures: offline mode, tiny local models (built once per session), small corpora."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ.setdefault("TQDM_DISABLE", "1")

import pytest

from funnel_core import testing
from funnel_core.units import Unit

CORPUS = [
    ("d0", "Paris is the capital and most populous city of France.", {"topic": "geo", "title": "Paris"}),
    ("d1", "Berlin is the capital of Germany and its largest city.", {"topic": "geo", "title": "Berlin"}),
    ("d2", "The Eiffel Tower is a wrought-iron lattice tower in Paris, France.", {"topic": "geo", "title": "Paris"}),
    ("d3", "BM25 is a ranking function used by search engines to rank documents.", {"topic": "ir", "title": "BM25"}),
    ("d4", "A cross-encoder reads the query and the document together and outputs a score.", {"topic": "ir", "title": "Reranking"}),
    ("d5", "Hamlet is a tragedy written by William Shakespeare around 1600.", {"topic": "lit", "title": "Hamlet"}),
    ("d6", "Shakespeare was an English playwright, poet and actor.", {"topic": "lit", "title": "Shakespeare"}),
    ("d7", "Dense retrieval encodes queries and documents into vectors with a neural network.", {"topic": "ir", "title": "Dense"}),
]


@pytest.fixture(scope="session")
def corpus_units() -> list[Unit]:
    return [Unit(id=i, text=t, metadata=dict(m), level="document") for i, t, m in CORPUS]


@pytest.fixture
def source_linked_nodes(corpus_units):
    """The corpus as LlamaIndex TextNodes, each with a SOURCE relationship ("src-<id>") so tests
    can check that results are copies of the caller's nodes."""
    from llama_index.core.schema import NodeRelationship, RelatedNodeInfo, TextNode

    out = []
    for u in corpus_units:
        n = TextNode(id_=u.id, text=u.text, metadata=dict(u.metadata))
        n.relationships[NodeRelationship.SOURCE] = RelatedNodeInfo(node_id=f"src-{u.id}")
        out.append(n)
    return out


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def tiny_cross_encoder_path(model_dir) -> str:
    return testing.tiny_cross_encoder(model_dir / "cross_encoder")


@pytest.fixture(scope="session")
def tiny_t5_path(model_dir) -> str:
    return testing.tiny_t5(model_dir / "t5")


@pytest.fixture(scope="session")
def tiny_llama_path(model_dir) -> str:
    return testing.tiny_llama(model_dir / "llama")


@pytest.fixture(scope="session")
def minilm_path() -> str:
    return testing.minilm_path()


# -- test tiers ---------------------------------------------------------------------------------
# `pytest -m "not models"` is the quick tier (no model is built or loaded); `framework_standard`
# marks the frameworks' own standard suites; the rest is `fast`.
_MODEL_FIXTURES = {"model_dir", "tiny_cross_encoder_path", "tiny_t5_path", "tiny_llama_path",
                   "minilm_path"}
_MODEL_MODULES = {"test_l2g", "test_fid", "test_attention_lm", "test_mog_core", "test_llm",
                  "test_best_practices_core", "test_best_practices_llamaindex",
                  "test_best_practices_langchain", "test_cli"}
_MODEL_TESTS = {"test_mog_retriever_in_query_engine_with_trained_router"}  # trains a router


def pytest_collection_modifyitems(config, items):
    for item in items:
        if not isinstance(item, pytest.Function):  # notebooks (nbmake) run models: no tier rules
            item.add_marker(pytest.mark.models)
            continue
        mod = getattr(item, "module", None)
        module = mod.__name__.rsplit(".", 1)[-1] if mod else ""
        cls = getattr(item, "cls", None)
        standard = cls is not None and any(b.__module__.startswith("langchain_tests")
                                           for b in cls.__mro__[1:])
        if standard:
            item.add_marker(pytest.mark.framework_standard)
        if (_MODEL_FIXTURES & set(getattr(item, "fixturenames", ())) or module in _MODEL_MODULES
                or item.originalname in _MODEL_TESTS):
            item.add_marker(pytest.mark.models)
        elif not standard:
            item.add_marker(pytest.mark.fast)
