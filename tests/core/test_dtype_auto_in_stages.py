"""``dtype="auto"`` in every scorer, embedder and trainer.

The hardware *facts* are faked (``funnel_core.hardware.cpu_flags`` returns the flags of an
AVX2-only CPU or of one with AVX-512-BF16); what is checked is what the stages do with them:
the precision they resolve to, that the model really computes in it (a global forward hook
records the dtype every ``nn.Linear`` returns while the stage runs: bf16 under autocast, fp32
otherwise; or the dtype of the loaded weights), that an explicit bf16 request on a CPU without
native bf16 warns once, and that bf16 scores rank like fp32 scores on tiny real models.
"""

from __future__ import annotations

import contextlib
import warnings

import numpy as np
import pytest

from funnel_core import hardware
from funnel_core.embeddings import SentenceEmbedder
from funnel_core.llm import TransformersLLM
from funnel_core.rerank.attention_lm import AttentionLMScorer
from funnel_core.rerank.fid import FiDAttentionScorer
from funnel_core.rerank.monot5 import MonoT5Scorer
from funnel_core.rerank.rankrag import RankRAGScorer

AVX2 = frozenset({"sse4_2", "avx2", "fma"})
AVX512_BF16 = AVX2 | {"avx512f", "avx512_bf16"}

QUERY = "who wrote the tragedy Hamlet?"
TEXTS = [
    "Hamlet is a tragedy written by William Shakespeare around 1600.",
    "Paris is the capital and most populous city of France.",
    "BM25 ranks documents by term frequency and inverse document frequency.",
    "Shakespeare was an English playwright, poet and actor.",
    "The Eiffel Tower is a wrought-iron lattice tower in Paris.",
    "Dense retrieval encodes queries and documents into vectors.",
]


@pytest.fixture
def cpu(monkeypatch):
    """``cpu(flags)`` makes this machine look like a CPU with ``flags`` (and forgets warnings)."""
    monkeypatch.setattr(hardware, "_WARNED", set())

    def set_flags(flags):
        monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset(flags))

    return set_flags


@contextlib.contextmanager
def linear_dtypes():
    """The dtypes every ``nn.Linear`` of any model returned inside the block."""
    import torch

    seen: list = []

    def hook(module, args, out):
        if isinstance(module, torch.nn.Linear) and isinstance(out, torch.Tensor):
            seen.append(out.dtype)

    handle = torch.nn.modules.module.register_module_forward_hook(hook)
    try:
        yield seen
    finally:
        handle.remove()


def _stages(paths):
    t5, llama, minilm = paths
    return {
        "monot5": lambda **kw: MonoT5Scorer(t5, device="cpu", max_length=64, **kw),
        "fid": lambda **kw: FiDAttentionScorer(model=t5, device="cpu", **kw),
        "attention_lm": lambda **kw: AttentionLMScorer(model=llama, device="cpu", **kw),
        "embedder": lambda **kw: SentenceEmbedder(minilm, device="cpu", cache=False, **kw),
    }


def _run(name, stage):
    if name == "embedder":
        return [float(x) for x in stage.encode([QUERY, *TEXTS])[1:] @ stage.encode([QUERY])[0]]
    return stage.score(QUERY, TEXTS)


@pytest.fixture(scope="module")
def paths(tiny_t5_path, tiny_llama_path, minilm_path):
    return tiny_t5_path, tiny_llama_path, minilm_path


STAGES = ["monot5", "fid", "attention_lm", "embedder"]


@pytest.mark.parametrize("name", STAGES)
def test_auto_follows_the_cpu_and_the_model_computes_in_it(name, paths, cpu):
    import torch

    make = _stages(paths)[name]
    cpu(AVX2)
    fp32 = make()
    assert fp32.dtype == "auto" and fp32.active_dtype is None      # nothing loaded yet
    with linear_dtypes() as seen:
        _run(name, fp32)
    assert fp32.active_dtype == "float32" and seen and set(seen) == {torch.float32}

    cpu(AVX512_BF16)
    bf16 = make()
    with linear_dtypes() as seen:
        _run(name, bf16)
    assert bf16.active_dtype == "bfloat16"
    assert seen.count(torch.bfloat16) > len(seen) // 2, set(seen)  # autocast: bf16 matmuls
    model = bf16.model if name != "monot5" else bf16._model.get().model
    assert all(p.dtype == torch.float32 for p in model.parameters())  # weights stay fp32

    cpu(AVX512_BF16)
    pinned = make(dtype="float32")                                  # an explicit choice wins
    with linear_dtypes() as seen:
        _run(name, pinned)
    assert pinned.active_dtype == "float32" and set(seen) == {torch.float32}


