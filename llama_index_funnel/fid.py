"""LlamaIndex node postprocessors for attention-based post-ranking (FunnelRAG stage 3).

* :class:`FiDAttentionRerank` — a Fusion-in-Decoder T5 reader's cross-attention (eq. 3).
* :class:`AttentionLMRerank` — a causal LM's calibrated query-to-passage attention (ICR style).

Both delegate to :mod:`funnel_core.rerank.fid` / :mod:`funnel_core.rerank.attention_lm`; the
model loads on first use. Node titles are read from ``node.metadata["title"]``.
"""

from __future__ import annotations

from typing import Optional

from llama_index.core.bridge.pydantic import Field

from funnel_core.funnel import Stage
from llama_index_funnel._base import StagePostprocessor

__all__ = ["FiDAttentionRerank", "AttentionLMRerank"]


class FiDAttentionRerank(StagePostprocessor):
    """Rerank nodes by the cross-attention of a FiD (T5) reader; see
    :class:`funnel_core.rerank.fid.FiDAttentionScorer` for the parameters."""

    model: str = Field(description="Hub name or local folder of a T5 / FiD checkpoint.")
    top_n: Optional[int] = Field(default=None, description="Nodes to keep (None keeps all).")
    lr: Optional[int] = Field(default=4, description="Representative tokens per passage.")
    aggregation: str = Field(default="mean", description="Table 7 aggregation scheme.")
    last_k: int = Field(default=6, description="Layers for aggregation='last_k_layers' (paper: 6).")
    include_query_tokens: bool = Field(default=False, description="Table 8 ablation.")
    decoder_steps: int = Field(default=1, description="Decoder positions averaged.")
    return_answer: bool = Field(default=False, description="Store the FiD answer in metadata['fid_answer'].")
    template: str = Field(default="question: {question} title: {title} context: {text}")
    template_no_title: str = Field(default="question: {question} context: {text}")
    title_key: str = Field(default="title", description="Metadata key of a node's title.")
    max_length: int = Field(default=256, description="Tokens per question + passage input.")
    batch_size: int = Field(default=16, description="Passages per encoder pass.")
    device: Optional[str] = Field(default=None, description="cpu, cuda, ... (default: best).")
    normalize: bool = Field(default=False, description="Sigmoid-normalise scores.")
    score_threshold: Optional[float] = Field(default=None, description="Drop nodes below this score.")

    @classmethod
    def class_name(cls) -> str:
        return "FiDAttentionRerank"

    def model_post_init(self, __context: object) -> None:
        self._stage = self._build_stage()  # validates the configuration now; the model loads later

    def _build_stage(self) -> Stage:
        from funnel_core.rerank.fid import FiDAttentionScorer

        return FiDAttentionScorer(
            model=self.model, top_n=self.top_n, lr=self.lr, aggregation=self.aggregation,
            last_k=self.last_k, include_query_tokens=self.include_query_tokens,
            decoder_steps=self.decoder_steps, return_answer=self.return_answer,
            template=self.template, template_no_title=self.template_no_title,
            title_key=self.title_key, max_length=self.max_length, batch_size=self.batch_size,
            device=self.device, normalize=self.normalize, score_threshold=self.score_threshold)


class AttentionLMRerank(StagePostprocessor):
    """Rerank nodes by a causal LM's calibrated query-to-passage attention; see
    :class:`funnel_core.rerank.attention_lm.AttentionLMScorer` for the parameters."""

    model: str = Field(description="Hub name or local folder of a causal LM.")
    gguf_file: Optional[str] = Field(default=None, description="GGUF file inside the folder.")
    top_n: Optional[int] = Field(default=None, description="Nodes to keep (None keeps all).")
    attend_from: str = Field(default="query", description="'query' tokens or the 'answer' position.")
    calibration_query: Optional[str] = Field(default="N/A", description="Content-free query (None: off).")
    use_chat_template: bool = Field(default=True, description="Wrap in the tokenizer's chat template.")
    max_passage_tokens: int = Field(default=300, description="Tokens kept per passage.")
    max_context: Optional[int] = Field(default=None, description="Prompt limit (default: the model's).")
    fast_prefix: bool = Field(default=True, description="SDPA for the passages, eager for the query.")
    device: Optional[str] = Field(default=None, description="cpu, cuda, ... (default: best).")
    normalize: bool = Field(default=False, description="Sigmoid-normalise scores.")
    score_threshold: Optional[float] = Field(default=None, description="Drop nodes below this score.")

    @classmethod
    def class_name(cls) -> str:
        return "AttentionLMRerank"

    def model_post_init(self, __context: object) -> None:
        self._stage = self._build_stage()  # validates the configuration now; the model loads later

    def _build_stage(self) -> Stage:
        from funnel_core.rerank.attention_lm import AttentionLMScorer

        return AttentionLMScorer(
            model=self.model, gguf_file=self.gguf_file, top_n=self.top_n,
            attend_from=self.attend_from, calibration_query=self.calibration_query,
            use_chat_template=self.use_chat_template, max_passage_tokens=self.max_passage_tokens,
            max_context=self.max_context, fast_prefix=self.fast_prefix, device=self.device,
            normalize=self.normalize, score_threshold=self.score_threshold)
