"""The Parquet shard tables that both offline engines (local and Ray) write and read back:
one row per embedded text, one row per scored (query, unit) pair."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

__all__ = ["embed_table", "score_table"]


def embed_table(rows: np.ndarray, ids: Sequence[str], emb: np.ndarray):
    """A shard of embeddings: ``row`` (position in the input), ``id``, ``embedding``."""
    import pyarrow as pa

    emb = np.ascontiguousarray(emb, dtype=np.float32)
    return pa.table({
        "row": pa.array(np.asarray(rows, dtype=np.int64)),
        "id": pa.array([str(i) for i in ids], type=pa.string()),
        "embedding": pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), emb.shape[1]),
    })


def score_table(groups: Sequence[Mapping[str, Any]], scorer: Any):
    """A shard of pair scores: ``scorer.score`` over each group's texts, one row per pair."""
    import pyarrow as pa

    qids, uids, pos, scores = [], [], [], []
    for g in groups:
        texts = list(g["texts"])
        if not texts:
            continue
        s = scorer.score(str(g["query"]), texts)
        if len(s) != len(texts):
            raise RuntimeError(f"{type(scorer).__name__}.score returned {len(s)} scores for "
                               f"{len(texts)} texts.")
        qids += [str(g["query_id"])] * len(texts)
        uids += [str(u) for u in g["unit_ids"]]
        pos += list(range(len(texts)))
        scores += [float(x) for x in s]
    return pa.table({"query_id": pa.array(qids, type=pa.string()),
                     "unit_id": pa.array(uids, type=pa.string()),
                     "position": pa.array(pos, type=pa.int64()),
                     "score": pa.array(scores, type=pa.float64())})
