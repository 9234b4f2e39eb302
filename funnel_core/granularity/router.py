"""The MoG router (section 3.2.2): an MLP on a query embedding with one sigmoid per level.

Training data are soft labels built exactly as the paper does: for each training query, BM25
retrieves the best snippet of every granularity level; each snippet is compared with the query's
reference (a gold answer or passage) by embedding cosine, TF-IDF cosine or hit rate; the most
similar level gets 0.8, the second 0.2, every other level 0 (ties go to the finer level). The
router is trained with binary cross-entropy on these soft labels, Adam (lr 1e-3), mini-batches
and early stopping on a validation split; the best epoch's weights are kept.

torch and sentence-transformers are imported lazily.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from funnel_core.cache import LRUCache
from funnel_core.embeddings import SentenceEmbedder
from funnel_core.errors import FunnelError, PersistError, check_positive_int
from funnel_core.granularity.levels import GranularityStructure
from funnel_core.granularity.retrieval import GranularityBM25
from funnel_core.persist import check_model_name, check_number, load_snapshot, save_snapshot
from funnel_core.text import normalize_answer

__all__ = ["GranularityRouter", "RouterNotTrainedError", "soft_labels", "level_similarities",
           "level_choice_counts", "SIMILARITIES", "BEST_LABEL", "SECOND_LABEL"]

SIMILARITIES = ("cosine", "tfidf", "hit")
ROUTER_FORMAT = "funnel-rag.mog-router"
ROUTER_VERSION = 2  # 2: snapshot layout (funnel_core.persist), safetensors weights
BEST_LABEL, SECOND_LABEL = 0.8, 0.2


class RouterNotTrainedError(FunnelError, RuntimeError):
    """The router was asked for weights before :meth:`GranularityRouter.fit` or ``load``."""


def _hit_rate(snippet: str, reference: str) -> float:
    """Share of the reference's (SQuAD-normalised) words that occur in the snippet."""
    ref = normalize_answer(reference).split()
    if not ref:
        return 0.0
    words = set(normalize_answer(snippet).split())
    return sum(t in words for t in ref) / len(ref)


def level_similarities(queries: Sequence[str], references: Sequence[str],
                       index: GranularityBM25 | GranularityStructure, *,
                       similarity: str = "hit", embedder: SentenceEmbedder | None = None) -> np.ndarray:
    """``(n_queries, n_gra)`` similarity of each level's best BM25 snippet to the reference.

    A level where BM25 finds nothing gets similarity 0.
    """
    if similarity not in SIMILARITIES:
        raise ValueError(f"similarity must be one of {SIMILARITIES}, got {similarity!r}.")
    if len(queries) != len(references):
        raise ValueError(f"got {len(queries)} queries but {len(references)} references.")
    if not isinstance(index, GranularityBM25):
        index = GranularityBM25(index)
    n_gra = index.n_gra
    snippets: list[list[str | None]] = []
    for q in queries:
        tops = index.search(q, k=1)
        snippets.append([t[0].text if t else None for t in tops])
    sims = np.zeros((len(queries), n_gra))
    if similarity == "hit":
        for i, (row, ref) in enumerate(zip(snippets, references)):
            sims[i] = [_hit_rate(s, ref) if s is not None else 0.0 for s in row]
        return sims
    texts = sorted({s for row in snippets for s in row if s is not None})
    pos = {t: i for i, t in enumerate(texts)}
    if similarity == "tfidf":
        from sklearn.feature_extraction.text import TfidfVectorizer

        vec = TfidfVectorizer().fit([u.text for level in index.structure.levels for u in level])
        s_mat = vec.transform(texts)
        r_mat = vec.transform(list(references))
        for i, row in enumerate(snippets):
            idx = [pos[s] for s in row if s is not None]
            vals = (s_mat[idx] @ r_mat[i].T).toarray().ravel() if idx else []
            it = iter(vals)
            sims[i] = [float(next(it)) if s is not None else 0.0 for s in row]
        return sims
    embedder = embedder or SentenceEmbedder()
    s_emb = embedder.encode(texts) if texts else np.zeros((0, 1), dtype=np.float32)
    r_emb = embedder.encode(list(references))
    s_emb = s_emb / np.maximum(np.linalg.norm(s_emb, axis=1, keepdims=True), 1e-12)
    r_emb = r_emb / np.maximum(np.linalg.norm(r_emb, axis=1, keepdims=True), 1e-12)
    for i, row in enumerate(snippets):
        sims[i] = [float(s_emb[pos[s]] @ r_emb[i]) if s is not None else 0.0 for s in row]
    return sims


