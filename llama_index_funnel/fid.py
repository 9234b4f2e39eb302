"""LlamaIndex node postprocessors for attention-based post-ranking (FunnelRAG stage 3).

* :class:`FiDAttentionRerank` — a Fusion-in-Decoder T5 reader's cross-attention (eq. 3).
* :class:`AttentionLMRerank` — a causal LM's calibrated query-to-passage attention (ICR style).

Both hold a :mod:`funnel_core.rerank.fid` / :mod:`funnel_core.rerank.attention_lm` stage; the
model loads on first use. Node titles are read from ``node.metadata["title"]``.
"""

from __future__ import annotations

from typing import ClassVar, Optional

from llama_index.core.bridge.pydantic import Field

from funnel_core.rerank.attention_lm import DEFAULT_INSTRUCTION, AttentionLMScorer
from funnel_core.rerank.fid import FiDAttentionScorer
from llama_index_funnel._base import StagePostprocessor

__all__ = ["FiDAttentionRerank", "AttentionLMRerank"]


class FiDAttentionRerank(StagePostprocessor):
    """Rerank nodes by the cross-attention of a FiD (T5) reader: a
    :class:`~funnel_core.rerank.fid.FiDAttentionScorer`."""

    stage_class: ClassVar[type] = FiDAttentionScorer

    model: str = Field(
        default=..., description='Hub name or local folder of a T5 / FiD checkpoint.')
    template: str = Field(
        default='question: {question} title: {title} context: {text}', description='Reader input with {question}, {title} and {text}.')
    template_no_title: str = Field(
        default='question: {question} context: {text}', description='Reader input for units without a title.')
    title_key: str = Field(default='title', description="Metadata key of a unit's title.")
    lr: Optional[int] = Field(
        default=4, description='Representative tokens per passage (None: all).')
    aggregation: str = Field(default='mean', description='Table 7 aggregation scheme.')
    last_k: int = Field(default=6, description="Layers for aggregation='last_k_layers' (paper: 6).")
    include_query_tokens: bool = Field(
        default=False, description='Table 8 ablation: count the question tokens.')
    decoder_steps: int = Field(default=1, description='Decoder positions averaged.')
    return_answer: bool = Field(
        default=False, description="Store the FiD answer in metadata['fid_answer'].")
    max_answer_tokens: int = Field(default=20, description='Tokens generated for the answer.')
    max_length: int = Field(default=256, description='Tokens per question + passage input.')
    batch_size: int = Field(default=16, description='Passages per encoder pass.')
    device: Optional[str] = Field(
        default=None, description='cpu, cuda, ... (None: best available).')
    top_n: Optional[int] = Field(default=None, description='Units to keep (None keeps all).')
    score_threshold: Optional[float] = Field(
        default=None, description='Drop units below this score.')
    normalize: bool = Field(default=False, description='Sigmoid-normalise scores.')
    name: Optional[str] = Field(
        default=None, description='Stage name in traces and score histories.')
    dtype: str = Field(
        default='auto', description='auto | float32 | bfloat16 | float16 (auto: bf16 autocast only where the hardware runs it natively, fp16 on older GPUs, else fp32).')

    @classmethod
    def class_name(cls) -> str:
        return "FiDAttentionRerank"


class AttentionLMRerank(StagePostprocessor):
    """Rerank nodes by a causal LM's calibrated query-to-passage attention: an
    :class:`~funnel_core.rerank.attention_lm.AttentionLMScorer`."""

    stage_class: ClassVar[type] = AttentionLMScorer

    model: str = Field(default=..., description='Hub name or local folder of a causal LM.')
    gguf_file: Optional[str] = Field(default=None, description='GGUF file inside the folder.')
    attend_from: str = Field(
        default='query', description="'query' tokens or the 'answer' position.")
    calibration_query: Optional[str] = Field(
        default='N/A', description='Content-free query (None: no calibration).')
    instruction: str = Field(default=DEFAULT_INSTRUCTION,
                             description="Instruction before the passages.")
    passage_template: str = Field(
        default='[{index}] {text}\n\n', description='Template of one passage with {index} and {text}.')
    query_template: str = Field(
        default='Query: {query}', description='Template of the query with {query}.')
    use_chat_template: bool = Field(
        default=True, description="Wrap in the tokenizer's chat template.")
    max_passage_tokens: int = Field(default=300, description='Tokens kept per passage.')
    max_context: Optional[int] = Field(
        default=None, description="Prompt limit (None: the model's).")
    fast_prefix: bool = Field(
        default=True, description='SDPA for the passages, eager for the query.')
    device: Optional[str] = Field(
        default=None, description='cpu, cuda, ... (None: best available).')
    top_n: Optional[int] = Field(default=None, description='Units to keep (None keeps all).')
    score_threshold: Optional[float] = Field(
        default=None, description='Drop units below this score.')
    normalize: bool = Field(default=False, description='Sigmoid-normalise scores.')
    batch_size: int = Field(default=1, description='Prompts per forward pass.')
    name: Optional[str] = Field(
        default=None, description='Stage name in traces and score histories.')
    dtype: str = Field(
        default='auto', description='auto | float32 | bfloat16 | float16 (auto: bf16 autocast only where the hardware runs it natively, fp16 on older GPUs, else fp32).')

    @classmethod
    def class_name(cls) -> str:
        return "AttentionLMRerank"
