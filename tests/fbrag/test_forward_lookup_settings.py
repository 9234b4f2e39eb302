"""FB-RAG's ForwardLookup settings: the LangChain retriever's fields and the LlamaIndex retriever
/ query transform settings are the core stage's, edits are honoured at the next call, and bad
values raise errors naming the value and the fix.
Variant "B" (backward-only BM25) is exact and calls no LLM, so the expected chunks are computed
here from the BM25 formula's ingredient, funnel_core.bm25.bm25_scores over the chunks."""

from __future__ import annotations

import pytest
from langchain_core.language_models.fake_chat_models import FakeListChatModel

from funnel_core.bm25 import bm25_scores
from funnel_core.fbrag import ForwardLookup, chunk_context
from funnel_core.settings import setting_names
from langchain_funnel.fbrag import ForwardLookupRetriever as LCForward
from llama_index_funnel.fbrag import ForwardLookupQueryTransform, ForwardLookupRetriever
from tests.conftest import CORPUS

CONTEXT = "\n\n".join(t for _, t, _ in CORPUS)
Q = "Who wrote the tragedy Hamlet?"


def _best_chunks(chunk_words: int, k: int) -> list[str]:
    chunks = chunk_context(CONTEXT, chunk_words)
    scores = bm25_scores(Q, [c.text for c in chunks])
    best = sorted(range(len(chunks)), key=lambda i: -scores[i])[:k]
    return [chunks[i].text for i in sorted(best)]  # order_preserving: original order


def _chat() -> FakeListChatModel:
    return FakeListChatModel(responses=["Rationale: r. Answer: a"])


def _settings(stage: ForwardLookup) -> dict:
    return {k: v for k, v in stage.to_dict().items() if k != "llm"}


def _reference(**settings) -> dict:
    return _settings(ForwardLookup(llm=_chat_provider(), **settings))


def test_langchain_fields_are_the_stage_settings_and_edits_are_honoured():
    r = LCForward(llm=_chat(), context=CONTEXT, variant="B", k=1, chunk_words=12)
    assert set(setting_names(ForwardLookup)) <= set(LCForward.model_fields)
    assert _settings(r.forward) == _reference(eta_backward=1.0, eta_forward=0.0, k=1,
                                              chunk_words=12)
    assert [d.page_content for d in r.invoke(Q)] == _best_chunks(12, 1)
    r.k, r.chunk_words = 2, 8  # honoured at the next call (new chunks, same provider)
    provider = r.forward.llm
    assert [d.page_content for d in r.invoke(Q)] == _best_chunks(8, 2)
    assert r.forward.llm is provider and r.forward.k == 2
    r.eta_forward = 0.25  # overrides the variant's weight
    assert (r.forward.eta_backward, r.forward.eta_forward) == (1.0, 0.25)


def test_llama_index_takes_the_stage_settings():
    from llama_index.core.llms import MockLLM

    r = ForwardLookupRetriever(MockLLM(), context=CONTEXT, variant="B", chunk_words=12)
    # k: 3 in the adapters
    assert _settings(r.forward) == _reference(eta_backward=1.0, eta_forward=0.0, k=3,
                                              chunk_words=12)
    assert [n.node.get_content() for n in r.retrieve(Q)] == _best_chunks(12, 3)
    t = ForwardLookupQueryTransform(MockLLM(), context=CONTEXT, samples=2, chunk_words=12)
    assert _settings(t.forward) == _reference(eta_backward=0.0, eta_forward=1.0, samples=2,
                                              chunk_words=12)
    lc = LCForward(llm=_chat(), context=CONTEXT, variant="B", chunk_words=12)
    assert _settings(lc.forward) == _settings(r.forward)  # the frameworks agree on every default


def test_settings_round_trip():
    fb = ForwardLookup.preset("FB", llm=_chat_provider(), k=2, chunk_words=50)
    assert _settings(fb) == _reference(eta_backward=0.5, eta_forward=0.5, k=2, chunk_words=50,
                                       name="fb_rag[FB]")
    data = fb.to_dict()
    assert data["llm"] is None  # a live provider: not serialised
    with pytest.raises(TypeError, match="llm="):
        ForwardLookup.from_dict(data)
    again = ForwardLookup.from_dict(data, llm=_chat_provider())
    assert again.k == 2 and _settings(again) == _settings(fb)


def _chat_provider():
    from langchain_funnel.llm import LangChainLLM

    return LangChainLLM(_chat())


