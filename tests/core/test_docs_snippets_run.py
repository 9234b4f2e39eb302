"""Every Python snippet of README.md and docs/*.md runs.

A snippet leaves the user's own objects undefined on purpose (``docs``, ``nodes``, ``llm``,
``prompt``, a retriever of theirs); ``SETUP`` defines them for each snippet, small and real: the
eight-document corpus of ``tests/conftest.py`` as units, LlamaIndex nodes or LangChain
documents, the frameworks' own fake LLMs, a prompt. Model names become the tiny local models of
``funnel_core.testing`` (``MODELS``), a Milvus server URI a Milvus Lite file; nothing else in a
snippet is changed. Each snippet runs in a temporary folder, so the files it writes stay there.
A snippet that cannot run here says why in ``NEEDS`` (a missing optional extra), and is skipped
only where that is true.
"""

from __future__ import annotations

import importlib.util
import re
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"```python\n(.*?)```", re.S)
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

pytestmark = [pytest.mark.models, pytest.mark.slow]


def snippets() -> dict[str, str]:
    out = {}
    for page in PAGES:
        for i, m in enumerate(BLOCK.finditer(page.read_text(encoding="utf-8"))):
            out[f"{page.relative_to(ROOT)}#{i}"] = textwrap.dedent(m.group(1))
    return out


# -- the user objects the snippets assume ------------------------------------------------------
CORPUS = """
from tests.conftest import CORPUS as _C
from funnel_core import Unit
units = documents = [Unit(id=i, text=t, metadata=dict(m), level="document") for i, t, m in _C]
texts, ids = [u.text for u in units], [u.id for u in units]
"""
LI = CORPUS + """
from llama_index.core.schema import TextNode
from llama_index.core.llms import MockLLM
nodes = [TextNode(id_=u.id, text=u.text, metadata=dict(u.metadata)) for u in units]
llm = MockLLM(max_tokens=8)
from llama_index.core import Settings as _Settings
_Settings.llm = llm   # the user's default LLM (query engines built without llm=)
from llama_index_funnel import BM25Retriever as _B
bm25_retriever = retriever = vector_retriever = _B.from_defaults(nodes=nodes, similarity_top_k=4)
"""
LC = CORPUS + """
from langchain_core.documents import Document
from langchain_core.language_models.fake import FakeListLLM
from langchain_core.prompts import PromptTemplate
docs = [Document(id=u.id, page_content=u.text, metadata={**u.metadata, "source": "a.md"}) for u in units]
llm = FakeListLLM(responses=["Shakespeare wrote it."] * 50)
prompt = PromptTemplate.from_template("{context}\\n\\nQuestion: {question}")
direct_prompt = PromptTemplate.from_template("{question}")
def format_docs(ds):
    return "\\n\\n".join(d.page_content for d in ds)
from langchain_funnel import BM25Retriever as _B
bm25_retriever = retriever = _B.from_documents(docs, k=4)
"""
ROUTER = """
import numpy as _np
from funnel_core.granularity import GranularityRouter
from funnel_core.embeddings import SentenceEmbedder
router = GranularityRouter(5, embedder=SentenceEmbedder(TINY_CE, device="cpu"))
router.fit(["Who wrote Hamlet?", "What is BM25?", "Where is Paris?"], _np.eye(5)[[0, 2, 4]])
"""

