"""Dense vectors on Milvus with an HNSW index (:class:`MilvusDenseIndex`)."""


from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Mapping, Sequence

if TYPE_CHECKING:  # pragma: no cover
    pass  # typing.Self from Python 3.11

import numpy as np

from funnel_core.backends.milvus.bm25 import milvus_index_params
from funnel_core.backends.milvus.client import FORMAT_VERSION, MAX_ID_BYTES, MAX_TOPK, MAX_VARCHAR, MilvusSettingsError
from funnel_core.backends.milvus.collection import Collection, check_id, check_varchar, manifest_fields, unit_from_row
from funnel_core.backends.milvus.expressions import filter_expression
from funnel_core.errors import check_positive_int, check_query
from funnel_core.settings import Settings
from funnel_core.units import Unit, check_unique_ids


# -- dense -----------------------------------------------------------------------------------------
class MilvusDenseIndex(Collection, Settings):
    """Dense retrieval over units in a Milvus collection (HNSW by default); same interface and
    scores as :class:`~funnel_core.embeddings.DenseIndex` (inner product of our embeddings).

    ``uri``, ``collection``, ``token``, ``db_name``, ``timeout`` and ``show_progress`` are as
    for :class:`MilvusBM25Index`.

    Args:
        embedder: A :class:`~funnel_core.embeddings.SentenceEmbedder` (default: the packaged
            all-MiniLM-L6-v2).
        index_type: ``"HNSW"`` (default), ``"IVF_FLAT"`` or ``"FLAT"`` (exact).
        metric: ``"IP"`` (default; cosine on normalised embeddings) or ``"COSINE"``.
        hnsw_m: HNSW graph degree M.
        ef_construction: HNSW build breadth.
        ef: HNSW search breadth (default ``max(64, k)``).
        nlist: IVF_FLAT lists.
        nprobe: IVF_FLAT lists probed per query.
        batch_size: Units embedded and inserted per batch (a tqdm bar shows progress).
    """

    kind = "funnel-rag.milvus-dense"
    #: the vectors and the index are built with these (``ef``, ``nprobe``, ``batch_size`` are not)
    build_settings = frozenset({"embedder", "index_type", "metric", "hnsw_m", "ef_construction", "nlist"})
    unserialised = ("embedder",)  # a live object; its model name is in the collection's settings

    def __init__(self, uri: str | os.PathLike = "funnel.db", collection: str = "funnel_dense",
                 embedder: Any = None, *, token: str | None = None, db_name: str | None = None,
                 timeout: float | None = None, show_progress: bool = False,
                 index_type: str = "HNSW", metric: str = "IP", hnsw_m: int = 16,
                 ef_construction: int = 200, ef: int | None = None, nlist: int = 128,
                 nprobe: int = 16, batch_size: int = 256) -> None:
        super().__init__(uri, collection, token, db_name, timeout, show_progress)
        if index_type not in ("HNSW", "IVF_FLAT", "FLAT"):
            raise ValueError(f"index_type must be 'HNSW', 'IVF_FLAT' or 'FLAT', got {index_type!r}.")
        if metric not in ("IP", "COSINE"):
            raise ValueError(f"metric must be 'IP' or 'COSINE', got {metric!r}.")
        if embedder is None:
            from funnel_core.embeddings import SentenceEmbedder

            embedder = SentenceEmbedder()
        self.embedder = embedder
        self.index_type, self.metric = index_type, metric
        self.hnsw_m = check_positive_int(hnsw_m, "hnsw_m")
        self.ef_construction = check_positive_int(ef_construction, "ef_construction")
        self.ef = check_positive_int(ef, "ef", allow_none=True)
        self.nlist, self.nprobe = check_positive_int(nlist, "nlist"), check_positive_int(nprobe, "nprobe")
        self.batch_size = check_positive_int(batch_size, "batch_size")

    def _settings(self, dim: int) -> dict[str, Any]:
        return {"dimension": int(dim), "metric": self.metric, "index_type": self.index_type,
                "model": str(getattr(self.embedder, "model_name_or_path", "")),
                "hnsw_m": self.hnsw_m, "ef_construction": self.ef_construction, "nlist": self.nlist}

    def _check_settings(self, meta: Mapping[str, Any]) -> None:
        s = meta.get("settings", {})  # the collection's (not an edit)
        object.__setattr__(self, "metric", s.get("metric", self.metric))
        object.__setattr__(self, "index_type", s.get("index_type", self.index_type))

    def _check_dimension(self, got: int) -> None:
        want = self._opened()["settings"]["dimension"]
        if got != want:
            raise MilvusSettingsError(
                f"collection {self._where()} holds {want}-d vectors, the query embeddings are "
                f"{got}-d; use the embedder it was built with "
                f"({self._opened()['settings'].get('model')!r}) or rebuild with .index(...).")

    def index(self, units: Sequence[Unit], embeddings: np.ndarray | None = None,
              show_progress: bool | None = None) -> "MilvusDenseIndex":
        """Embed ``units`` in batches (or take ``embeddings``) and upload them; atomic swap."""
        from pymilvus import DataType
        from tqdm.auto import tqdm

        units = list(units)
        if not units:
            raise ValueError("cannot build a dense index over an empty corpus; pass at least one unit.")
        check_unique_ids(units)
        if embeddings is not None:
            embeddings = np.asarray(embeddings, dtype=np.float32)
            if embeddings.ndim != 2 or embeddings.shape[0] != len(units):
                raise ValueError(f"got embeddings of shape {embeddings.shape} for {len(units)} units.")
        progress = self.show_progress if show_progress is None else show_progress
        for u in units:
            check_id(u.id)
            check_varchar(u.text, "text", u.id, "split long texts first (e.g. word_windows).")

        def build(physical: str) -> dict[str, Any]:
            client = self.client
            dim = int(embeddings.shape[1]) if embeddings is not None else int(self.embedder.dimension)
            meta = {"format": self.kind, "version": FORMAT_VERSION, "n_units": len(units),
                    "settings": self._settings(dim)}
            schema = client.create_schema(auto_id=False, enable_dynamic_field=False,
                                          description="funnel-rag dense")
            schema.add_field("id", DataType.VARCHAR, max_length=MAX_ID_BYTES, is_primary=True)
            schema.add_field("text", DataType.VARCHAR, max_length=MAX_VARCHAR)
            schema.add_field("vector", DataType.FLOAT_VECTOR, dim=dim)
            schema.add_field("metadata", DataType.JSON)
            schema.add_field("info", DataType.JSON)
            params = client.prepare_index_params()
            ip = ({"M": self.hnsw_m, "efConstruction": self.ef_construction}
                  if self.index_type == "HNSW" else {"nlist": self.nlist}
                  if self.index_type == "IVF_FLAT" else {})
            params.add_index(field_name="vector", index_type=self.index_type, metric_type=self.metric,
                             params=milvus_index_params(ip))
            self._create(physical, schema, params, meta)
            with tqdm(total=len(units), desc=f"milvus embed+insert {self.collection}", unit="unit",
                      disable=not progress) as bar:
                for start in range(0, len(units), self.batch_size):
                    chunk = units[start:start + self.batch_size]
                    emb = (embeddings[start:start + len(chunk)] if embeddings is not None
                           else self.embedder.encode([u.text for u in chunk]))
                    if emb.shape[1] != dim:
                        raise ValueError(f"embedding dimension {emb.shape[1]} != {dim}.")
                    client.insert(physical, [
                        {"id": u.id, "text": u.text, "vector": e.tolist(), "metadata": u.metadata,
                         "info": {"parent_id": u.parent_id, "level": u.level}}
                        for u, e in zip(chunk, np.asarray(emb, dtype=np.float32))])
                    bar.update(len(chunk))
            client.flush(physical)
            return meta

        self._swap(build)
        return self

    def search_many(self, queries: Sequence[str], k: int = 10,
                    query_embeddings: np.ndarray | None = None, filter: Any = None,
                    name: str = "dense") -> list[list[Unit]]:
        """Top-``k`` units per query by similarity; scores in ``funnel["score_dense"]``."""
        check_positive_int(k, "k")
        if isinstance(queries, str):
            raise TypeError("search_many expects a list of queries; use search() for one query.")
        if k > MAX_TOPK:
            raise ValueError(f"k={k} is more than Milvus returns in one search ({MAX_TOPK}).")
        queries = [check_query(q) for q in queries]
        expr = filter_expression(filter)
        self._opened()
        out: list[list[Unit]] = [[] for _ in queries]
        live = [i for i, q in enumerate(queries) if q]
        if not live or expr == "false":
            return out
        if query_embeddings is None:
            q_emb = self.embedder.encode([queries[i] for i in live])
        else:
            q_emb = np.asarray(query_embeddings, dtype=np.float32)[live]
        self._check_dimension(int(q_emb.shape[1]))
        params: dict[str, Any] = {"metric_type": self.metric}
        if self.index_type == "HNSW":
            params["params"] = {"ef": max(self.ef or 64, k)}
        elif self.index_type == "IVF_FLAT":
            params["params"] = {"nprobe": self.nprobe}
        kwargs: dict[str, Any] = {"filter": expr} if expr else {}
        res = self.client.search(self.collection, data=[e.tolist() for e in q_emb],
                                 anns_field="vector", limit=k, search_params=params,
                                 output_fields=["id", "text", "metadata", "info"], **kwargs)
        for row, qi in enumerate(live):
            hits = sorted(((float(h["distance"]), h["entity"]) for h in res[row]),
                          key=lambda x: -x[0])  # IP/COSINE: larger is more similar
            out[qi] = [unit_from_row(e).rescored(s, name) for s, e in hits]
        return out

    def search(self, query: str, k: int = 10, filter: Any = None) -> list[Unit]:
        return self.search_many([query], k, filter=filter)[0]

    @classmethod
    def load(cls, path: str | os.PathLike, uri: Any = None, token: str | None = None, *,
             embedder: Any = None, **kwargs: Any) -> "MilvusDenseIndex":
        """Re-open the collection named in the manifest saved at ``path`` (no re-embedding);
        ``uri`` and ``token`` are the caller's (see :meth:`Collection.load`); the embedder
        defaults to the model recorded at build time."""
        return cls._from_manifest(cls._saved_manifest(path), uri=uri, token=token,
                                  embedder=embedder, **kwargs)

    @classmethod
    def _from_manifest(cls, m: Mapping[str, Any], uri: Any = None, token: str | None = None,
                       embedder: Any = None, **kwargs: Any) -> "MilvusDenseIndex":
        uri, token, collection, db_name, settings = manifest_fields(
            m, cls.kind, uri, token, kwargs.pop("db_name", None))
        if embedder is None and isinstance(settings.get("model"), str) and settings["model"]:
            from funnel_core.embeddings import SentenceEmbedder

            embedder = SentenceEmbedder(settings["model"])
        return cls(uri, collection, embedder, token=token, db_name=db_name, **kwargs).open()
