"""Encode texts with a sentence-transformers model, on CPU or GPU (used to embed the large SQuAD corpus).

    python benchmarks/embed_texts.py TEXTS.json.gz MODEL_FOLDER OUT_PREFIX [--batch-size 256]

``TEXTS.json.gz`` is ``{"name": [text, ...], ...}``; each list is encoded (L2-normalised; float16 on
CUDA, else float32) by :func:`funnel_core.offline.embed_texts` into the Parquet shards of the folder
``OUT_PREFIX.<name>`` (``funnel_core.offline.read_embeddings`` reads them back), with the device and
seconds in ``OUT_PREFIX.json``. ``bench_squad_large.py --embeddings OUT_PREFIX`` reads them.
"""

from __future__ import annotations

import argparse
import gzip
import json
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name in ("texts", "model", "out"):
        ap.add_argument(name)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--cpu-bf16", action="store_true",
                    help="on a CPU with native bf16 (AMX / AVX-512-BF16), encode in bf16")
    args = ap.parse_args()
    import torch

    from funnel_core import offline

    cuda = torch.cuda.is_available()
    info = {"device": "cuda" if cuda else "cpu", "torch": torch.__version__,
            "dtype": "float16" if cuda else "auto" if args.cpu_bf16 else "float32"}
    for name, items in json.loads(gzip.decompress(Path(args.texts).read_bytes())).items():
        t0 = time.perf_counter()
        offline.embed_texts(items, f"{args.out}.{name}", model=args.model, batch_size=args.batch_size,
                            num_gpus=int(cuda), dtype=info["dtype"], progress=True)
        info[name] = {"n": len(items), "seconds": time.perf_counter() - t0}
    print(json.dumps(info))
    Path(f"{args.out}.json").write_text(json.dumps(info))


if __name__ == "__main__":
    main()