SETUP: dict[str, str] = {
    "README.md#0": CORPUS,
    "docs/best_practices.md#0": CORPUS + """
my_llm = lambda prompt: 'Vitamin D is a vitamin.'
from funnel_core.testing import ScriptedLLM
llm = ScriptedLLM("Vitamin D lowers the risk of respiratory infections.")
""",
    "docs/best_practices.md#1": LI,
    "docs/best_practices.md#2": LC,
    "docs/best_practices.md#3": "",   # self-contained (SmolLM2 becomes the tiny Llama)
    "docs/clustering.md#0": CORPUS,
    "docs/clustering.md#1": LI + "from llama_index.core.vector_stores import MetadataFilters",
    "docs/clustering.md#2": LC,
    "docs/evaluation.md#0": LI + """
import json
with open("my_docs.jsonl", "w") as f:
    for u in units: f.write(json.dumps({"id": u.id, "text": u.text, "title": u.metadata["title"]}) + "\\n")
with open("my_questions.jsonl", "w") as f:
    f.write(json.dumps({"id": "q1", "question": "Who wrote Hamlet?", "answers": ["Shakespeare"]}) + "\\n")
    f.write(json.dumps({"id": "q2", "question": "What is the capital of France?", "answers": ["Paris"]}) + "\\n")
my_llamaindex_retriever = bm25_retriever
from llama_index.core.postprocessor import SimilarityPostprocessor
my_reranker = SimilarityPostprocessor(similarity_cutoff=0.0)
from langchain_funnel import BM25Retriever as _LB
my_langchain_retriever = _LB.from_texts([u.text for u in units], k=4)
""",
    "docs/evaluation.md#1": LC + """
import json
from funnel_core.evaluation import evaluate, load_dataset
squad = {"data": [{"title": "Hamlet", "paragraphs": [{"context": units[5].text,
          "qas": [{"id": "q1", "question": "Who wrote Hamlet?", "answers": [{"text": "Shakespeare", "answer_start": 0}]}]}]}]}
open("squad-dev.json", "w").write(json.dumps(squad))
from funnel_core.bm25 import BM25Index, BM25Retrieve
systems = {"bm25": BM25Retrieve(BM25Index().index(load_dataset("squad-dev.json").corpus), k=3)}
my_langchain_llm = llm
""",
    "docs/frameworks.md#0": CORPUS + """
from llama_index.core import Document as _D
docs = [_D(text=' '.join(u.text for u in units) * 3, id_='doc')]
""",
    "docs/funnel.md#0": CORPUS + """
from funnel_core.rerank.fid import FiDAttentionScorer
fid_scorer = FiDAttentionScorer(model=TINY_T5)
""",
    "docs/funnel.md#1": CORPUS,
    "docs/funnel.md#2": LI + """
from llama_index_funnel import ClusteredBM25Retriever as _C
from llama_index_funnel.rerank import CrossEncoderRerank
clustered_retriever = _C.from_defaults(nodes=nodes, max_tokens=40)
reranker_postprocessor = CrossEncoderRerank(model=TINY_CE, top_n=4)
""",
    "docs/funnel.md#3": LC + """
from langchain_funnel import ClusteredBM25Retriever as _C
from langchain_funnel.rerank import CrossEncoderReranker
clustered_retriever = _C.from_documents(docs, max_tokens=40)
reranker = CrossEncoderReranker(model=TINY_CE, top_n=4)
""",
    "docs/index.md#0": CORPUS,
    "docs/index.md#1": LI,
    "docs/index.md#2": LC,
    "docs/llm_retrieval.md#0": "",
    "docs/llm_retrieval.md#1": CORPUS + """
from funnel_core.bm25 import BM25Index
from funnel_core.llm import TransformersLLM
index = BM25Index().index(units)
llm = TransformersLLM(TINY_LLAMA)
""",
    "docs/llm_retrieval.md#2": LI + """
from llama_index.core.query_engine import RetrieverQueryEngine
from funnel_core.models import SMOLLM2_GGUF
OpenAI = lambda **kw: MockLLM(max_tokens=8)
""",
    "docs/llm_retrieval.md#3": LC + """
from langchain_core.language_models.fake_chat_models import FakeListChatModel
ChatOpenAI = lambda **kw: FakeListChatModel(responses=["1"] * 50)
""",
    "docs/llm_retrieval.md#4": CORPUS + """
from llama_index.core.schema import NodeWithScore, TextNode
from funnel_core.llm import TransformersLLM
llm = TransformersLLM(TINY_LLAMA)
nodes = [NodeWithScore(node=TextNode(id_=u.id, text=u.text), score=1.0) for u in units]
""",
    "docs/llm_retrieval.md#5": CORPUS + """
records = [{"question": "Who wrote Hamlet?", "answers": ["Shakespeare"], "positive": units[5].text,
            "negatives": [units[0].text, units[1].text]},
           {"question": "What is BM25?", "answers": ["a ranking function"], "positive": units[3].text,
            "negatives": [units[7].text]}]
""",
    "docs/llm_retrieval.md#6": CORPUS + """
from funnel_core.llm import TransformersLLM
llm = TransformersLLM(TINY_LLAMA)
long_text = " ".join(u.text for u in units) * 20
""",
    "docs/llm_retrieval.md#7": LI + """
from llama_index.core.query_engine import RetrieverQueryEngine, TransformQueryEngine
from llama_index.core.retrievers import TransformRetriever
long_text = " ".join(u.text for u in units) * 20
""",
    "docs/mix_of_granularity.md#0": CORPUS + """
documents = documents + [Unit(id="sb50", text="The Denver Broncos won Super Bowl 50, the NFL championship "
                                              "game played in February 2016 at Levi's Stadium.")]
train_questions = ["Who wrote Hamlet?", "What is BM25?", "Where is the Eiffel Tower?"]
train_answers = ["Shakespeare", "ranking function", "Paris"]
""",
    "docs/mix_of_granularity.md#1": LI + ROUTER + """
from llama_index.core import Document as _D
docs = [_D(text=' '.join(u.text for u in units), id_='doc')]
def leaf_retriever_over(leaves):
    return _B.from_defaults(nodes=leaves, similarity_top_k=2)
""",
    "docs/mix_of_granularity.md#2": LC + ROUTER + "from langchain_core.runnables import RunnablePassthrough",
    "docs/offline_build.md#0": CORPUS + """
from funnel_core.bm25 import BM25Index
bm25_index = BM25Index().index(units)
passages = units
""",
    "docs/performance.md#0": "",
    "docs/persistence.md#0": LI + """
from llama_index.core import StorageContext, VectorStoreIndex, load_index_from_storage
from llama_index.core.embeddings import MockEmbedding
from llama_index.core import Settings as _S
_S.embed_model = MockEmbedding(embed_dim=8)
storage_context = StorageContext.from_defaults()
VectorStoreIndex(nodes, storage_context=storage_context)
""",
    "docs/persistence.md#1": CORPUS + "from funnel_core.bm25 import BM25Index\nindex = BM25Index().index(units)",
    "docs/postrank.md#0": CORPUS + """
from funnel_core.bm25 import BM25Index, BM25Retrieve
bm25 = BM25Retrieve(BM25Index().index(units), k=8)
""",
    "docs/postrank.md#1": "",
    "docs/postrank.md#2": LI + "import shutil; shutil.copytree(TINY_T5, 'models/fid')",
    "docs/postrank.md#3": LC + "import shutil; shutil.copytree(TINY_T5, 'models/fid')",
    "docs/postrank.md#4": """
from funnel_core.train.fid import FiDExample
examples = [FiDExample("who wrote Hamlet?", ["Shakespeare"], ["Hamlet is by William Shakespeare.", "Paris."])]
""",
    "docs/prerank.md#0": CORPUS + "from funnel_core.bm25 import BM25Index\nindex = BM25Index().index(units)",
    "docs/prerank.md#1": CORPUS + """
from langchain_core.documents import Document
corpus = units
queries = {"q1": "Which capital city is in France?", "q2": "How do search engines rank documents?"}
qrels = {"q1": {"d0": 1}, "q2": {"d3": 1}}
q = queries["q1"]
answers = ["Shakespeare"]
docs = [units[5], units[6], units[0]]
scored_passages = [Unit(id=f"{u.id}#0", text=u.text, parent_id=u.id, score=s)
                   for u, s in zip(docs, (2.0, 1.0, 0.1))]
""",
    "docs/prerank.md#2": LI,
    "docs/prerank.md#3": LC,
    "docs/scaling_out.md#0": CORPUS,
    "docs/scaling_out.md#1": CORPUS + """
from funnel_core.backends.milvus import MilvusClusteredBM25Index
MilvusClusteredBM25Index("./cluster.db", "scifact", max_tokens=64).index(units)
""",
    "docs/scaling_out.md#2": "",
    "docs/scaling_out.md#3": LI + """
from funnel_core.backends.milvus import MilvusBackend
nodes = [TextNode(id_=u.id, text=u.text, metadata={**u.metadata, "year": 2015}) for u in units]
lite = MilvusBackend("./funnel.db", collection="scifact")
cluster = MilvusBackend("./cluster.db", collection="scifact")
""",
    "docs/scaling_out.md#4": LC + """
from funnel_core.backends.milvus import MilvusBackend
lite = MilvusBackend("./funnel.db", collection="scifact")
cluster = MilvusBackend("./cluster.db", collection="scifact")
""",
    "docs/training.md#0": "",
}

