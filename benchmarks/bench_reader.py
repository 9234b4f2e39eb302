"""Does better retrieval give better answers? (FunnelRAG Table 3's question.) The systems of
``configs/squad_reader.toml`` on SQuAD dev-a, each system's top-k read by SmolLM2-135M-Instruct
(the packaged GGUF) through LangChain's own ``HuggingFacePipeline``, wrapped by ``LangChainLLM``;
exact match and token F1 of its answers (``EM@k`` / ``F1@k``) next to answer recall::

    nice -n 10 python benchmarks/bench_reader.py [--limit 20]

Everything but the reader comes from the TOML (``funnel eval`` without ``[reader]`` runs the
retrieval alone); the prompt there is SmolLM2's chat template around the question.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from funnel_core.evaluation.config import load_config, run_config
from funnel_core.testing import SMOLLM2_GGUF, offline_env, smollm2_path

CONFIG = Path(__file__).resolve().parent / "configs" / "squad_reader.toml"


def reader(max_new_tokens: int):
    """SmolLM2 as a LangChain LLM (greedy), wrapped as the harness's reader."""
    from langchain_community.llms import HuggingFacePipeline
    from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

    from funnel_core.models import gguf_model_kwargs
    from langchain_funnel.llm import LangChainLLM

    kw = gguf_model_kwargs(SMOLLM2_GGUF)
    tok = AutoTokenizer.from_pretrained(smollm2_path(), gguf_file=SMOLLM2_GGUF)
    model = AutoModelForCausalLM.from_pretrained(smollm2_path(), **kw)
    pipe = pipeline("text-generation", model=model, tokenizer=tok, max_new_tokens=max_new_tokens,
                    do_sample=False, return_full_text=False)
    return LangChainLLM(HuggingFacePipeline(pipeline=pipe))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(CONFIG))
    ap.add_argument("--limit", type=int, default=None, help="fewer questions (a smoke run)")
    ap.add_argument("--output", default=None)
    args = ap.parse_args()
    offline_env()
    max_new_tokens = int(load_config(args.config)["reader"].get("max_new_tokens", 32))
    report, paths = run_config(args.config, limit=args.limit, output=args.output, reader=reader(max_new_tokens))
    print(report.to_markdown())
    print("written:", *map(str, paths.values()))


if __name__ == "__main__":
    main()
