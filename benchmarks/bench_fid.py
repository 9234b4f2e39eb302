"""Attention-based post-ranking (FunnelRAG stage 3), docs/postrank.md.

1. **Speed (CPU):** passages per second of :class:`FiDAttentionScorer` for a t5-small-sized and a
   t5-base-sized T5 (random weights, vocab 32128, a byte-level BPE tokenizer trained here so every input
   is cut to exactly ``--tokens``) against a MiniLM-sized cross-encoder (all-MiniLM-L6-v2, random
   ``num_labels=1`` head) on the same ``--passages`` pairs cut to the same length; timed in one process,
   interleaved, ``--repeats`` times; medians reported.
2. **Quality** is a harness configuration: ``benchmarks/configs/squad_attention_lm.toml`` (the
   decoder-only :class:`AttentionLMScorer`) and ``squad_postrank.toml`` (the trained FiD reader).

    nice -n 10 python benchmarks/bench_fid.py --data /work/shared/data [--quick]
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import tempfile
from pathlib import Path

from common import RESULTS, interleaved_seconds, machine, parser, save_json

from funnel_core import testing
from funnel_core.evaluation import load_squad
from funnel_core.text import word_windows
from funnel_core.units import Unit

T5_CONFIGS = {
    "t5-small-sized": dict(d_model=512, d_ff=2048, d_kv=64, num_layers=6, num_decoder_layers=6, num_heads=8),
    "t5-base-sized": dict(d_model=768, d_ff=3072, d_kv=64, num_layers=12, num_decoder_layers=12, num_heads=12),
}


def squad_passages(path: Path) -> tuple[list[Unit], list]:
    """SQuAD paragraphs re-chunked into ~100-word passages, and every question."""
    arts = load_squad(path)
    units = [Unit(id=f"{a.title}/{pi}/{wi}", text=text, metadata={"title": a.title.replace("_", " ")})
             for a in arts for pi, para in enumerate(a.paragraphs) for wi, text in enumerate(word_windows(para, 100))]
    return units, [q for a in arts for q in a.questions]


# -- 1. speed ------------------------------------------------------------------------------
def build_t5(folder: Path, cfg: dict) -> str:
    import torch
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    tok = testing.build_bpe_tokenizer(vocab_size=2000)
    tok.pad_token, tok.eos_token, tok.unk_token = "<pad>", "</s>", "<unk>"
    config = T5Config(vocab_size=32128, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                      decoder_start_token_id=tok.pad_token_id, **cfg)
    T5ForConditionalGeneration(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def bench_speed(units: list[Unit], questions: list, n_passages: int, tokens: int,
                repeats: int) -> dict:
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification

    from funnel_core.rerank.fid import FiDAttentionScorer

    rng = random.Random(0)
    long_units = [u for u in units if len(u.text.split()) >= 90]
    passages = [u.text for u in rng.sample(long_units, n_passages)]
    query = questions[0].question

    ce_tok = AutoTokenizer.from_pretrained(testing.minilm_path())
    ce = BertForSequenceClassification.from_pretrained(testing.minilm_path(), num_labels=1).eval()
    encode = lambda: ce_tok([query] * n_passages, passages, truncation=True, max_length=tokens,
                            padding=True, return_tensors="pt")

    def run_ce() -> list[float]:
        with torch.inference_mode():
            return ce(**encode()).logits[:, 0].tolist()

    tmp = Path(tempfile.mkdtemp(prefix="bench_fid_"))
    scorers = {name: FiDAttentionScorer(model=build_t5(tmp / name, cfg), max_length=tokens, batch_size=n_passages,
                                        device="cpu") for name, cfg in T5_CONFIGS.items()}
    fid_lengths = scorers["t5-small-sized"].build_inputs(query, passages).lengths
    runs = {"cross_encoder_minilm": run_ce,
            **{name: (lambda s=s: s.score(query, passages)) for name, s in scorers.items()}}
    times = interleaved_seconds(runs, repeats)
    med = {k: statistics.median(v) for k, v in times.items()}
    params = {name: sum(p.numel() for p in s.model.parameters()) for name, s in scorers.items()}
    params["cross_encoder_minilm"] = sum(p.numel() for p in ce.parameters())
    return {"passages": n_passages, "repeats": repeats, "threads": torch.get_num_threads(), "parameters": params,
            "fid_tokens_per_input": {"mean": statistics.mean(fid_lengths), "min": min(fid_lengths), "max": max(fid_lengths)},
            "cross_encoder_tokens_per_pair": float(encode()["attention_mask"].sum(1).float().mean()),
            "seconds_median": med, "seconds_all": times, "passages_per_second": {k: n_passages / v for k, v in med.items()},
            "cross_encoder_speedup_over": {k: med[k] / med["cross_encoder_minilm"] for k in scorers},
            "fid_tokenizer": "byte-level BPE (funnel_core.testing.build_bpe_tokenizer, 2000 types) "
                             "over real SQuAD passages, truncated to the token budget; model vocab 32128"}


def main() -> None:
    ap = parser(__doc__.split("\n\n")[0])  # --data, --quick (fewer repeats and questions), --out
    ap.add_argument("--passages", type=int, default=50)
    ap.add_argument("--tokens", type=int, default=130)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    if args.quick:
        args.repeats = min(args.repeats, 2)

    units, questions = squad_passages(Path(args.data) / "squad" / "squad-v1.1-dev-a.json")
    out_path = args.out or RESULTS / "fid.json"
    speed = bench_speed(units, questions, args.passages, args.tokens, args.repeats)
    save_json(out_path, {"speed": speed, "hardware": {"speed": machine()},  # CPU flags, precisions, load average
                         "commands": {"speed": "nice -n 10 python " + " ".join(["benchmarks/bench_fid.py", *sys.argv[1:]])}},
              indent=2)
    print(json.dumps({k: v for k, v in speed.items() if k != "seconds_all"}, indent=2))


if __name__ == "__main__":
    main()
