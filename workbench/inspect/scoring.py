"""Scoring given text: the logprob, rank and entropy of each of its tokens after a context.

A text is scored as a prompt: the context's tokens and then the text's go to the engine as
one token-id prompt with `prompt_logprobs` (and `max_tokens=1`, the one generated token
dropped), so scoring runs inside continuous batching like any request, and against any server
whose completions take `prompt_logprobs` (vLLM's too). A `ScoredSpan` is that prompt and where
the scored tokens start; `scored_table` cuts the answer's prompt rows down to them.

Two kinds of text (the offline `LLM.score_text` / `score_chat` and the `Workbench`'s):
- a completion after a prompt: the prompt tokenized as a generation's would be (special
  tokens added), the completion on its own without them, one after the other;
- an assistant turn after the conversation before it: the chat template renders the
  conversation before the turn with the generation prompt, and the whole conversation; the
  turn's tokens are what the whole adds after the first (its content and the template's end
  of turn, `<|im_end|>` and a newline on ChatML). A template whose whole rendering does not
  start with the first is refused, naming it.
With `token_stats` (our engine, a workbench server) the entropy is that of the whole
vocabulary's distribution; against another server it is over the returned top-k (the table's
`entropy_kind` says which).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from workbench.errors import ValidationError
from workbench.inspect.logprob_table import LogprobTable
from workbench.sampling_params import SamplingParams


@dataclass(frozen=True)
class ScoredSpan:
    """One text to score: the prompt to send (`token_ids`: context, then text) and the
    position of the text's first token (`start`)."""

    token_ids: list[int]
    start: int

    @property
    def scored_ids(self) -> list[int]:
        return self.token_ids[self.start:]

    @classmethod
    def of_text(cls, context_ids: list[int], text_ids: list[int]) -> "ScoredSpan":
        """A completion's tokens after its prompt's."""
        if not context_ids:
            raise ValidationError("A scored text needs a prompt of at least one token before "
                                  "it: the first token has nothing to be predicted from.",
                                  parameter="prompt", value="")
        if not text_ids:
            raise ValidationError("The text to score has no tokens.", parameter="text",
                                  value="")
        return cls(list(context_ids) + list(text_ids), len(context_ids))

    @classmethod
    def of_turn(cls, before_ids: list[int], whole_ids: list[int]) -> "ScoredSpan":
        """The last turn of a conversation: `whole_ids` (the whole conversation rendered)
        after `before_ids` (the conversation before it, with the generation prompt)."""
        if whole_ids[:len(before_ids)] != before_ids:
            raise ValidationError(
                "The chat template renders the conversation before the last turn (with the "
                "generation prompt) as something the whole conversation does not start with, "
                "so the turn's tokens cannot be told apart.", parameter="messages")
        if len(whole_ids) == len(before_ids):
            raise ValidationError("The last turn renders to no tokens.", parameter="messages")
        return cls(list(whole_ids), len(before_ids))


def last_turn(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the conversation before the scored turn, the whole conversation); the last message
    must be the assistant's."""
    if not messages or messages[-1].get("role") != "assistant":
        raise ValidationError("score_chat scores the last message: it must be the "
                              "assistant's.", parameter="messages")
    if len(messages) < 2:
        raise ValidationError("score_chat needs the conversation before the assistant's "
                              "turn (at least one message).", parameter="messages")
    return list(messages[:-1]), list(messages)


def score_params(logprobs: int = 0, token_stats: bool = True) -> SamplingParams:
    """The engine's request of a scoring: the prompt's logprobs (the scored tokens' own and the
    top `logprobs` alternatives), `token_stats`, one greedy token (dropped)."""
    return SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=logprobs,
                          token_stats=token_stats)


def score_body(spans: list[ScoredSpan], logprobs: int = 0, token_stats: bool = True
               ) -> dict[str, Any]:
    """The `/v1/completions` body of a batch of scorings (vLLM's fields; `token_stats` only
    for a workbench server)."""
    body: dict[str, Any] = {"prompt": [s.token_ids for s in spans], "max_tokens": 1,
                            "temperature": 0, "prompt_logprobs": logprobs}
    if token_stats:
        body["token_stats"] = True
    return body


def scored_table(source: Any, span: ScoredSpan, choice: int = 0, tokenizer: Any = None
                 ) -> LogprobTable:
    """The scored tokens' `LogprobTable` (part "scored", positions from 0 in the text): from
    an engine `RequestOutput` or choice `choice` of a completions body answering `span`."""
    if hasattr(source, "outputs") and hasattr(source, "prompt_logprobs"):
        table = LogprobTable.from_request_output(source, 0, tokenizer)
    else:
        body = source if isinstance(source, dict) else source.model_dump()
        ch = next(c for c in body["choices"] if c.get("index", 0) == choice)
        # the prompt's ids are known here (a server returns them only when asked)
        table = LogprobTable.from_completion(
            {"choices": [{**ch, "index": 0, "prompt_token_ids": span.token_ids}]})
    rows = table.prompt[span.start:]
    if [r.token_id for r in rows] != span.scored_ids:
        raise ValueError("The answer's prompt logprobs are not those of the scored tokens "
                         f"({len(rows)} rows for {len(span.scored_ids)} tokens).")
    return LogprobTable(tuple(replace(r, position=i, part="scored") for i, r in enumerate(rows)),
                        (), table.source)
