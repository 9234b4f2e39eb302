"""The LLM rerankers of ``funnel eval``: ``rerank = { kind = "rankrag", llm = ... }`` (RankRAG's
P(True)) and ``rerank = { kind = "attention_lm", model = ... }`` (a decoder-only LM's attention),
built from a TOML and run on a small SQuAD file with a tiny local Llama."""

from __future__ import annotations

import pytest

from funnel_core.cli import main
from funnel_core.evaluation import Report
from funnel_core.evaluation.config import build_systems, load_config
from funnel_core.evaluation.datasets import load_dataset
from funnel_core.funnel import Funnel
from funnel_core.rerank.attention_lm import AttentionLMScorer
from funnel_core.rerank.rankrag import RankRAGScorer
from tests.evaluation.conftest import squad_config


def _config(tmp_path, rerank: str) -> str:
    return str(squad_config(tmp_path, "rerank.toml", f'''[systems.bm25]
component = "bm25"
k = 2
[systems.bm25_reranked]
component = "bm25"
k = 3
rerank = {rerank}
'''))


def test_rankrag_rerank_builds_the_scorer_with_the_tables_settings_and_runs(squad_file, tiny_llama_path,
                                                                             tmp_path):
    cfg = _config(tmp_path, f'{{ kind = "rankrag", llm = "{tiny_llama_path}", mode = "logprobs", '
                            'max_passage_words = 40, batch_size = 3, top_n = 2, dtype = "float32" }')
    spec = load_config(cfg)
    system = build_systems(spec["systems"], load_dataset(spec["dataset"]["path"]).corpus)["bm25_reranked"]
    assert isinstance(system, Funnel)
    scorer = system.stages[-1]
    assert isinstance(scorer, RankRAGScorer)
    assert (scorer.mode, scorer.max_passage_words, scorer.batch_size, scorer.top_n, scorer.dtype) == \
        ("logprobs", 40, 3, 2, "float32")
    assert scorer.llm.model_name_or_path == tiny_llama_path

    assert main(["eval", cfg, "--no-progress"]) == 0
    d = Report.load(tmp_path / "out").to_dict()
    questions = list(load_dataset(spec["dataset"]["path"]).queries.values())
    rows = d["per_question"]["bm25_reranked"]
    assert len(rows) == len(questions) and all(len(r["ranked"]) <= 2 for r in rows)
    # one P(True) pair per BM25 candidate (k = 3), none for plain BM25
    candidates = sum(len(system.stages[0](q)) for q in questions)
    assert candidates > len(questions)
    assert sum(r["counts"]["pairs_scored"] for r in rows) == candidates
    assert sum(r["counts"]["pairs_scored"] for r in d["per_question"]["bm25"]) == 0


@pytest.mark.parametrize("rerank, message", [
    ('{ kind = "rankrag", model = "x" }', "unknown key(s) ['model']"),       # RankRAG takes llm=, not model=
    ('{ kind = "rankrag", mode = "logprobs" }', "rerank needs `llm`"),
    ('{ kind = "monot5", model = "x" }', "kind must be one of ('cross_encoder', 'rankrag', 'attention_lm'), "
                                         "got 'monot5'"),
    ('{ kind = "attention_lm", llm = "x" }', "unknown key(s) ['llm']"),   # attention_lm takes model=
    ('{ max_passage_words = 40, model = "x" }', "unknown key(s) ['max_passage_words']"),  # a CE setting only
])
def test_a_rerank_table_of_the_wrong_shape_is_refused_naming_the_fix(squad_file, tmp_path, rerank, message):
    with pytest.raises(ValueError) as err:
        spec = load_config(_config(tmp_path, rerank))
        build_systems(spec["systems"], load_dataset(spec["dataset"]["path"]).corpus)
    assert message in str(err.value)


def test_attention_lm_rerank_builds_the_scorer_with_the_tables_settings(squad_file, tiny_llama_path, tmp_path):
    cfg = _config(tmp_path, f'{{ kind = "attention_lm", model = "{tiny_llama_path}", calibration_query = "N/A", '
                            'max_passage_tokens = 64, dtype = "float32" }')
    spec = load_config(cfg)
    corpus = load_dataset(spec["dataset"]["path"]).corpus
    scorer = build_systems(spec["systems"], corpus)["bm25_reranked"].stages[-1]
    assert isinstance(scorer, AttentionLMScorer)
    assert (scorer.model_name, scorer.calibration_query, scorer.max_passage_tokens, scorer.dtype) == \
        (tiny_llama_path, "N/A", 64, "float32")
    assert main(["eval", cfg, "--no-progress"]) == 0


def test_smollm2_names_the_packaged_gguf_for_an_llm_ranker_only(squad_file, tmp_path):
    """``"smollm2"`` is the packaged SmolLM2-135M-Instruct for a causal-LM ranker (its folder and GGUF
    file; nothing is loaded while building), and a cross-encoder named "smollm2" gets no gguf_file."""
    from funnel_core.models import SMOLLM2_GGUF, smollm2_path

    spec = load_config(_config(tmp_path, '{ kind = "rankrag", llm = "smollm2" }'))
    scorer = build_systems(spec["systems"], load_dataset(spec["dataset"]["path"]).corpus)["bm25_reranked"].stages[-1]
    assert (scorer.llm.model_name_or_path, scorer.llm.gguf_file) == (smollm2_path(), SMOLLM2_GGUF)
    spec = load_config(_config(tmp_path, '{ model = "smollm2" }'))
    ce = build_systems(spec["systems"], load_dataset(spec["dataset"]["path"]).corpus)["bm25_reranked"].stages[-1]
    assert ce.model_name == "smollm2"
