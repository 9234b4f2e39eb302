"""Every adapter that holds a ``funnel_core`` stage (``.stage``, ``.forward`` for FB-RAG, the
core splitter of LangChain's granularity splitters):
each of the stage's settings is an attribute of the adapter, and an edit of it
(``retriever.k = 1``) reaches the stage the adapter runs. The classes come from both packages'
``__all__`` through the cases of ``test_every_adapter_class``, so a new adapter is checked too.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from langchain_core.language_models.fake import FakeListLLM
from llama_index.core.llms import MockLLM
from pydantic import BaseModel

import langchain_funnel as lc
import llama_index_funnel as li
from funnel_core.settings import setting_names
from tests.adapters.test_every_adapter_class import CONTEXT, LC_CASES, LI_CASES, Ctx, Q, texts

pytestmark = pytest.mark.models

#: Adapter attribute -> stage setting where the framework's own name differs.
RENAMED = {"similarity_top_k": "top_k"}
#: Stage settings an adapter does not expose as an attribute of the same name, and why.
NOT_EXPOSED = {
    "llm": "a framework LLM is wrapped into a provider before the stage gets it",
    "token_counter": "a callable, not a setting one edits",
    "embedder": "a shared, already loaded model object",
    "scorer": "a shared, already loaded model object",
    "router": "a trained model object",
    "eta_backward": "derived from variant; edited through variant",
    "eta_forward": "derived from variant; edited through variant",
    "name": "the stage name in traces",
    "model": "a load-time setting; edits of it drop the model (tested elsewhere)",
}
CASES = [("li", n, c) for n, c in LI_CASES.items()] + [("lc", n, c) for n, c in LC_CASES.items()]


def _inner(obj: Any) -> Any:
    if obj.__dict__.get("_core") is not None:  # LangChain's granularity splitters
        return obj.__dict__["_core"]
    for attr in ("forward", "stage"):
        try:
            inner = getattr(obj, attr)
        except AttributeError:
            continue
        if hasattr(type(inner), "__init__") and type(inner).__module__.startswith("funnel_core"):
            return inner
    return None


def _another(value: Any) -> Any:
    """A different value of the same kind, or ``None`` when there is no obvious one."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value / 2 if value else 0.25
    return None


@pytest.mark.parametrize("fw,name,case", CASES, ids=[f"{fw}-{n}" for fw, n, _ in CASES])
def test_every_setting_edit_reaches_the_inner_stage(fw, name, case, request):
    build, _use = case
    obj = build(Ctx(request))
    inner = _inner(obj)
    if inner is None:
        pytest.skip(f"{name} holds no funnel_core stage")
    renamed = {v: k for k, v in RENAMED.items()}
    # an adapter that takes its stage's settings as **settings must expose each of them; a
    # pydantic adapter declares the ones it offers as fields
    takes_settings = not isinstance(obj, BaseModel) and any(
        p.kind is inspect.Parameter.VAR_KEYWORD
        for p in inspect.signature(type(obj).__init__).parameters.values())
    for setting in setting_names(type(inner)):
        attr = setting if hasattr(obj, setting) else renamed.get(setting, setting)
        if setting in NOT_EXPOSED:
            continue
        if not hasattr(obj, attr):
            assert not takes_settings, f"{name} does not expose its stage's setting {setting!r}"
            continue
        new = _another(getattr(obj, attr))
        if new is None:
            continue
        try:
            setattr(obj, attr, new)
        except (ValueError, TypeError):  # e.g. a probability already at its bound
            continue
        assert getattr(_inner(obj), setting) == new, f"{name}.{attr} = {new!r} did not reach the stage"
        assert getattr(obj, attr) == new


def test_llamaindex_forward_lookup_k_edit_changes_what_it_returns():
    fr = li.ForwardLookupRetriever(MockLLM(max_tokens=3), context=CONTEXT, variant="B",
                                   chunk_words=12)
    assert len(fr.retrieve(Q)) == 3
    fr.k = 1
    assert len(fr.retrieve(Q)) == 1
    fr.chunk_words = 6  # the context is chunked again
    assert max(len(t.split()) for t in texts(n.node for n in fr.retrieve(Q))) <= 6
    fr.variant = "F"
    assert (fr.forward.eta_backward, fr.forward.eta_forward) == (0.0, 1.0)
    with pytest.raises(ValueError):
        fr.k = 0
    assert fr.k == 1


def test_llamaindex_forward_transform_samples_edit_is_honoured():
    tr = li.ForwardLookupQueryTransform(MockLLM(max_tokens=3), context=CONTEXT, samples=1,
                                        chunk_words=20)
    assert len(tr.run(Q).samples) == 1
    tr.samples = 2
    assert len(tr.run(Q).samples) == 2


def test_langchain_forward_lookup_k_edit_changes_what_it_returns():
    fr = lc.ForwardLookupRetriever(llm=FakeListLLM(responses=["A: x"] * 99), context=CONTEXT,
                                   variant="B", chunk_words=12)
    assert len(fr.invoke(Q)) == 3
    fr.k = 1
    assert len(fr.invoke(Q)) == 1
