"""Encode texts with a sentence-transformers model, on CPU or GPU (used to embed the large SQuAD corpus).

    python benchmarks/embed_texts.py TEXTS.json.gz MODEL_FOLDER OUT_PREFIX [--parts 2]

``TEXTS.json.gz`` is ``{"name": [text, ...], ...}``; each list is encoded (L2-normalised, float32
compute, float16 on CUDA) and saved as ``OUT_PREFIX.<name>.<part>.npy`` (float16, split into
``--parts`` row blocks so no file is over 16 MB). ``bench_squad_large.py --embeddings OUT_PREFIX``
reads them back.
"""

from __future__ import annotations

import argparse
import gzip
import json
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("texts")
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--parts", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--cpu-bf16", action="store_true",
                    help="on a CPU with native bf16 (AMX / AVX-512-BF16), encode under bf16 autocast")
    args = ap.parse_args()
    import torch
    from sentence_transformers import SentenceTransformer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = SentenceTransformer(args.model, device=device)
    if device == "cuda":
        model = model.half()
    texts = json.loads(gzip.decompress(open(args.texts, "rb").read()).decode("utf-8"))
    bf16 = args.cpu_bf16 and device == "cpu"
    info = {"device": device, "torch": torch.__version__, "compute": "bf16 autocast" if bf16 else
            ("float16" if device == "cuda" else "float32")}
    for name, items in texts.items():
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            emb = model.encode(items, batch_size=args.batch_size, convert_to_numpy=True,
                               normalize_embeddings=True, show_progress_bar=False).astype(np.float16)
        info[name] = {"n": len(items), "seconds": time.perf_counter() - t0}
        for p, block in enumerate(np.array_split(emb, args.parts)):
            np.save(f"{args.out}.{name}.{p}.npy", block)
    print(json.dumps(info))
    with open(f"{args.out}.json", "w") as f:
        json.dump(info, f)


if __name__ == "__main__":
    main()
