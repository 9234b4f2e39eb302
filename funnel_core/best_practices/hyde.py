"""HyDE: hypothetical document embeddings (Gao et al., 2023, "Precise Zero-Shot Dense Retrieval
without Relevance Labels", ACL 2023, arXiv:2212.10496), the query side of the retrieval that
"Searching for Best Practices in RAG" (Wang et al., 2024, section 3.4) recommends ("Hybrid with
HyDE").

An LLM writes ``N`` hypothetical documents ``d_1 .. d_N`` that answer the query ``q`` (the HyDE
paper's web-search instruction is the default prompt). The dense retrieval vector is the mean of
their embeddings *and* the query's embedding -- the HyDE paper's equation (section 3.2, the
equation after Eq. 4)::

    v = 1 / (N + 1) * [ f(q) + sum_{k=1..N} f(d_k) ]

and the corpus is searched by inner product with ``v`` (the documents' embeddings ``f(d)`` are the
index's). ``f`` is the index's embedding model: the query through the query path, the hypothetical
documents through the document path (one and the same for a symmetric model such as
all-MiniLM-L6-v2). ``v`` is *not* re-normalised, as in the authors' code (``np.mean`` over the
query and the documents): with unit-length ``f``, ``v . f(d)`` is the mean of the cosine
similarities of ``d`` to the query and to each hypothetical document, and re-normalising would
not change the ranking.

The Best Practices paper (Table 6) compares one pseudo-document alone, one pseudo-document with
the query, and eight with the query; its released code uses LlamaIndex's ``HyDEQueryTransform``
with ``include_original=True``, whose embedding strings (the document, then the query) are
embedded and averaged -- the same equation with ``N = 1``. ``include_query=False`` gives the
pseudo-documents-only variant, ``v = 1/N sum_k f(d_k)``.

* :class:`HyDE` writes the documents (cached per query) and computes ``v`` with any embedder;
* :class:`HyDERetrieve` is the dense first stage over a :class:`~funnel_core.embeddings.DenseIndex`
  (or a Milvus dense index). Inside :class:`~funnel_core.best_practices.fusion.HybridRetrieve` it is
  the dense side, so "hybrid with HyDE" is BM25 over the query text fused with dense retrieval over
  the HyDE vector::

      hybrid = HybridRetrieve(BM25Retrieve(bm25, k=100), HyDERetrieve(dense, HyDE(llm), k=100))
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Sequence

import numpy as np

from funnel_core.cache import LRUCache
from funnel_core.errors import check_positive_int, check_probability, check_query
from funnel_core.funnel import Stage, warm_up_objects
from funnel_core.llm import LLM, as_llm, check_prompt_template
from funnel_core.settings import Settings, check_kwargs, setting_names
from funnel_core.units import SCORE_PREFIX, Unit

__all__ = ["DEFAULT_HYDE_PROMPT", "HyDE", "HyDERetrieve", "hyde_vector"]

#: The HyDE paper's web-search instruction (its appendix; the authors' code adds a full stop
#: after "question"). ``{question}`` is the query.
DEFAULT_HYDE_PROMPT = "Please write a passage to answer the question\nQuestion: {question}\nPassage:"


def hyde_vector(query_embedding: Any, document_embeddings: Any, *,
                include_query: bool = True) -> np.ndarray:
    """``v = 1/(N+1) [f(q) + sum_k f(d_k)]`` (``include_query=False``: ``1/N sum_k f(d_k)``).

    Args:
        query_embedding: ``f(q)``, a vector of dimension ``dim``.
        document_embeddings: ``f(d_1) .. f(d_N)``, an ``(N, dim)`` array (``N`` may be 0 when the
            query is included: then ``v = f(q)``).
        include_query: Average the query's embedding in (the HyDE paper's equation).

    Returns:
        ``v`` as a float32 vector (summed in float64).
    """
    q = np.asarray(query_embedding, dtype=np.float64).reshape(-1)
    docs = np.asarray(document_embeddings, dtype=np.float64)
    if docs.size == 0:
        docs = docs.reshape(0, q.shape[0])
    if docs.ndim != 2 or docs.shape[1] != q.shape[0]:
        raise ValueError(f"the hypothetical documents' embeddings have shape {docs.shape}; expected "
                         f"(N, {q.shape[0]}), the dimension of the query's embedding.")
    rows = np.vstack([q[None, :], docs]) if include_query else docs
    if rows.shape[0] == 0:
        raise ValueError("no embedding to average: include_query=False needs at least one "
                         "hypothetical document.")
    v = rows.sum(axis=0) / rows.shape[0]
    if not np.isfinite(v).all():
        raise ValueError("the HyDE vector holds NaN or infinite values; check the embedding model "
                         "(e.g. load it in float32).")
    return v.astype(np.float32)


class HyDE(Settings):
    """Write hypothetical documents for a query and compute the HyDE vector.

    Args:
        llm: Any :class:`~funnel_core.llm.LLM` (``TransformersLLM``, a LlamaIndex or LangChain model
            wrapped by ``llama_index_funnel.llm.LlamaIndexLLM`` / ``langchain_funnel.llm.LangChainLLM``)
            or a local causal-LM folder / hub name (built as a ``TransformersLLM``).
        n: Hypothetical documents per query, ``N`` (the HyDE paper samples 8; the Best Practices
            paper's recommended setting writes 1).
        include_query: Average the query's embedding with the documents' (the HyDE equation);
            ``False``: the documents only.
        prompt: ``str.format`` template with one ``{question}`` placeholder (default: the HyDE
            paper's web-search instruction, :data:`DEFAULT_HYDE_PROMPT`).
        temperature: Sampling temperature; 0 is greedy. ``n > 1`` needs ``temperature > 0``
            (greedy decoding writes the same document ``n`` times); the HyDE paper samples at 0.7.
        top_p: Nucleus-sampling mass (1.0: off).
        top_k: Top-k sampling (0: off).
        max_new_tokens: Length limit of each document, in tokens (the HyDE paper: 512).
        cache_size: Queries whose documents are remembered (an LRU; 0: none). A repeated query, or
            the same query reaching a dense stage and a hybrid that share this object, is written
            for once; the key is the prompt text and every generation setting.
        gguf_file, device, dtype, seed, timeout: :class:`~funnel_core.llm.TransformersLLM` settings,
            used when ``llm`` is a folder or hub name (``seed`` makes sampled documents repeatable).

    Every setting is an attribute; an edit is validated and used at the next call (an edit of the
    LLM or its load-time settings also forgets the remembered documents).
    """

    load_settings = frozenset({"llm", "gguf_file", "device", "timeout", "dtype", "seed"})
    model_attrs = ()
    unserialised = ("llm",)
    setting_attrs = {"llm": "_llm_spec"}  # ``self.llm`` is the provider built from it

    def __init__(self, llm: LLM | str, *, n: int = 1, include_query: bool = True,
                 prompt: str = DEFAULT_HYDE_PROMPT, temperature: float = 0.0, top_p: float = 1.0,
                 top_k: int = 0, max_new_tokens: int = 128, cache_size: int = 1024,
                 gguf_file: str | None = None, device: str | None = None,
                 dtype: str = "auto", seed: int | None = None, timeout: float | None = None) -> None:
        if llm is None or isinstance(llm, dict):
            raise TypeError("HyDE needs llm= (a funnel_core LLM or a local causal-LM folder); an LLM "
                            "object is not serialised: HyDE.from_dict(data, llm=my_llm).")
        self.n = check_positive_int(n, "n (hypothetical documents per query)")
        if not isinstance(include_query, bool):
            raise TypeError(f"include_query must be True or False, got {include_query!r}.")
        self.include_query = include_query
        self.prompt = check_prompt_template(prompt, ("question",), "HyDE prompt")
        # the provider checks these too; here they fail at construction, not at the first query
        LLM._check_params(n, temperature, top_p, top_k, max_new_tokens)
        if n > 1 and temperature == 0:
            raise ValueError(f"n={n} hypothetical documents with temperature=0 (greedy) are {n} copies of "
                             "one document; sample them (e.g. temperature=0.7, as the HyDE paper) or "
                             "use n=1.")
        self.temperature, self.top_p, self.top_k = float(temperature), float(check_probability(top_p, "top_p")), top_k
        self.max_new_tokens = max_new_tokens
        if isinstance(cache_size, bool) or not isinstance(cache_size, int) or cache_size < 0:
            raise ValueError(f"cache_size must be an int >= 0 (0: no cache), got {cache_size!r}.")
        self.cache_size = cache_size
        self.gguf_file, self.device, self.dtype, self.timeout = gguf_file, device, dtype, timeout
        self.seed = seed
        self._llm_spec = llm
        self.llm = self._provider()
        self._cache: LRUCache[tuple, tuple[str, ...]] | None = None

    @classmethod
    def of(cls, owner: str, llm: Any, settings: dict[str, Any], provider: Callable[[Any], Any],
           extra: Sequence[str] = ()) -> "HyDE":
        """What the adapters build from their ``llm`` argument: ``llm`` itself when it is a
        :class:`HyDE` (its settings are used; settings given too raise), else
        ``HyDE(provider(llm), **settings)`` (``provider``: the adapter's conversion of a framework
        model). A setting HyDE does not take raises, naming ``owner`` (the class or factory the
        user called) and the accepted ones (``extra``: the caller's own keywords)."""
        if isinstance(llm, cls):
            if settings:
                raise TypeError(f"{owner} got a HyDE object and settings {sorted(settings)}; set them "
                                "on the HyDE object (or pass the LLM instead).")
            return llm
        check_kwargs(owner, settings, [*setting_names(cls), *extra])
        return cls(provider(llm), **settings)

    def _provider(self) -> LLM:
        if not isinstance(self._llm_spec, str):
            return as_llm(self._llm_spec)
        extra = {k: v for k, v in (("gguf_file", self.gguf_file), ("device", self.device),
                                   ("timeout", self.timeout), ("seed", self.seed)) if v is not None}
        return as_llm(self._llm_spec, dtype=self.dtype, **extra)

    def __setattr__(self, attr: str, value: Any) -> None:
        # ``hyde.llm = other`` edits the setting (validated; the remembered documents are dropped)
        if attr == "llm" and self.__dict__.get("_settings_ready"):
            attr = "_llm_spec"
        super().__setattr__(attr, value)

    def drop_model(self) -> None:
        object.__setattr__(self, "llm", self._provider())
        object.__setattr__(self, "_cache", None)

    def warm_up(self) -> "HyDE":
        """Load a local LLM now (the first query then pays no loading); returns ``self``."""
        warm_up_objects([self.llm])
        return self

    def __repr__(self) -> str:
        return f"HyDE({self.llm!r}, n={self.n}, include_query={self.include_query})"

    # -- the hypothetical documents -------------------------------------------------------------
    def build_prompt(self, query: str) -> str:
        """The instruction the LLM receives for ``query``."""
        return self.prompt.format(question=query)

    def _params(self) -> dict[str, Any]:
        return dict(n=self.n, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                    max_new_tokens=self.max_new_tokens)

    def _key(self, prompt: str) -> tuple:
        return (prompt, *sorted(self._params().items()))

    def _cached(self, prompt: str) -> list[str] | None:
        if not self.cache_size or self._cache is None:
            return None
        hit = self._cache.get(self._key(prompt))
        return None if hit is None else list(hit)

    def _remember(self, prompt: str, docs: list[str]) -> list[str]:
        if self.cache_size:
            cache = self._cache
            if cache is None or cache.maxsize != self.cache_size:
                cache = LRUCache(self.cache_size)
                object.__setattr__(self, "_cache", cache)
            cache[self._key(prompt)] = tuple(docs)
        return docs

    @staticmethod
    def _clean(texts: Sequence[str]) -> list[str]:
        return [t.strip() for t in texts]

    def _known(self, query: str) -> tuple[str, list[str] | None]:
        """``(prompt, documents)`` where the documents are known without a call: ``[]`` for an
        empty query, the remembered ones for a prompt seen before; ``None`` otherwise."""
        query = check_query(query)
        if not query:
            return "", []
        prompt = self.build_prompt(query)
        return prompt, self._cached(prompt)

    def documents(self, query: str) -> list[str]:
        """The ``n`` hypothetical documents for ``query`` (stripped; an empty one stays empty and
        is left out of the vector). An empty query gives ``[]``."""
        prompt, known = self._known(query)
        if known is not None:
            return known
        out = self.llm.generate([prompt], **self._params())[0]
        return self._remember(prompt, self._clean(out))

    async def adocuments(self, query: str) -> list[str]:
        """Async twin of :meth:`documents` (the provider's ``agenerate``)."""
        prompt, known = self._known(query)
        if known is not None:
            return known
        out = (await self.llm.agenerate([prompt], **self._params()))[0]
        return self._remember(prompt, self._clean(out))

    # -- the vector -------------------------------------------------------------------------------
    def combine(self, query: str, documents: Sequence[str],
                embed_query: Callable[[str], Any],
                embed_documents: Callable[[list[str]], Any]) -> np.ndarray:
        """``v`` from ``documents`` already written: ``embed_query(q)`` is ``f(q)``,
        ``embed_documents([d_1, ..])`` the ``(N, dim)`` ``f(d_k)``. Empty documents are left out
        (``N`` counts the others); with none left, ``v = f(q)`` when the query is included, else
        ``ValueError``."""
        docs = [d for d in documents if d.strip()]
        if not docs and not self.include_query:
            raise ValueError(f"the LLM wrote no hypothetical document for {query!r:.80} (all {len(documents)} "
                             "empty) and include_query=False leaves nothing to embed; raise max_new_tokens, "
                             "check the prompt, or set include_query=True.")
        q = embed_query(query) if self.include_query else None
        d = embed_documents(docs) if docs else np.zeros((0, 0), dtype=np.float32)
        if q is None:
            d = np.asarray(d, dtype=np.float64)
            q = np.zeros(d.shape[1])
        return hyde_vector(q, d, include_query=self.include_query)

    def vector(self, query: str, embedder: Any) -> np.ndarray:
        """The HyDE vector of ``query`` with ``embedder`` (anything with ``encode(texts)``, e.g.
        a :class:`~funnel_core.embeddings.SentenceEmbedder`): documents written (or remembered),
        then :meth:`combine`."""
        query = check_query(query)
        return self.combine(query, self.documents(query), *_encoders(embedder))


def _encoders(embedder: Any) -> tuple[Callable[[str], Any], Callable[[list[str]], Any]]:
    if not callable(getattr(embedder, "encode", None)):
        raise TypeError(f"the embedder must have encode(texts) -> (n, dim) array (a SentenceEmbedder), "
                        f"got {type(embedder).__name__}.")
    return (lambda q: embedder.encode([q])[0]), (lambda docs: embedder.encode(docs))


class HyDERetrieve(Settings, Stage):
    """Dense first stage that searches with the HyDE vector (see the module docstring).

    Args:
        index: A :class:`~funnel_core.embeddings.DenseIndex` or a Milvus dense index (anything with
            ``search_many(queries, k, query_embeddings=...)`` and the ``embedder`` it was built
            with, which embeds the query and the hypothetical documents).
        hyde: A :class:`HyDE`, or an LLM (or model folder) for ``HyDE(llm)`` with its defaults.
        k: Units to return (``stage % k`` also cuts).
        name: Stage name (the score is kept under ``funnel["score_<name>"]``).

    Each returned unit records ``funnel["hyde_documents"]``: how many hypothetical documents
    entered the vector. :meth:`documents` shows what the LLM wrote for a query (remembered, so
    it costs no second generation).
    """

    unserialised = ("index", "hyde")

    def __init__(self, index: Any, hyde: HyDE | LLM | str, *, k: int = 100, name: str = "hyde") -> None:
        if not (callable(getattr(index, "search_many", None)) and hasattr(index, "embedder")):
            raise TypeError(f"index must be a DenseIndex or a Milvus dense index (search_many with "
                            f"query_embeddings, and its embedder), got {type(index).__name__}.")
        self.index = index
        self.hyde = hyde if isinstance(hyde, HyDE) else HyDE(hyde)
        self.k = check_positive_int(k, "k")
        self.name = name

    def documents(self, query: str) -> list[str]:
        """The hypothetical documents written for ``query``."""
        return self.hyde.documents(query)

    def vector(self, query: str) -> np.ndarray:
        """The HyDE vector of ``query`` in this index's embedding space."""
        return self.hyde.vector(query, self.index.embedder)

    def _search(self, query: str, docs: list[str]) -> list[Unit]:
        v = self.hyde.combine(query, docs, *_encoders(self.index.embedder))
        hits = self.index.search_many([query], k=self.limit(self.k), query_embeddings=v[None, :])[0]
        used = sum(1 for d in docs if d.strip())
        out = []
        for u in hits:
            unit = u.copy()
            if self.name != "dense":  # the index recorded its similarity last, as score_dense
                last = [key for key in unit.funnel if key.startswith(SCORE_PREFIX + "dense")][-1:]
                for key in last:
                    unit.funnel.pop(key)
                unit.record_score(self.name, float(u.score))  # type: ignore[arg-type]
            unit.funnel["hyde_documents"] = used
            out.append(unit)
        return out

    def run(self, query: str, units: list[Unit]) -> list[Unit]:
        return self._search(query, self.hyde.documents(query))

    async def arun(self, query: str, units: list[Unit]) -> list[Unit]:
        docs = await self.hyde.adocuments(query)
        return await asyncio.to_thread(self._search, query, docs)