@pytest.mark.parametrize("name", STAGES)
def test_explicit_bf16_on_a_cpu_without_it_warns_once(name, paths, cpu):
    make = _stages(paths)[name]
    cpu(AVX2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            stage = make(dtype="bfloat16")
            _run(name, stage)
            assert stage.active_dtype == "bfloat16"                 # honoured, but slow here
    assert len([w for w in caught if "25-30x" in str(w.message)]) == 1


def test_dtype_is_the_one_precision_setting(paths, cpu):
    stages = _stages(paths)
    cpu(AVX512_BF16)
    mono = stages["monot5"](dtype="float32")
    mono.score(QUERY, TEXTS[:2])
    assert mono.active_dtype == "float32"
    for name in ("monot5", "fid", "attention_lm"):
        with pytest.raises(TypeError, match=r"'fp16'.*accepted.*'dtype'"):  # the old flag: gone
            stages[name](fp16=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fid = stages["fid"](dtype="float16")                        # no fp16 on a CPU
        fid.score(QUERY, TEXTS[:2])
    assert fid.active_dtype == "float32" and any("float16" in str(w.message) for w in caught)


def _spearman(a, b):
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


@pytest.mark.parametrize("name", STAGES)
def test_bf16_ranks_like_fp32(name, paths):
    make = _stages(paths)[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                             # bf16 may be emulated here
        a = _run(name, make(dtype="float32"))
        b = _run(name, make(dtype="bfloat16"))
    assert a != b                                                   # bf16 really ran
    assert int(np.argmax(a)) == int(np.argmax(b))
    assert _spearman(a, b) >= 0.9, (a, b)
    assert np.allclose(a, b, rtol=0.05, atol=0.05 * float(np.ptp(a)))


def test_monot5_logits_stay_fp32_under_bf16(paths, cpu):
    import torch

    cpu(AVX512_BF16)
    m = _stages(paths)["monot5"]().load()
    model = m._model.get().model
    out = []
    handle = model.get_output_embeddings().register_forward_hook(lambda mod, a, o: out.append(o.dtype))
    try:
        m.score(QUERY, TEXTS[:2])
    finally:
        handle.remove()
    assert m.active_dtype == "bfloat16" and out == [torch.float32]


# -- LLM weights (RankRAG) -------------------------------------------------------------------
def test_llm_weights_follow_the_cpu_and_rankrag_reports_them(tiny_llama_path, cpu):
    import torch

    cpu(AVX2)
    llm = TransformersLLM(tiny_llama_path, device="cpu")
    assert llm.active_dtype is None
    llm.next_token_logprobs([QUERY], ["True", "False"])
    assert llm.active_dtype == "float32"
    assert all(p.dtype == torch.float32 for p in llm._model.get()[0].parameters())

    cpu(AVX512_BF16)
    scorer = RankRAGScorer(llm=tiny_llama_path, device="cpu", mode="logprobs")
    assert scorer.llm.dtype == "auto"
    scorer.score(QUERY, TEXTS[:2])
    model = scorer.llm._model.get()[0]
    assert scorer.active_dtype == "bfloat16"
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    explicit = TransformersLLM(tiny_llama_path, device="cpu", dtype="float32")
    explicit.next_token_logprobs([QUERY], ["True"])
    assert explicit.active_dtype == "float32"                       # the one precision setting


def test_rankrag_config_carries_dtype(tiny_llama_path, cpu):
    cpu(AVX512_BF16)
    scorer = RankRAGScorer(llm=tiny_llama_path, device="cpu", dtype="float32")
    assert scorer.to_dict()["dtype"] == "float32" and scorer.llm.dtype == "float32"
    again = RankRAGScorer.from_dict(scorer.to_dict())
    assert again.llm.dtype == "float32"
    obj = RankRAGScorer(llm=TransformersLLM(tiny_llama_path, device="cpu"), dtype="float32")
    assert obj.llm.dtype == "auto"                                   # an LLM object keeps its own


def test_bf16_llm_logprobs_rank_like_fp32_and_do_not_tie(tiny_llama_path):
    import torch

    prompts = [f"Passage: {t}\n\nIs it relevant to: {QUERY}" for t in TEXTS]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fp32 = TransformersLLM(tiny_llama_path, device="cpu", dtype="float32")
        bf16 = TransformersLLM(tiny_llama_path, device="cpu", dtype="bfloat16")
        a = [t - f for t, f in fp32.next_token_logprobs(prompts, ["True", "False"])]
        model = bf16._model.get()[0]
        seen, forward = [], model.forward

        def logits_dtype(*args, **kwargs):
            out = forward(*args, **kwargs)
            seen.append(out.logits.dtype)
            return out

        model.forward = logits_dtype
        try:
            b = [t - f for t, f in bf16.next_token_logprobs(prompts, ["True", "False"])]
        finally:
            del model.forward
    assert bf16.active_dtype == "bfloat16" and a != b
    assert seen and set(seen) == {torch.float32}                    # logits recomputed in fp32
    assert len(set(b)) == len(b)                                     # no bf16 steps, no ties
    assert int(np.argmax(a)) == int(np.argmax(b)) and _spearman(a, b) >= 0.9


# -- trainers --------------------------------------------------------------------------------
def _fid_examples():
    from funnel_core.train.fid import FiDExample

    return [FiDExample(question=QUERY, answers=["Shakespeare"], passages=TEXTS[:2])] * 2


@pytest.mark.parametrize("flags,kw,expected", [
    (AVX2, {}, "float32"),
    (AVX512_BF16, {}, "bfloat16"),
    (AVX512_BF16, {"dtype": "float32"}, "float32"),
    (AVX2, {"bf16": True}, "bfloat16"),                              # the old flag: explicit
])
def test_train_fid_precision(flags, kw, expected, tiny_t5_path, tmp_path, cpu):
    import torch

    from funnel_core.train.fid import train_fid

    cpu(flags)
    with linear_dtypes() as seen, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = train_fid(tiny_t5_path, _fid_examples(), tmp_path / "fid", n_passages=2,
                        batch_size=2, max_length=32, progress=False, device="cpu", **kw)
    assert res.dtype == expected
    assert (torch.bfloat16 in seen) == (expected == "bfloat16")
    assert any("25-30x" in str(w.message) for w in caught) == ("bf16" in kw)


@pytest.mark.parametrize("lora", [True, False])
def test_train_rankrag_precision(lora, tiny_llama_path, tmp_path, cpu):
    import torch

    from funnel_core.train.rankrag import RankRAGExample, train_rankrag

    examples = [RankRAGExample(f"Passage: {t}\n\nQuestion: {QUERY}", "True" if i == 0 else "False")
                for i, t in enumerate(TEXTS[:4])]
    for flags, expected in ((AVX2, "float32"), (AVX512_BF16, "bfloat16")):
        cpu(flags)
        llm = TransformersLLM(tiny_llama_path, device="cpu", dtype="float32")
        with linear_dtypes() as seen:
            res = train_rankrag(llm, examples, tmp_path / f"out-{expected}-{lora}", lora=lora,
                                lora_r=4, target_modules=("q_proj", "v_proj"), batch_size=2)
        assert res.config["dtype"] == expected
        assert (torch.bfloat16 in seen) == (expected == "bfloat16")
        assert np.isfinite(res.step_losses).all()


def test_full_fine_tuning_upcasts_half_weights(tiny_llama_path, tmp_path, cpu):
    import torch

    from funnel_core.train.rankrag import RankRAGExample, train_rankrag

    cpu(AVX512_BF16)
    llm = TransformersLLM(tiny_llama_path, device="cpu")               # bf16 weights here
    llm._model.get()                                                   # load it
    assert llm.active_dtype == "bfloat16"
    res = train_rankrag(llm, [RankRAGExample("Is it true?", "True")] * 2, tmp_path / "full",
                        lora=False, batch_size=2)
    assert res.config["base_weights_dtype"] == "float32" and llm.active_dtype == "float32"
    assert all(p.dtype == torch.float32 for p in llm._model.get()[0].parameters())


def test_extractive_compressor_passes_dtype_to_its_embedder(minilm_path, cpu):
    from funnel_core.best_practices.compress import ExtractiveCompressor

    cpu(AVX512_BF16)
    comp = ExtractiveCompressor(model=minilm_path, device="cpu", dtype="float32")
    assert comp.to_dict()["dtype"] == "float32" and comp.embedder.dtype == "float32"
    assert ExtractiveCompressor.from_dict(comp.to_dict()).embedder.dtype == "float32"
    comp.embedder.encode(["a sentence"])
    assert comp.embedder.active_dtype == "float32"
    assert ExtractiveCompressor(model=minilm_path, device="cpu").embedder.dtype == "auto"


# -- offline embedding jobs ------------------------------------------------------------------
def test_embed_texts_runs_in_the_dtype_asked_for(minilm_path, tmp_path, cpu):
    import torch

    from funnel_core import offline

    texts = [QUERY, *TEXTS]
    cpu(AVX512_BF16)                                                # "auto" would pick bf16 here
    with linear_dtypes() as seen:
        offline.embed_texts(texts, tmp_path / "fp32", model=minilm_path, dtype="float32")
    assert seen and set(seen) == {torch.float32}
    _, fp32 = offline.read_embeddings(tmp_path / "fp32")
    reference = SentenceEmbedder(minilm_path, device="cpu", cache=False, dtype="float32").encode(texts)
    np.testing.assert_allclose(fp32, reference, atol=1e-5)

    with linear_dtypes() as seen:
        offline.embed_texts(texts, tmp_path / "auto", model=minilm_path)
    assert seen.count(torch.bfloat16) > len(seen) // 2
    _, auto = offline.read_embeddings(tmp_path / "auto")
    assert not np.array_equal(auto, fp32)                           # bf16 really ran
    np.testing.assert_allclose(auto, fp32, atol=0.05)


def test_embed_texts_rejects_an_unknown_dtype_before_writing(tmp_path):
    from funnel_core import offline

    with pytest.raises(ValueError, match="'fp8'"):
        offline.embed_texts(["a"], tmp_path / "out", dtype="fp8")
    assert not (tmp_path / "out").exists()