def soft_labels(similarities: np.ndarray, *, tolerance: float = 0.0,
                ties: str = "finer") -> np.ndarray:
    """The paper's soft labels from ``(n, n_gra)`` similarities: 0.8 best, 0.2 second, 0 else.

    Args:
        similarities: ``(n_queries, n_gra)`` similarity of each level's snippet to the reference.
        tolerance: Levels within ``tolerance`` of the best similarity count as tied with it
            (0: exact ties only, the paper's rule). Not in the paper: with hit rates, a coarser
            snippet that holds the answer ties with a finer one, and a small tolerance lets the
            ``ties`` rule decide near-ties too.
        ties: Which tied level wins: ``"finer"`` (the default) or ``"coarser"``.

    The second label goes to the best of the remaining levels by the same rule. A row whose best
    similarity is not positive (no level's snippet resembles the reference) gets all zeros and is
    usually left out of training.
    """
    sims = np.asarray(similarities, dtype=np.float64)
    if sims.ndim != 2 or sims.shape[1] < 1:
        raise ValueError(f"similarities must have shape (n_queries, n_gra), got {sims.shape}.")
    if ties not in ("finer", "coarser"):
        raise ValueError(f"ties must be 'finer' or 'coarser', got {ties!r}.")
    if not float(tolerance) >= 0.0:
        raise ValueError(f"tolerance must be >= 0, got {tolerance!r}.")
    labels = np.zeros_like(sims)
    for i, row in enumerate(sims):
        left = list(range(len(row)))
        for label in (BEST_LABEL, SECOND_LABEL):
            if not left:
                break
            top = max(row[j] for j in left)
            if label == BEST_LABEL and top <= 0:
                break
            tied = [j for j in left if row[j] >= top - tolerance]
            pick = min(tied) if ties == "finer" else max(tied)
            labels[i, pick] = label
            left.remove(pick)
    return labels


def level_choice_counts(weights: np.ndarray, margin: float = 0.0) -> list[int]:
    """How many queries each level (1-based position) would be chosen for, given router
    ``weights`` of shape ``(n, n_levels)`` (see
    :func:`~funnel_core.granularity.retrieval.choose_level`)."""
    from funnel_core.granularity.retrieval import choose_level

    w = np.asarray(weights, dtype=np.float64)
    counts = [0] * w.shape[1]
    for row in w:
        counts[choose_level(row, margin) - 1] += 1
    return counts