@pytest.mark.parametrize("make", [
    lambda **kw: LCForward(llm=_chat(), context=CONTEXT, **kw),
    lambda **kw: ForwardLookupRetriever(_chat_provider(), context=CONTEXT, **kw),
], ids=["langchain", "llamaindex"])
def test_bad_values_name_the_value_and_the_fix(make):
    with pytest.raises(ValueError, match=r"unknown FB-RAG variant 'Z'; choose one of \['B', 'F', 'FB'\]"):
        make(variant="Z")
    with pytest.raises(ValueError, match="budget_words=10 is smaller than one chunk.*Raise the budget"):
        make(budget_words=10)
    with pytest.raises(ValueError, match="eta_backward must be a number >= 0, got -1"):
        make(eta_backward=-1.0)
    with pytest.raises(ValueError, match=r"samples \(K"):
        make(samples=0)
    with pytest.raises(ValueError, match="missing {question}|question"):
        make(prompt="Context: {context}")


def test_unknown_setting_is_named_with_the_accepted_ones():
    from llama_index.core.llms import MockLLM

    with pytest.raises(TypeError, match=r"ForwardLookupRetriever got unknown argument\(s\) "
                                        r"\['chunk_size'\]; accepted:.*chunk_words"):
        ForwardLookupRetriever(MockLLM(), context=CONTEXT, chunk_size=30)
    with pytest.raises(TypeError, match=r"ForwardLookupRetriever.*'chunk_size'.*accepted.*chunk_words"):
        LCForward(llm=_chat(), context=CONTEXT, chunk_size=30)


def test_variant_weights_and_provider_settings_agree_across_frameworks():
    """variant, the eta_* overrides and the provider settings mean the same in both adapters."""
    from llama_index.core.llms import MockLLM

    lc = LCForward(llm=_chat(), context=CONTEXT, variant="F", eta_backward=0.2, timeout=9.0)
    li = ForwardLookupRetriever(MockLLM(), context=CONTEXT, variant="F", eta_backward=0.2)
    assert (li.forward.eta_backward, li.forward.eta_forward) == (0.2, 1.0)  # eta_F from "F"
    assert (lc.forward.eta_backward, lc.forward.eta_forward) == (0.2, 1.0)
    assert lc.forward.llm.timeout == 9.0  # the LangChain model is wrapped with the timeout
    lc.variant = "B"  # the override stays, the other weight follows the variant
    assert (lc.forward.eta_backward, lc.forward.eta_forward) == (0.2, 0.0)
    lc.timeout = 3.0
    assert lc.forward.llm.timeout == 3.0
    # a provider built from a name gets gguf_file/device/dtype; an object keeps its own
    named = ForwardLookup(llm="some/folder", gguf_file="m.gguf", device="cpu", timeout=5.0)
    assert (named.llm.gguf_file, named.llm.device, named.llm.timeout) == ("m.gguf", "cpu", 5.0)
    provider = _chat_provider()
    assert ForwardLookup(llm=provider, device="cpu").llm is provider


@pytest.mark.parametrize("make", [
    lambda **kw: LCForward(llm=_chat(), context=CONTEXT, **kw),
    lambda **kw: ForwardLookupRetriever(_chat_provider(), context=CONTEXT, **kw),
], ids=["langchain", "llamaindex"])
def test_variant_edits_move_both_weights_through_every_preset(make):
    """Every variant edit, B -> F included (where setting eta_backward first would pass through
    0 / 0, which the stage refuses), leaves the stage with the new preset's weights, an eta_*
    field that overrides a weight keeps doing so, and a refused variant changes nothing."""
    r = make(variant="B", chunk_words=12)
    for variant, weights in (("F", (0.0, 1.0)), ("B", (1.0, 0.0)), ("FB", (0.5, 0.5)), ("F", (0.0, 1.0))):
        r.variant = variant
        assert (r.variant, r.forward.eta_backward, r.forward.eta_forward) == (variant, *weights)
    r.eta_backward = 0.2
    r.variant = "B"  # the override stays, the other weight follows the variant
    assert (r.forward.eta_backward, r.forward.eta_forward) == (0.2, 0.0)
    with pytest.raises(ValueError, match="unknown FB-RAG variant"):
        r.variant = "Z"
    assert (r.variant, r.forward.eta_backward, r.forward.eta_forward) == ("B", 0.2, 0.0)
