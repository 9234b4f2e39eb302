"""RankRAG instruction tuning (funnel_core.train.rankrag) on a tiny random Llama.

Would catch: a blend with the wrong labels or without QA examples, a loss on the prompt tokens
(labels not -100 there), training on a prompt that is not the one the scorer sends (chat template
/ system prompt missing), a missing end-of-turn token, LoRA adapters that are not merged into
the saved checkpoint, and a trainer that does not move P(True) towards the labels.
"""

from __future__ import annotations

import pytest

from funnel_core.rerank.rankrag import RankRAGScorer

RECORDS = [
    {"question": "who wrote Hamlet?", "answers": ["Shakespeare"],
     "positive": "Hamlet is a tragedy by Shakespeare.", "negatives": ["Paris is in France.", "x y"]},
    {"question": "capital of France?", "answers": ["Paris"],
     "positive": "Paris is the capital of France.", "negatives": ["Berlin is in Germany."]},
    {"question": "what ranks documents?", "answers": ["BM25"],
     "positive": "BM25 ranks documents.", "negatives": ["Hamlet is a tragedy."]},
]
PROMPT = "Passage: {passage}\n\nFor the question {question}, is the passage relevant? Answer True or False."


def test_blend_labels_and_qa_share():
    from funnel_core.train.rankrag import rankrag_blend

    blend = rankrag_blend(RECORDS, rank_prompt=PROMPT, negatives_per_question=2, qa_share=1.0)
    rank = [e for e in blend if e.kind == "rank"]
    qa = [e for e in blend if e.kind == "qa"]
    assert sum(e.target == "True" for e in rank) == 3
    assert sum(e.target == "False" for e in rank) == 4      # 2 + 1 + 1 negatives
    for e in rank:
        positive = any(r["positive"] in e.prompt for r in RECORDS)
        assert (e.target == "True") == positive
    assert sorted(e.target for e in qa) == ["BM25", "Paris", "Shakespeare"]
    assert not [e for e in rankrag_blend(RECORDS, rank_prompt=PROMPT, qa_share=0.0) if e.kind == "qa"]
    many = [dict(RECORDS[0], question=f"q{i}?") for i in range(32)]
    for share, expect in ((0.25, 8), (0.5, 16)):          # an exact share, not a coin per question
        qa_n = [sum(e.kind == "qa" for e in rankrag_blend(many, rank_prompt=PROMPT, qa_share=share, seed=s))
                for s in range(5)]
        assert qa_n == [expect] * 5, qa_n
    with pytest.raises(ValueError, match="qa_share"):
        rankrag_blend(RECORDS, rank_prompt=PROMPT, qa_share=2.0)


def test_encoded_example_is_the_scorers_prompt_plus_target(tiny_llama_path):
    from funnel_core.llm import TransformersLLM
    from funnel_core.train.rankrag import RankRAGExample, encode_example

    llm = TransformersLLM(tiny_llama_path, device="cpu", system_prompt="Be brief.")
    tok = llm.tokenizer
    ex = RankRAGExample(prompt="is it relevant?", target="True")
    ids, labels = encode_example(tok, llm.format_prompt, ex, max_length=512)
    text = llm.format_prompt("is it relevant?")
    assert "Be brief." in text and "<|im_start|>assistant" in text
    prompt_ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids[:len(prompt_ids)] == prompt_ids
    assert labels[:len(prompt_ids)] == [-100] * len(prompt_ids)
    target = tok("True", add_special_tokens=False)["input_ids"]
    assert labels[len(prompt_ids):] == target + [tok.convert_tokens_to_ids("<|im_end|>")]
    short_ids, short_labels = encode_example(tok, llm.format_prompt, ex, max_length=len(target) + 3)
    assert len(short_ids) == len(target) + 3 and short_labels[-len(target) - 1:-1] == target


def _margin(scorer):
    pos = [scorer.score(r["question"], [r["positive"]])[0] for r in RECORDS]
    neg = [scorer.score(r["question"], [r["negatives"][0]])[0] for r in RECORDS]
    return sum(pos) / 3 - sum(neg) / 3


def _keys(folder):
    import glob

    from safetensors import safe_open

    out = {}
    for f in glob.glob(str(folder / "*.safetensors")):
        with safe_open(f, "pt") as h:
            out.update({k: h.get_tensor(k) for k in h.keys()})
    return out


def test_full_tuning_moves_p_true_towards_the_labels(tiny_llama_path, tmp_path):
    from funnel_core.llm import TransformersLLM
    from funnel_core.train.rankrag import rankrag_blend, train_rankrag

    llm = TransformersLLM(tiny_llama_path, device="cpu")
    blend = rankrag_blend(RECORDS, rank_prompt=PROMPT, negatives_per_question=1, qa_share=0.0)
    before = _margin(RankRAGScorer(llm=llm, prompt=PROMPT))
    res = train_rankrag(llm, blend, tmp_path / "tuned", lora=False, epochs=40, batch_size=6,
                        learning_rate=1e-2, warmup_ratio=0.0, seed=0)
    assert res.steps == 40 and res.step_losses[-1] < 0.7 * res.step_losses[0], res.step_losses[::8]
    after = _margin(RankRAGScorer(llm=TransformersLLM(str(tmp_path / "tuned"), device="cpu"), prompt=PROMPT))
    assert after > before + 0.2, (before, after)