class GranularityRouter:
    """MLP from a query embedding to one sigmoid weight per granularity level.

    Args:
        n_levels: Number of granularity levels (outputs).
        embedder: A :class:`~funnel_core.embeddings.SentenceEmbedder` (default: the packaged
            all-MiniLM-L6-v2); any sentence-transformers model works.
        hidden: Width of the hidden layer.
        dropout: Dropout after the hidden layer (training only).
        device: Torch device for the MLP (``None``: CPU; it is tiny).
        embedding_cache: A mapping ``query -> embedding`` to share between routers that use the
            same embedder, e.g. an :class:`~funnel_core.cache.LRUCache` (by default each router
            keeps its own bounded one).
        cache_size: Size limit of the default query-embedding cache (least recently used
            queries are dropped, so memory stays bounded when queries come from users).

    Query embeddings are cached per query string (at most ``cache_size`` of them).
    """

    def __init__(self, n_levels: int, *, embedder: SentenceEmbedder | None = None,
                 hidden: int = 128, dropout: float = 0.1, device: str | None = None,
                 embedding_cache: "dict[str, np.ndarray] | LRUCache | None" = None,
                 cache_size: int = 10_000) -> None:
        self.n_levels = check_positive_int(n_levels, "n_levels (granularity levels)")
        self.hidden = check_positive_int(hidden, "hidden")
        if not 0.0 <= float(dropout) < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}.")
        self.dropout = float(dropout)
        self.embedder = embedder or SentenceEmbedder()
        self.device = device or "cpu"
        self._mlp = None
        self._cache = LRUCache(cache_size) if embedding_cache is None else embedding_cache
        self.history: dict[str, Any] = {}

    @property
    def trained(self) -> bool:
        return self._mlp is not None

    # -- embeddings ------------------------------------------------------------------------
    def embed(self, queries: Sequence[str]) -> np.ndarray:
        """Embeddings of ``queries`` (cached)."""
        if isinstance(queries, str):
            raise TypeError("embed expects a list of queries; wrap a single query in a list.")
        if not queries:
            return np.zeros((0, self.embedder.dimension), dtype=np.float32)
        found: dict[str, np.ndarray] = {}
        for q in set(queries):
            e = self._cache.get(q)
            if e is not None:
                found[q] = e
        todo = sorted(set(queries) - set(found))
        if todo:
            for q, e in zip(todo, self.embedder.encode(todo)):
                self._cache[q] = found[q] = e
        return np.stack([found[q] for q in queries])

    def _build(self, dim: int):
        import torch

        return torch.nn.Sequential(
            torch.nn.Linear(dim, self.hidden), torch.nn.ReLU(), torch.nn.Dropout(self.dropout),
            torch.nn.Linear(self.hidden, self.n_levels),
        ).to(self.device)

    # -- training --------------------------------------------------------------------------
    def fit(self, queries: Sequence[str], labels: np.ndarray, *, val_fraction: float = 0.2,
            epochs: int = 200, lr: float = 1e-3, batch_size: int = 32, patience: int = 10,
            seed: int = 0) -> dict[str, Any]:
        """Train on ``(queries, soft labels)`` with BCE, Adam and early stopping.

        Args:
            queries: Training queries.
            labels: ``(n, n_levels)`` targets in [0, 1] (see :func:`soft_labels`).
            val_fraction: Share of the queries held out for early stopping.
            epochs: Maximum epochs.
            lr: Adam learning rate (the paper's 1e-3).
            batch_size: Mini-batch size.
            patience: Epochs without a better validation loss before stopping.
            seed: Seed for the split, the initialisation and the batch order.

        Returns:
            The training history: per-epoch train/validation loss, best epoch, seconds.
        """
        import torch

        labels = np.asarray(labels, dtype=np.float32)
        if isinstance(queries, str):
            raise TypeError("queries must be a list of strings.")
        if labels.shape != (len(queries), self.n_levels):
            raise ValueError(f"labels must have shape ({len(queries)}, {self.n_levels}), got "
                             f"{labels.shape}.")
        if len(queries) < 2:
            raise ValueError(f"need at least 2 labelled queries to train (one for validation), "
                             f"got {len(queries)}.")
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction!r}.")
        check_positive_int(epochs, "epochs")
        check_positive_int(batch_size, "batch_size")
        check_positive_int(patience, "patience")
        t0 = time.perf_counter()
        x = torch.from_numpy(self.embed(list(queries))).float().to(self.device)
        embed_seconds = time.perf_counter() - t0
        y = torch.from_numpy(labels).to(self.device)
        rng = np.random.default_rng(seed)
        perm = rng.permutation(len(queries))
        n_val = min(len(queries) - 1, max(1, int(round(val_fraction * len(queries)))))
        val, tr = perm[:n_val], perm[n_val:]
        torch.manual_seed(seed)
        mlp = self._build(x.shape[1])
        opt = torch.optim.Adam(mlp.parameters(), lr=lr)
        loss_fn = torch.nn.BCEWithLogitsLoss()
        best_loss, best_state, best_epoch, stale = float("inf"), None, 0, 0
        train_losses, val_losses = [], []
        t1 = time.perf_counter()
        for epoch in range(1, epochs + 1):
            mlp.train()
            order = tr[rng.permutation(len(tr))]
            total = 0.0
            for b in range(0, len(order), batch_size):
                idx = torch.from_numpy(order[b:b + batch_size])
                opt.zero_grad()
                loss = loss_fn(mlp(x[idx]), y[idx])
                loss.backward()
                opt.step()
                total += float(loss.detach()) * len(idx)
            train_losses.append(total / len(tr))
            mlp.eval()
            with torch.no_grad():
                v = float(loss_fn(mlp(x[torch.from_numpy(val)]), y[torch.from_numpy(val)]))
            val_losses.append(v)
            if v < best_loss - 1e-6:
                best_loss, best_epoch, stale = v, epoch, 0
                best_state = {k: t.detach().clone() for k, t in mlp.state_dict().items()}
            else:
                stale += 1
                if stale >= patience:
                    break
        mlp.load_state_dict(best_state)
        mlp.eval()
        self._mlp = mlp
        self.history = {"train_loss": train_losses, "val_loss": val_losses,
                        "best_epoch": best_epoch, "best_val_loss": best_loss,
                        "epochs_run": len(train_losses), "n_train": int(len(tr)),
                        "n_val": int(n_val), "embed_seconds": embed_seconds,
                        "train_seconds": time.perf_counter() - t1}
        return self.history

    # -- inference -------------------------------------------------------------------------
    def predict(self, queries: Sequence[str]) -> np.ndarray:
        """``(n, n_levels)`` sigmoid weights in [0, 1] (float64)."""
        if self._mlp is None:
            raise RouterNotTrainedError(
                "this GranularityRouter is not trained; call fit(queries, soft_labels(...)) or "
                "GranularityRouter.load(path) first, or pass router=None to MoG retrieval for "
                "uniform level weights.")
        import torch

        emb = self.embed(list(queries))
        with torch.no_grad():
            out = torch.sigmoid(self._mlp(torch.from_numpy(emb).float().to(self.device)))
        return out.cpu().numpy().astype(np.float64)

    def weights(self, query: str) -> list[float]:
        """Router weights for one query, as Python floats."""
        return [float(x) for x in self.predict([query])[0]]

    # -- persistence -----------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> None:
        """Commit ``router.safetensors`` (no pickle) and the settings to the persist folder
        ``path`` (see :mod:`funnel_core.persist`)."""
        if self._mlp is None:
            raise RouterNotTrainedError("cannot save an untrained GranularityRouter; call fit() first.")
        from safetensors.torch import save_file

        state = {k: t.detach().cpu().contiguous().clone() for k, t in self._mlp.state_dict().items()}

        def write(folder: Path) -> dict[str, Any]:
            save_file(state, str(folder / "router.safetensors"))
            return {"n_levels": self.n_levels, "hidden": self.hidden, "dropout": self.dropout,
                    "embedder": self.embedder.model_name_or_path,
                    "dim": int(self._mlp[0].in_features), "history": _finite(self.history)}

        save_snapshot(path, ROUTER_FORMAT, ROUTER_VERSION, write)

    @classmethod
    def load(cls, path: str | os.PathLike, embedder: SentenceEmbedder | None = None,
             device: str | None = None, verify: bool = True) -> "GranularityRouter":
        """Load a router written by :meth:`save` (with the embedder it was trained with).

        Weights are read with safetensors (no pickle, no code execution).
        """

        def read(folder: Path, manifest: dict[str, Any]) -> "GranularityRouter":
            from safetensors.torch import load_file

            config = manifest["meta"]
            try:
                name = check_model_name(config["embedder"])
                n_levels = int(check_number(config["n_levels"], "n_levels", 1, 10_000, integer=True))
                hidden = int(check_number(config["hidden"], "hidden", 1, 100_000, integer=True))
                dim = int(check_number(config["dim"], "dim", 1, 1_000_000, integer=True))
                dropout = check_number(config["dropout"], "dropout", 0.0, 1.0)
                router = cls(n_levels, hidden=hidden, dropout=dropout,
                             embedder=embedder or SentenceEmbedder(name), device=device)
            except (KeyError, TypeError, ValueError) as exc:
                raise PersistError(f"the router at {str(path)!r} has an invalid setting "
                                   f"({type(exc).__name__}: {exc}); train and save it again.") from exc
            mlp = router._build(dim)
            mlp.load_state_dict(load_file(str(folder / "router.safetensors"), device=router.device))
            mlp.eval()
            history = config.get("history", {})
            router._mlp, router.history = mlp, history if isinstance(history, dict) else {}
            return router

        return load_snapshot(path, ROUTER_FORMAT, ROUTER_VERSION, "trained router", read, verify=verify)


def _finite(obj: Any) -> Any:
    """``obj`` with non-finite floats replaced by ``None`` (manifests hold no NaN/Infinity)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj
