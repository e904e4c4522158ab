"""`prompt_embeds` on `/v1/completions`: base64 `torch.save` payloads -> checked tensors.

The reference decodes each payload with `torch.load(weights_only=True)` and trusts the rest
(its docs warn that a wrong shape may crash the engine). Here every step is bounded and any
failure is a 400 naming `prompt_embeds`:
1. the base64 text is at most what `max_model_len` rows of float32 at the model's hidden size
   (plus the file's framing) can take: checked before anything is decoded or allocated;
2. it decodes as strict base64, into a `torch.save` zip archive whose entries are stored
   (not compressed) and add up to no more than that bound, so loading cannot inflate it;
3. `torch.load(weights_only=True)` (sparse tensors with their invariants checked) must give one
   plain tensor: float32, bfloat16 or float16, `[tokens, hidden]` (or `[1, tokens, hidden]`),
   the model's hidden size, finite (`workbench.engine.requests.prompt_embeds.check_prompt_embeds`).
"""

from __future__ import annotations

import base64
import binascii
import io
import zipfile
from typing import Any

import torch

from workbench.engine.protocol import EngineClient
from workbench.engine.requests.prompt_embeds import PLACEHOLDER_TOKEN_ID, check_prompt_embeds
from workbench.errors import refuse
from workbench.serving.prompts import EnginePrompt, PromptTokenizer, context_length_message
from workbench.serving.protocol.checks import MAX_COMPLETION_PROMPTS

PARAM = "prompt_embeds"  # the parameter every refusal here names

FRAMING_BYTES = 64 * 1024  # the zip and pickle records around a tensor's data


def payload_limits(hidden_size: int, max_rows: int) -> tuple[int, int]:
    """(bytes of the decoded file, characters of its base64) that a payload may have."""
    max_bytes = max_rows * hidden_size * 4 + FRAMING_BYTES
    return max_bytes, 4 * -(-max_bytes // 3)


def decode_prompt_embeds(payload: Any, *, hidden_size: int, max_rows: int) -> torch.Tensor:
    """One base64 payload -> a checked `[tokens, hidden_size]` tensor (see the module docstring)."""
    if not isinstance(payload, str):
        refuse(f"prompt_embeds must be a base64 string (or a list of them), got "
                f"{type(payload).__name__}.", PARAM, type(payload).__name__)
    max_bytes, max_chars = payload_limits(hidden_size, max_rows)
    if len(payload) > max_chars:
        refuse(f"prompt_embeds payload has {len(payload)} base64 characters; at most "
                f"{max_chars} are accepted ({max_rows} rows of {hidden_size} float32 values).", PARAM,
                len(payload))
    try:
        raw = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        refuse("prompt_embeds is not valid base64.", PARAM)
    _check_archive(raw, max_bytes)
    try:
        with torch.sparse.check_sparse_tensor_invariants():
            tensor = torch.load(io.BytesIO(raw), weights_only=True, map_location="cpu")
    except Exception as exc:  # noqa: BLE001 - whatever the payload makes torch.load raise
        refuse("prompt_embeds could not be loaded as a tensor with torch.load(weights_only="
                f"True) ({type(exc).__name__}).", PARAM, type(exc).__name__)
    if isinstance(tensor, torch.Tensor):
        if tensor.numel() > max_rows * hidden_size:  # e.g. an expanded view: bound before use
            if tensor.dim() - (tensor.dim() == 3 and tensor.shape[0] == 1) == 2 \
                    and tensor.shape[-1] == hidden_size:  # [tokens, hidden]: too many tokens
                refuse(context_length_message(max_rows, tensor.numel() // hidden_size), PARAM,
                        list(tensor.shape))
            refuse(f"prompt_embeds has {tensor.numel()} values; at most {max_rows} rows of "
                    f"{hidden_size} are accepted.", PARAM, list(tensor.shape))
        if tensor.layout != torch.strided:
            tensor = tensor.to_dense()  # invariants were checked at load
    return check_prompt_embeds(tensor, hidden_size)


def _check_archive(raw: bytes, max_bytes: int) -> None:
    """`torch.save`'s zip format, stored entries only, no more than `max_bytes` unpacked."""
    buffer = io.BytesIO(raw)
    if not zipfile.is_zipfile(buffer):
        refuse("prompt_embeds must be a tensor saved with torch.save (a zip archive).", PARAM)
    try:
        with zipfile.ZipFile(buffer) as archive:
            entries = archive.infolist()
    except (zipfile.BadZipFile, ValueError, OSError, EOFError):
        refuse("prompt_embeds must be a tensor saved with torch.save (a zip archive).", PARAM)
    if any(e.compress_type != zipfile.ZIP_STORED for e in entries):
        refuse("prompt_embeds archive has compressed entries; torch.save never writes them.", PARAM)
    unpacked = sum(e.file_size for e in entries)
    if unpacked > max_bytes:
        refuse(f"prompt_embeds archive unpacks to {unpacked} bytes; at most {max_bytes} are "
                "accepted.", PARAM, unpacked)


def load_prompt_embeds(field: Any, *, hidden_size: int, max_rows: int) -> list[torch.Tensor]:
    """The request's `prompt_embeds` (one payload or a list) -> one tensor per prompt."""
    payloads = field if isinstance(field, list) else [field]
    if len(payloads) > MAX_COMPLETION_PROMPTS:
        refuse(f"prompt_embeds list length {len(payloads)} exceeds the maximum allowed count "
                f"of {MAX_COMPLETION_PROMPTS}. To increase this limit, set the "
                "VLLM_MAX_COMPLETION_PROMPTS environment variable.", PARAM, len(payloads))
    return [decode_prompt_embeds(p, hidden_size=hidden_size, max_rows=max_rows)
            for p in payloads]


def embeds_prompts(engine: EngineClient, prompts: PromptTokenizer, field: Any,
                   truncate_prompt_tokens: int | None) -> list[EnginePrompt]:
    """`prompt_embeds` -> engine prompts: truncated to the last N rows, context-length checked."""
    hidden_size = engine.hidden_size
    keep = prompts.truncation_length(truncate_prompt_tokens)
    result = []
    for tensor in load_prompt_embeds(field, hidden_size=hidden_size,
                                     max_rows=prompts.max_model_len):
        if keep is not None and 0 < keep < len(tensor):
            tensor = tensor[-keep:]
        ids = [PLACEHOLDER_TOKEN_ID] * len(tensor)
        prompts.check(ids)
        result.append(EnginePrompt(token_ids=ids, embeds=tensor))
    return result


def encode_prompt_embeds(tensor: torch.Tensor) -> str:
    """A tensor as the base64 `torch.save` payload `prompt_embeds` takes (for clients, tests)."""
    buffer = io.BytesIO()
    torch.save(tensor.detach().cpu().contiguous(), buffer)
    return base64.b64encode(buffer.getvalue()).decode("ascii")