def test_lora_adapters_are_trained_and_merged(tiny_llama_path, tmp_path):
    import torch

    from funnel_core.llm import TransformersLLM
    from funnel_core.train.rankrag import rankrag_blend, train_rankrag

    base = _keys(__import__("pathlib").Path(tiny_llama_path))
    llm = TransformersLLM(tiny_llama_path, device="cpu", dtype="float32")  # compared with fp32 base
    blend = rankrag_blend(RECORDS, rank_prompt=PROMPT, negatives_per_question=1, qa_share=0.0)
    res = train_rankrag(llm, blend, tmp_path / "lora", lora=True, epochs=10, batch_size=6,
                        learning_rate=5e-2, warmup_ratio=0.0, seed=0)
    assert res.step_losses[-1] < res.step_losses[0]
    tuned = _keys(tmp_path / "lora")
    assert not any("lora" in k for k in tuned)                  # adapters merged into the weights
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.allclose(tuned[q], base[q])                # the merge changed a target layer
    norm = "model.norm.weight"
    assert torch.equal(tuned[norm], base[norm])                 # a non-target tensor is untouched


@pytest.mark.parametrize("base_dtype", ["float32", "bfloat16"])
def test_adapters_kept_alone_load_as_the_merged_model(tiny_llama_path, tmp_path, base_dtype):
    """merge=False keeps only the LoRA adapters (float16, no full weights); TransformersLLM loads
    that folder onto the base it names, in the dtype the base had in training, and scores as the
    merged model of the same run does (same seed: the same training), not as the base."""
    import json

    import torch

    from funnel_core.llm import TransformersLLM, lora_base
    from funnel_core.train.rankrag import rankrag_blend, train_rankrag

    blend = rankrag_blend(RECORDS, rank_prompt=PROMPT, negatives_per_question=1, qa_share=0.0)
    kw = dict(lora=True, epochs=10, batch_size=6, learning_rate=5e-2, warmup_ratio=0.0, seed=0, dtype="float32")
    for merge in (True, False):
        train_rankrag(TransformersLLM(tiny_llama_path, device="cpu", dtype=base_dtype), blend,
                      tmp_path / str(merge), merge=merge, **kw)
    kept = tmp_path / "False"
    assert not list(kept.glob("model*.safetensors"))
    tensors = _keys(kept)
    assert tensors and all("lora_" in k and v.dtype == torch.float16 for k, v in tensors.items())
    assert json.loads((kept / "adapter_config.json").read_text())["base_model_name_or_path"] == tiny_llama_path
    assert lora_base(str(kept)) == (tiny_llama_path, None, base_dtype) and lora_base(tiny_llama_path) is None

    def scores(folder):
        scorer = RankRAGScorer(llm=TransformersLLM(str(folder), device="cpu", dtype="float32"), prompt=PROMPT)
        return torch.tensor([scorer.score(r["question"], [r["positive"], *r["negatives"]]) for r in RECORDS[1:]])

    merged, alone, base = scores(tmp_path / "True"), scores(kept), scores(tiny_llama_path)
    # float16 adapters: close, not equal (about 1e-6 here; onto a float32 base in place of the
    # bfloat16 one they were trained over, about 1e-4)
    assert torch.allclose(alone, merged, atol=1e-5), (alone - merged).abs().max()
    assert not torch.allclose(alone, base, atol=2e-3)


def test_adapters_kept_alone_name_the_packaged_smollm2_portably(tmp_path):
    from funnel_core.llm import lora_base
    from funnel_core.models import SMOLLM2_GGUF, smollm2_path

    (tmp_path / "adapter_config.json").write_text('{"base_model_name_or_path": "smollm2"}')
    assert lora_base(str(tmp_path)) == (str(smollm2_path()), SMOLLM2_GGUF, None)
    (tmp_path / "adapter_config.json").write_text('{"peft_type": "LORA"}')
    with pytest.raises(ValueError, match="names no base model"):
        lora_base(str(tmp_path))


def test_adapters_over_another_gguf_are_refused_before_training(tmp_path):
    from funnel_core.llm import TransformersLLM
    from funnel_core.train.rankrag import RankRAGExample, train_rankrag

    llm = TransformersLLM(str(tmp_path), gguf_file="other.gguf")  # never loaded: refused first
    with pytest.raises(ValueError, match="other.gguf"):
        train_rankrag(llm, [RankRAGExample("p", "True")], tmp_path / "out", merge=False)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.skipif(not __import__("os").environ.get("FUNNEL_SLOW"),
                    reason="set FUNNEL_SLOW=1 (loads SmolLM2 from its GGUF file, ~1 min)")
def test_a_model_loaded_from_gguf_is_saved_as_a_plain_checkpoint(tmp_path):
    # transformers refuses to save a GGUF-loaded model ("quantized with gguf ... not serializable")
    # and would write a quantization_config pointing at the GGUF file: a whole training run would
    # crash at its very end. The saved folder must load with a plain from_pretrained.
    import json

    import torch
    from transformers import AutoModelForCausalLM

    from funnel_core.llm import TransformersLLM
    from funnel_core.testing import SMOLLM2_GGUF, smollm2_path
    from funnel_core.train.rankrag import RankRAGExample, train_rankrag

    # float32: the reloaded checkpoint is compared in float32 below
    llm = TransformersLLM(smollm2_path(), gguf_file=SMOLLM2_GGUF, device="cpu", dtype="float32")
    res = train_rankrag(llm, [RankRAGExample("Passage: Paris is in France. Relevant?", "True")],
                        tmp_path / "tuned", lora=True, epochs=1, batch_size=1, max_length=48)
    assert res.steps == 1
    assert "quantization_config" not in json.loads((tmp_path / "tuned" / "config.json").read_text())
    reloaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "tuned"), dtype=torch.float32)
    trained = llm._model.get()[0]              # the adapters are merged into this very model
    ids = torch.tensor([[1, 504, 3458, 314, 4649, 30]])
    with torch.inference_mode():
        assert torch.allclose(reloaded(input_ids=ids).logits, trained(input_ids=ids).logits, atol=1e-4)
