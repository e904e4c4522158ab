"""Prompts given as embeddings: checking a `[tokens, hidden]` tensor before it becomes a request.

A request may carry its prompt as rows of the model's input embedding space instead of token ids
(vLLM's `{"prompt_embeds": tensor}`). The engine runs those rows through the decoder layers in
place of the embedding table's rows (`ModelRunner` splices them into the packed hidden states)
and then decodes ordinary tokens. Its sequences hold placeholder token ids for the prompt
positions, so counts, positions and block tables work as for any prompt; the placeholders are
never looked up, hashed into the prefix cache, penalized or detokenized.
"""

from __future__ import annotations

from typing import Any

import torch

from workbench.errors import refuse

PARAM = "prompt_embeds"  # the parameter every refusal here names

EMBEDS_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
PLACEHOLDER_TOKEN_ID = 0  # stands for an embedded prompt position in `Sequence.token_ids`


def check_prompt_embeds(embeds: Any, hidden_size: int) -> torch.Tensor:
    """A plain dense 2-D `[tokens, hidden_size]` tensor of finite floats, else `ValidationError`.

    A leading batch dimension of 1 is dropped (`[1, tokens, hidden]`), as vLLM does.

    >>> check_prompt_embeds(torch.zeros(1, 3, 4), hidden_size=4).shape
    torch.Size([3, 4])
    """
    if not isinstance(embeds, torch.Tensor):
        refuse(f"prompt_embeds must be a torch.Tensor, got {type(embeds).__name__}.", PARAM,
                type(embeds).__name__)
    if embeds.layout != torch.strided:
        refuse(f"prompt_embeds must be a dense tensor, got layout {embeds.layout}.", PARAM,
                str(embeds.layout))
    if embeds.dtype not in EMBEDS_DTYPES:
        refuse(f"prompt_embeds must be float32, bfloat16 or float16, got {embeds.dtype}.", PARAM,
                str(embeds.dtype))
    if embeds.dim() == 3 and embeds.shape[0] == 1:
        embeds = embeds[0]
    if embeds.dim() != 2:
        refuse(f"prompt_embeds must have shape (num_tokens, hidden_size), got "
                f"{tuple(embeds.shape)}.", PARAM, list(embeds.shape))
    if embeds.shape[1] != hidden_size:
        refuse(f"prompt_embeds has hidden size {embeds.shape[1]}, but the model's hidden size "
                f"is {hidden_size}.", PARAM, embeds.shape[1])
    if embeds.shape[0] == 0:
        refuse("The decoder prompt cannot be empty", PARAM, 0)
    if not bool(torch.isfinite(embeds).all()):
        refuse("prompt_embeds contains NaN or infinite values.", PARAM)
    return embeds.detach().to("cpu").contiguous()