#: Snippets that need an optional extra (the extras of tests/README.md's gate table).
NEEDS: dict[str, tuple[str, ...]] = {
    "docs/offline_build.md#0": ("ray",),
    "docs/performance.md#0": ("onnxruntime",),
    "docs/scaling_out.md#0": ("pymilvus", "milvus_lite"),
    "docs/scaling_out.md#1": ("pymilvus", "milvus_lite"),
    "docs/scaling_out.md#2": ("pymilvus", "milvus_lite"),
    "docs/scaling_out.md#3": ("pymilvus", "milvus_lite"),
    "docs/scaling_out.md#4": ("pymilvus", "milvus_lite"),
}


def models(request) -> dict[str, str]:
    return {"ce": request.getfixturevalue("tiny_cross_encoder_path"),
            "t5": request.getfixturevalue("tiny_t5_path"),
            "llama": request.getfixturevalue("tiny_llama_path")}


def localised(code: str, m: dict[str, str]) -> str:
    """The snippet with hub model names as the tiny local models and remote services as local
    ones (nothing else changes)."""
    for name in ("BAAI/bge-reranker-v2-m3", "cross-encoder/ms-marco-MiniLM-L-6-v2", "path/to/cross-encoder",
                 "my-post-ranker"):
        code = code.replace(f'"{name}"', repr(m["ce"]))
    for name in ("google/flan-t5-base", "path/to/fid-t5"):
        code = code.replace(f'"{name}"', repr(m["t5"]))
    code = code.replace("smollm2_path()", repr(m["llama"])).replace("gguf_file=SMOLLM2_GGUF", "gguf_file=None")
    code = code.replace('device="cuda"', 'device="cpu"').replace("num_gpus=1", "num_gpus=0")
    code = code.replace('"http://milvus:19530"', '"./cluster.db"')
    code = code.replace('"benchmarks/train/squad_ce.toml"', "TRAIN_CONFIG")
    return code


