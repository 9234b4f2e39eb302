"""Shared fixtures: offline mode, tiny local models (built once per session), small corpora."""

from __future__ import annotations

import os
import time

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
def ranx_loaded() -> None:
    """ranx loads its numba-compiled metrics on the first evaluation of a process (2-5 s here, once):
    a cost of the process, not of whichever test happens to come first. Modules whose tests compute
    IR metrics use this fixture, so the fast tier's 2-second rule times their own work."""
    from funnel_core.evaluation.metrics import ir_metrics_per_query

    ir_metrics_per_query({"q": {"d": 1}}, {"q": {"d": 1.0, "e": 0.5}},
                         ["ndcg@10", "recall@10", "mrr", "map@10", "precision@1", "hit_rate@10"])


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
# Tiers come from rules, never from lists of names (tests/README.md):
# * a test that uses a model fixture is marked `models` (tiny random models) or also `slow` (a real
#   packaged model); a module or test that builds models itself says so with `pytest.mark.models`;
# * the frameworks' own standard suites are `framework_standard`;
# * everything else is `fast`, and `--tier-check` (make test-fast) fails a `fast` test that takes
#   longer than FAST_SECONDS: a new slow test cannot hide in the quick tier.
_TINY_MODEL_FIXTURES = {"model_dir", "tiny_cross_encoder_path", "tiny_t5_path", "tiny_llama_path"}
_REAL_MODEL_FIXTURES = {"minilm_path"}
FAST_SECONDS = 2.0


def pytest_addoption(parser):
    parser.addoption("--tier-check", action="store_true",
                     help=f"fail tests of the fast tier that take over {FAST_SECONDS} s")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if not isinstance(item, pytest.Function):  # notebooks (nbmake) run models
            item.add_marker(pytest.mark.models)
            continue
        fixtures = set(getattr(item, "fixturenames", ()))
        cls = getattr(item, "cls", None)
        standard = cls is not None and any(b.__module__.startswith("langchain_tests")
                                           for b in cls.__mro__[1:])
        if standard:
            item.add_marker(pytest.mark.framework_standard)
        if fixtures & _REAL_MODEL_FIXTURES:
            item.add_marker(pytest.mark.slow)
        if fixtures & (_TINY_MODEL_FIXTURES | _REAL_MODEL_FIXTURES) or item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.models)
        if not (standard or item.get_closest_marker("models") or item.get_closest_marker("ray")):
            item.add_marker(pytest.mark.fast)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    start = time.perf_counter()
    yield
    took = time.perf_counter() - start
    if item.config.getoption("--tier-check") and item.get_closest_marker("fast") and took > FAST_SECONDS:
        pytest.fail(f"{item.nodeid} is in the fast tier but took {took:.1f} s (> {FAST_SECONDS} s): "
                    "mark it `pytest.mark.slow` (or `models`), or make it faster.", pytrace=False)
