"""The user-facing settings of the rerankers' adapters, declared once for LlamaIndex and LangChain.

Each model below lists the settings of one core stage as pydantic fields (name, type, default,
description); the LlamaIndex and the LangChain adapter of that stage both inherit it, so editors,
mypy and the docs see every field and each default is written once.
``tests/adapters/test_adapter_fields.py`` checks every field against the stage's constructor.
Imported only by the adapter packages: pydantic comes with both frameworks, and the stages
themselves do not need it.
"""

from __future__ import annotations

from typing import Any, ClassVar, Optional

from pydantic import BaseModel, Field

from funnel_core.llm import LLM_DESCRIPTION, AdapterLLM
from funnel_core.rerank.attention_lm import DEFAULT_INSTRUCTION, AttentionLMScorer
from funnel_core.rerank.cross_encoder import CrossEncoderScorer
from funnel_core.rerank.fid import FiDAttentionScorer
from funnel_core.rerank.monot5 import MonoT5Scorer
from funnel_core.rerank.rankrag import DEFAULT_RANKRAG_PROMPT, RankRAGScorer

__all__ = ["RerankerFields", "CrossEncoderFields", "MonoT5Fields", "FiDAttentionFields", "AttentionLMFields", "RankRAGFields"]


class RerankerFields(BaseModel):
    """The settings every reranker takes from :class:`~funnel_core.rerank.base.Reranker`."""

    top_n: Optional[int] = Field(default=None, description="Units to keep (None: all).")
    score_threshold: Optional[float] = Field(default=None, description="Drop units scoring below this.")
    name: Optional[str] = Field(default=None, description="Stage name in traces and score histories.")


class CrossEncoderFields(RerankerFields):
    """The settings of :class:`~funnel_core.rerank.cross_encoder.CrossEncoderScorer`, for both adapters."""

    stage_class: ClassVar[type] = CrossEncoderScorer

    model: Optional[str] = Field(
        default=None, description="Hub name or local folder; None = the backend's default model.")
    library: str = Field(
        default="sentence-transformers",
        description="Model library: sentence-transformers | flagembedding | transformers.")
    batch_size: int = Field(default=32, description='Pairs per forward pass.')
    device: Optional[str] = Field(default=None, description='cpu / cuda / mps; None = automatic.')
    max_length: int = Field(
        default=512, description='Tokens per (query, passage) pair; the passage is truncated, never the query.')
    sort_by_length: bool = Field(default=True, description='Batch pairs of similar length.')
    normalize: bool = Field(
        default=True, description="Sigmoid scores into (0, 1), as the framework's own cross-encoder "
                                  "rerankers give them (so a 0.5 similarity cut-off means 'relevant'); "
                                  "False: the model's raw logits (the core CrossEncoderScorer's default).")
    window_words: Optional[int] = Field(
        default=None, description='Score texts longer than this many words by their best window (MaxP); None = truncate.')
    window_overlap: int = Field(default=0, description='Words shared by consecutive windows.')
    fuse_weight: Optional[float] = Field(
        default=None, description='Weight of the previous score in a min-max interpolation; None = off.')
    model_kwargs: Optional[dict[str, Any]] = Field(
        default=None, description='Extra keyword arguments of the model loader.')
    runtime: str = Field(
        default='auto', description='auto | torch | onnx | openvino (auto: torch on a GPU, the fastest runtime within 0.005 nDCG@10 of fp32 measured on a CPU).')
    export_dir: Optional[str] = Field(
        default=None, description='Folder of the ONNX export; None = next to the model or the user cache.')
    dtype: str = Field(
        default='auto', description='auto | float32 | bfloat16 | float16 (torch runtime; auto: bf16 only where the hardware runs it natively).')


class MonoT5Fields(RerankerFields):
    """The settings of :class:`~funnel_core.rerank.monot5.MonoT5Scorer`, for both adapters."""

    stage_class: ClassVar[type] = MonoT5Scorer

    model: str = Field(
        default='castorini/monot5-base-msmarco', description='Hub name or local folder.')
    batch_size: int = Field(default=16, description='Prompts per forward pass.')
    device: Optional[str] = Field(default=None, description='cpu / cuda / mps; None = automatic.')
    max_length: int = Field(
        default=512, description='Tokens per prompt; the passage is truncated, never the query.')
    sort_by_length: bool = Field(default=True, description='Batch prompts of similar length.')
    template: str = Field(
        default='Query: {query} Document: {document} Relevant:', description='Prompt with {query} before {document}.')
    true_token: str = Field(default='true', description='Token whose probability is the relevance.')
    false_token: str = Field(default='false', description='The other token of the binary choice.')
    normalize: bool = Field(default=False, description='Sigmoid scores into (0, 1).')
    model_kwargs: Optional[dict[str, Any]] = Field(
        default=None, description='Extra keyword arguments of the model loader.')
    dtype: str = Field(
        default='auto', description='auto | float32 | bfloat16 | float16 (auto: bf16 autocast only where the hardware runs it natively, fp16 on older GPUs, else fp32).')


class FiDAttentionFields(RerankerFields):
    """The settings of :class:`~funnel_core.rerank.fid.FiDAttentionScorer`, for both adapters."""

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
    normalize: bool = Field(default=False, description='Sigmoid-normalise scores.')
    dtype: str = Field(
        default='auto', description='auto | float32 | bfloat16 | float16 (auto: bf16 autocast only where the hardware runs it natively, fp16 on older GPUs, else fp32).')


class AttentionLMFields(RerankerFields):
    """The settings of :class:`~funnel_core.rerank.attention_lm.AttentionLMScorer`, for both adapters."""

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
    normalize: bool = Field(default=False, description='Sigmoid-normalise scores.')
    batch_size: int = Field(default=1, description='Prompts per forward pass.')
    dtype: str = Field(
        default='auto', description='auto | float32 | bfloat16 | float16 (auto: bf16 autocast only where the hardware runs it natively, fp16 on older GPUs, else fp32).')


class RankRAGFields(AdapterLLM, RerankerFields):
    """The settings of :class:`~funnel_core.rerank.rankrag.RankRAGScorer`, for both adapters.

    A framework model is read as text only (RankRAG parses its replies); a local causal LM
    given by name/folder is scored from its True/False logits."""

    stage_class: ClassVar[type] = RankRAGScorer

    llm: Any = Field(description=LLM_DESCRIPTION)

    prompt: str = Field(default=DEFAULT_RANKRAG_PROMPT,
                        description="Template with {question} and {passage} (optionally "
                                    "{history}); RANKRAG_PROMPTS names the presets: paper, "
                                    "fever, conversational, smollm2.")
    mode: str = Field(default="auto", description="'auto', 'logprobs' or 'generate'.")
    max_passage_words: int = Field(default=300, description="Passages are cut to this length.")
    max_new_tokens: int = Field(default=8, description="Tokens per judgement (generate mode).")
    samples: int = Field(default=1, description="Judgements per pair (generate mode).")
    batch_size: int = Field(default=8, description="Pairs per LLM call / forward pass.")
    gguf_file: Optional[str] = Field(default=None, description="GGUF file for a local model folder.")
    device: Optional[str] = Field(default=None, description="Device of a local model.")
    timeout: Optional[float] = Field(default=None, description="Seconds per LLM call.")
    dtype: str = Field(default="auto", description="Weights of a local model: auto | float32 | "
                                                   "bfloat16 | float16.")
