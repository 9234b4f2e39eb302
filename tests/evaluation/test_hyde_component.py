"""``component = "hyde"`` and hybrid with HyDE (``hyde = {...}``) in ``funnel eval``: built from a
TOML, run on a small SQuAD file with a tiny local Llama as the writer and the packaged MiniLM."""

from __future__ import annotations

import pytest

from funnel_core.best_practices.fusion import HybridRetrieve
from funnel_core.best_practices.hyde import HyDERetrieve
from funnel_core.cli import main
from funnel_core.evaluation import Report
from funnel_core.evaluation.config import build_systems, load_config
from funnel_core.evaluation.datasets import load_dataset
from tests.evaluation.conftest import squad_config


def _config(tmp_path, llm):
    return squad_config(tmp_path, "hyde.toml", f'''[systems.dense]
component = "dense"
k = 2
[systems.dense_hyde]
component = "hyde"
k = 2
llm = "{llm}"
max_new_tokens = 8
[systems.hybrid_hyde]
component = "hybrid"
k = 2
alpha = 0.3
hyde = {{ llm = "{llm}", max_new_tokens = 8 }}
''')


def test_hyde_systems_build_share_one_writer_and_run(squad_file, tiny_llama_path, minilm_path, tmp_path):
    cfg = _config(tmp_path, tiny_llama_path)
    spec = load_config(cfg)
    ds = load_dataset(spec["dataset"]["path"])
    systems = build_systems(spec["systems"], ds.corpus)
    dense_hyde, hybrid = systems["dense_hyde"], systems["hybrid_hyde"]
    assert isinstance(dense_hyde, HyDERetrieve) and dense_hyde.k == 2
    assert isinstance(hybrid, HybridRetrieve) and isinstance(hybrid.dense, HyDERetrieve)
    assert hybrid.dense.hyde is dense_hyde.hyde          # equal settings: one writer, one cache
    assert hybrid.dense.index is dense_hyde.index is systems["dense"].index
    assert dense_hyde.hyde.max_new_tokens == 8 and dense_hyde.hyde.n == 1

    assert main(["eval", str(cfg), "--no-progress"]) == 0
    d = Report.load(tmp_path / "out").to_dict()
    calls = {s: sum(r["counts"]["llm_calls"] for r in d["per_question"][s]) for s in d["per_question"]}
    questions = d["dataset"]["questions"]
    assert calls == {"dense": 0, "dense_hyde": questions, "hybrid_hyde": 0}  # each question written once
    assert set(d["summary"]["hybrid_hyde"]) >= {"AR@1", "AR@2"}


@pytest.mark.slow  # over the fast tier's 2 s on a quiet machine (load 0.5)
def test_hyde_settings_are_checked(squad_file, tmp_path, capsys):
    cfg = _config(tmp_path, "x")
    cfg.write_text(cfg.read_text().replace('llm = "x"\nmax_new_tokens', 'max_new_tokens'))
    with pytest.raises(ValueError, match=r"\[systems.dense_hyde\]: HyDE needs llm = \"smollm2\""):
        build_systems(load_config(cfg)["systems"], load_dataset(tmp_path / "squad.json").corpus)
    cfg = _config(tmp_path, "x")
    cfg.write_text(cfg.read_text().replace("max_new_tokens = 8 }", "max_tokens = 8 }"))
    with pytest.raises(ValueError, match=r"\[systems.hybrid_hyde\] hyde: unknown key\(s\) \['max_tokens'\]; allowed: .*'max_new_tokens'"):
        load_config(cfg)  # the TOML's own key names, before anything is built
