"""Score many (question, passage) pairs with a cross-encoder checkpoint, on CPU or GPU.

    python benchmarks/score_pairs.py PAIRS.npz MODEL_FOLDER SCORES.npy [--batch-size 256] [--max-length 192]

``PAIRS.npz`` (written by ``bench_squad_large.py --export-pairs``) holds ``qi`` and ``pi`` (int32
indices of each pair) and ``texts`` (gzip-compressed JSON ``{"questions": [...], "passages": [...]}``),
so every distinct text travels once. The output is a float32 array of one raw logit per pair, in
the file's order. Tokenisation is :func:`funnel_core.rerank.cross_encoder.encode_pairs`, the one
``CrossEncoderScorer`` uses (passage truncated, query clipped to half of ``max_length``), so the
scores are the ones the benchmark's pipelines compute. On CUDA the model runs in float16, on a CPU
with AVX512-BF16/AMX under bf16 autocast, else fp32; the dtype is printed and saved beside the
output (``SCORES.json``).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def read_pairs(path: str | Path) -> tuple[list[str], list[str], np.ndarray, np.ndarray]:
    z = np.load(path)
    texts = json.loads(gzip.decompress(z["texts"].tobytes()).decode("utf-8"))
    return texts["questions"], texts["passages"], z["qi"].astype(np.int64), z["pi"].astype(np.int64)


def write_pairs(path: str | Path, questions: list[str], passages: list[str], qi, pi) -> None:
    blob = gzip.compress(json.dumps({"questions": questions, "passages": passages}).encode("utf-8"))
    np.savez_compressed(path, qi=np.asarray(qi, dtype=np.int32), pi=np.asarray(pi, dtype=np.int32),
                        texts=np.frombuffer(blob, dtype=np.uint8))


def score(questions, passages, qi, pi, model_dir: str, batch_size: int = 256, max_length: int = 192,
          device: str | None = None, log_every: int = 100_000) -> tuple[np.ndarray, dict]:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from funnel_core.rerank.cross_encoder import encode_pairs

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir)
    flags = open("/proc/cpuinfo").read() if Path("/proc/cpuinfo").exists() else ""
    if device.startswith("cuda"):
        model, dtype, autocast = model.half(), "fp16", False
    else:
        model = model.float()
        autocast = ("avx512_bf16" in flags) or ("amx_bf16" in flags)
        dtype = "bf16 autocast" if autocast else "fp32"
    model = model.to(device).eval()
    pretok = getattr(tok, "cls_token_id", None) is not None and getattr(tok, "sep_token_id", None) is not None
    t0 = time.perf_counter()
    out = np.zeros(len(qi), dtype=np.float32)
    done = 0
    if pretok:
        # BERT-style pairs: [CLS] q [SEP] p [SEP]; each distinct text is tokenized once (the same
        # tokens and truncation as encode_pairs, checked on a sample below)
        limit = max(1, (max_length - 3) // 2)
        q_ids = [ids[:limit] for ids in tok(list(questions), add_special_tokens=False)["input_ids"]]
        p_ids = tok(list(passages), add_special_tokens=False)["input_ids"]
        lengths = np.array([min(max_length, 3 + len(q_ids[a]) + len(p_ids[b])) for a, b in zip(qi, pi)])
        order = np.argsort(-lengths, kind="stable")
        cls, sep, pad = tok.cls_token_id, tok.sep_token_id, tok.pad_token_id or 0

        def batch(idx):
            width = int(lengths[idx].max())
            ids = np.full((len(idx), width), pad, dtype=np.int64)
            tt = np.zeros((len(idx), width), dtype=np.int64)
            am = np.zeros((len(idx), width), dtype=np.int64)
            for r, i in enumerate(idx):
                q = q_ids[qi[i]]
                room = max_length - 3 - len(q)
                p = p_ids[pi[i]][:room]
                row = [cls] + q + [sep] + p + [sep]
                ids[r, :len(row)] = row
                tt[r, len(q) + 2:len(row)] = 1
                am[r, :len(row)] = 1
            return {"input_ids": torch.from_numpy(ids), "token_type_ids": torch.from_numpy(tt),
                    "attention_mask": torch.from_numpy(am)}

        check = order[:: max(1, len(order) // 500)][:500]
        ref = encode_pairs(tok, [questions[qi[i]] for i in check], [passages[pi[i]] for i in check], max_length)
        mine = batch(check)
        w = ref["input_ids"].shape[1]
        same = bool(torch.equal(ref["input_ids"], mine["input_ids"][:, :w]) and
                    torch.equal(ref["attention_mask"], mine["attention_mask"][:, :w]))
        if not same:
            raise RuntimeError("pre-tokenized pairs differ from encode_pairs; run without the fast path")
        make = batch
    else:
        lengths = np.array([len(questions[a]) + len(passages[b]) for a, b in zip(qi, pi)])
        order = np.argsort(-lengths, kind="stable")

        def make(idx):
            return encode_pairs(tok, [questions[qi[i]] for i in idx], [passages[pi[i]] for i in idx], max_length)
    with torch.inference_mode():
        for b in range(0, len(order), batch_size):
            idx = order[b:b + batch_size]
            enc = {k: v.to(device) for k, v in make(idx).items()}
            with torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16,
                                enabled=autocast):
                logits = model(**enc).logits.float()
            out[idx] = logits[:, -1].cpu().numpy()
            done += len(idx)
            if log_every and done // log_every != (done - len(idx)) // log_every:
                print(f"  {done}/{len(order)} pairs, {time.perf_counter() - t0:.0f} s", flush=True)
    secs = time.perf_counter() - t0
    info = {"pairs": int(len(qi)), "seconds": secs, "pairs_per_second": len(qi) / max(secs, 1e-9),
            "device": device, "dtype": dtype, "batch_size": batch_size, "max_length": max_length,
            "model": str(model_dir), "torch": torch.__version__,
            "tokenization": "each text once, pairs assembled (checked equal to encode_pairs on 500 pairs)"
                            if pretok else "encode_pairs per batch",
            "gpu": torch.cuda.get_device_name(0) if device.startswith("cuda") else None}
    return out, info


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pairs")
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--max-length", type=int, default=192)
    ap.add_argument("--device", default=None)
    ap.add_argument("--limit", type=int, default=None, help="score only the first N pairs (a check)")
    args = ap.parse_args()
    q, p, qi, pi = read_pairs(args.pairs)
    if args.limit:
        qi, pi = qi[:args.limit], pi[:args.limit]
    print(f"{len(qi)} pairs, {len(q)} questions, {len(p)} passages", flush=True)
    scores, info = score(q, p, qi, pi, args.model, args.batch_size, args.max_length, args.device)
    np.save(args.out, scores)
    Path(args.out).with_suffix(".json").write_text(json.dumps(info, indent=1))
    print(json.dumps(info))


if __name__ == "__main__":
    main()