def test_every_snippet_has_its_setup():
    assert set(SETUP) == set(snippets()), "a snippet was added, removed or moved: update SETUP"


@pytest.mark.parametrize("key", sorted(snippets()))
def test_snippet_runs(key, request, tmp_path, monkeypatch):
    for module in NEEDS.get(key, ()):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"needs {module} (an optional extra)")
    m = models(request)
    if importlib.util.find_spec("llama_index") is not None:  # a setup may set the default LLM
        from llama_index.core import Settings

        monkeypatch.setattr(Settings, "_llm", getattr(Settings, "_llm", None))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(ROOT))
    ns: dict = {"__name__": "__snippet__", "TINY_CE": m["ce"], "TINY_T5": m["t5"], "TINY_LLAMA": m["llama"]}
    if key == "docs/training.md#0":
        ns["TRAIN_CONFIG"] = train_config(tmp_path, m)
    exec(compile(SETUP[key], f"<setup of {key}>", "exec"), ns)
    exec(compile(localised(snippets()[key], m), key, "exec"), ns)


def train_config(tmp_path: Path, m: dict[str, str]) -> str:
    """A tiny ``funnel train`` configuration of the shape benchmarks/train/squad_ce.toml has."""
    import json

    paragraphs = [{"context": t, "qas": [{"id": f"q{i}", "question": q, "answers": [{"text": a, "answer_start": 0}]}]}
                  for i, (t, q, a) in enumerate([
                      ("Hamlet is a tragedy written by William Shakespeare.", "Who wrote Hamlet?", "Shakespeare"),
                      ("Paris is the capital of France.", "What is the capital of France?", "Paris"),
                      ("BM25 is a ranking function.", "What is BM25?", "ranking function"),
                      ("Berlin is the capital of Germany.", "What is the capital of Germany?", "Berlin")])]
    (tmp_path / "squad.json").write_text(json.dumps({"data": [{"title": "t", "paragraphs": paragraphs}]}))
    cfg = tmp_path / "train.toml"
    cfg.write_text(f'''[dataset]
path = "squad.json"
split = "train"

[train]
kind = "cross-encoder"
base_model = "{m["ce"]}"
output = "out-ce"
held_out = 1
max_minutes = 1

[mining]
first_stage = {{ component = "bm25", k = 3 }}
depth = 3

[model]
num_negatives = 1
queries_per_step = 2
max_length = 64
epochs = 1
''')
    return str(cfg)
