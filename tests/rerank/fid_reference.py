"""The textbook FiD forward (Izacard & Grave, 2021), written apart from ``funnel_core``'s packed
one, as the reference that tests of the FiD scorer and of FiD training compare against."""

from __future__ import annotations

from typing import Any


def padded_fid_encoding(model: Any, pad_token_id: int, inputs: Any) -> tuple[Any, Any, int]:
    """Every passage padded to one length, encoded as a batch, then concatenated into one
    sequence with its padding mask: ``(encoder_outputs, attention mask [1, n * width], width)``."""
    import torch
    from transformers.modeling_outputs import BaseModelOutput

    n, width = len(inputs.input_ids), max(inputs.lengths)
    ids = torch.full((n, width), pad_token_id)
    mask = torch.zeros((n, width), dtype=torch.long)
    for i, x in enumerate(inputs.input_ids):
        ids[i, :len(x)] = x
        mask[i, :len(x)] = 1
    with torch.no_grad():
        states = model.encoder(input_ids=ids, attention_mask=mask).last_hidden_state
    return BaseModelOutput(last_hidden_state=states.reshape(1, n * width, -1)), mask.reshape(1, -1), width


def padded_fid_forward(model: Any, tokenizer: Any, inputs: Any, **decoder_inputs: Any) -> tuple[Any, int]:
    """:func:`padded_fid_encoding`, then one decoder forward with ``decoder_inputs`` that returns
    the cross-attentions: ``(model output, width)``."""
    import torch

    enc, mask, width = padded_fid_encoding(model, tokenizer.pad_token_id, inputs)
    with torch.no_grad():
        out = model(encoder_outputs=enc, attention_mask=mask, output_attentions=True, use_cache=False,
                    **decoder_inputs)
    return out, width
