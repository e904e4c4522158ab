"""Engine logprobs -> the two OpenAI formats, and `prompt_logprobs` for JSON.

Engine positions are dicts `{token_id: Logprob}` ordered sampled token first, then the top-k.
Completions (legacy format): `tokens`, `token_logprobs`, `text_offset` and `top_logprobs`
dicts keyed by decoded text holding up to k+1 entries. Chat: `content` entries with UTF-8
`bytes` and the first k entries of the position as `top_logprobs`. `-inf` becomes -9999.0;
with `return_tokens_as_token_ids` every token string is `token_id:N`. With `token_stats`, both
objects carry a workbench extra `token_stats` (one `TokenStats.to_json()` per token, None where a
position has none) and the prompt's go beside `prompt_logprobs` as `prompt_token_stats`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from workbench.serving.protocol.chat import (
    ChatCompletionLogProb,
    ChatCompletionLogProbs,
    ChatCompletionLogProbsContent,
)
from workbench.serving.protocol.common import PromptLogprob
from workbench.serving.protocol.completion import CompletionLogProbs

FLOOR = -9999.0


def clamp(logprob: float) -> float:
    return max(logprob, FLOOR)


def token_str(token_id: int, logprob: Any, tokenizer: Any, as_token_ids: bool) -> str:
    if as_token_ids:
        return f"token_id:{token_id}"
    decoded = getattr(logprob, "decoded_token", None)
    return decoded if decoded is not None else tokenizer.decode([token_id])


def positions_or_blank(positions: Sequence[dict[int, Any] | None] | None, count: int
                       ) -> Sequence[dict[int, Any] | None]:
    """`positions`, or (none or empty) `count` positions without logprobs."""
    return positions or [None] * count


def token_stats_json(stats: Sequence[Any | None] | None) -> list[dict[str, float | int] | None
                                                                 ] | None:
    """`TokenStats` per position (None where a position has none) as JSON; None: not asked."""
    if stats is None:
        return None
    return [None if s is None else s.to_json() for s in stats]


def completion_logprobs(token_ids: list[int], positions: Sequence[dict[int, Any] | None],
                        num_top: int, tokenizer: Any, *, initial_offset: int = 0,
                        as_token_ids: bool = False, stats: Sequence[Any | None] | None = None,
                        ) -> tuple[CompletionLogProbs, int]:
    """The legacy logprobs object, and the text offset just past its last token; `stats`:
    the positions' `TokenStats` (`token_stats`), or None."""
    offsets: list[int] = []
    tokens: list[str] = []
    token_lps: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    offset = initial_offset
    for token_id, position in zip(token_ids, positions):
        step = None if position is None else position.get(token_id)
        token = token_str(token_id, step, tokenizer, as_token_ids)
        tokens.append(token)
        if position is None or step is None:
            token_lps.append(None)
            tops.append(None)
        else:
            token_lps.append(clamp(step.logprob))
            tops.append({
                token_str(tid, lp, tokenizer, as_token_ids): clamp(lp.logprob)
                for i, (tid, lp) in enumerate(position.items()) if i <= num_top
            })
        offsets.append(offset)
        offset += len(token)
    # every field assigned, so stream chunks (serialized with exclude_unset) keep them all
    out = CompletionLogProbs(text_offset=offsets, token_logprobs=token_lps, tokens=tokens,
                             top_logprobs=tops)
    if stats is not None:  # assigned only when asked: the key stays out of other bodies
        out.token_stats = token_stats_json(stats)
    return out, offset


def _entry(token: str, logprob: float) -> ChatCompletionLogProb:
    return ChatCompletionLogProb(token=token, logprob=clamp(logprob),
                                 bytes=list(token.encode("utf-8", errors="replace")))


def chat_logprobs(token_ids: list[int], positions: Sequence[dict[int, Any] | None],
                  num_top: int, tokenizer: Any, *, as_token_ids: bool = False,
                  stats: Sequence[Any | None] | None = None) -> ChatCompletionLogProbs:
    """Chat's logprobs object; `stats`: the positions' `TokenStats` (`token_stats`), or None."""
    content = []
    for token_id, position in zip(token_ids, positions):
        step = None if position is None else position.get(token_id)
        token = token_str(token_id, step, tokenizer, as_token_ids)
        if position is None or step is None:
            content.append(ChatCompletionLogProbsContent(
                token=token, bytes=list(token.encode("utf-8", errors="replace"))))
            continue
        tops = [_entry(token_str(tid, lp, tokenizer, as_token_ids), lp.logprob)
                for i, (tid, lp) in enumerate(position.items()) if i < num_top]
        decoded = step.decoded_token if step.decoded_token is not None else token
        content.append(ChatCompletionLogProbsContent(
            token=token, logprob=clamp(step.logprob), top_logprobs=tops,
            bytes=list(decoded.encode("utf-8", errors="replace"))))
    out = ChatCompletionLogProbs(content=content)
    if stats is not None:  # assigned only when asked: the key stays out of other bodies
        out.token_stats = token_stats_json(stats)
    return out


def prompt_logprobs_json(prompt_logprobs: list[dict[int, Any] | None] | None
                         ) -> list[dict[int, PromptLogprob] | None] | None:
    if prompt_logprobs is None:
        return None
    return [
        None if position is None else {
            tid: PromptLogprob(logprob=clamp(lp.logprob), rank=lp.rank,
                               decoded_token=lp.decoded_token)
            for tid, lp in position.items()
        }
        for position in prompt_logprobs
    ]
