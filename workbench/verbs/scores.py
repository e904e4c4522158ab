"""`score_text` / `score_chat`: given text scored token by token (`workbench.inspect.scoring`).

The spans to score come from the facade's own tokenizer: `text_spans` (each text after its
prompt) and `turn_spans` (each conversation's last turn after the messages before it) take a
function that tokenizes, which the `LLM` answers with its tokenizer and chat template and a
`Workbench` with the server's `/tokenize`. A `ScorePlan` is the one request that scores them
all, as the engine's params (`params`) or a completions body (`body`), and `assemble` cuts each
answer's prompt logprobs down to its text's `LogprobTable`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from workbench.inspect.logprob_table import LogprobTable
from workbench.inspect.scoring import ScoredSpan, last_turn, score_body, score_params, scored_table
from workbench.sampling_params import SamplingParams

__all__ = ["ScorePlan", "conversations_of", "text_spans", "turn_spans"]

Tokens = Callable[[str, bool], list[int]]  # (text, add special tokens) -> ids
Rendered = Callable[[list[dict[str, Any]], bool], list[int]]  # (messages, generation prompt)


def text_spans(prompts: str | Sequence[str], texts: str | Sequence[str], tokens: Tokens
               ) -> list[ScoredSpan]:
    """Each text after its prompt (one prompt for all texts, or one per text): the prompt
    tokenized with special tokens, the text without."""
    texts = [texts] if isinstance(texts, str) else list(texts)
    contexts = [prompts] * len(texts) if isinstance(prompts, str) else list(prompts)
    if len(contexts) != len(texts):
        raise ValueError(f"Got {len(contexts)} prompts for {len(texts)} texts.")
    return [ScoredSpan.of_text(tokens(c, True), tokens(t, False))
            for c, t in zip(contexts, texts)]


def conversations_of(conversations: list[dict[str, Any]] | list[list[dict[str, Any]]]
                     ) -> list[list[dict[str, Any]]]:
    """One conversation or a list of them -> a list."""
    if conversations and isinstance(conversations[0], list):
        return conversations
    return [conversations]  # type: ignore[list-item]


def turn_spans(conversations: list[dict[str, Any]] | list[list[dict[str, Any]]],
               rendered: Rendered) -> list[ScoredSpan]:
    """Each conversation's last message (the assistant's) after the messages before it:
    `rendered(before, True)` (with the generation prompt), then `rendered(whole, False)`."""
    spans = []
    for conv in conversations_of(conversations):
        before, whole = last_turn(conv)
        spans.append(ScoredSpan.of_turn(rendered(before, True), rendered(whole, False)))
    return spans


@dataclass(frozen=True)
class ScorePlan:
    """The scoring of `spans`, each with its `logprobs` best alternatives per token."""

    spans: list[ScoredSpan]
    logprobs: int = 0

    @property
    def params(self) -> SamplingParams:
        """The engine's request of each span (one token-id prompt per span)."""
        return score_params(self.logprobs)

    @property
    def prompts(self) -> list[dict[str, list[int]]]:
        return [{"prompt_token_ids": s.token_ids} for s in self.spans]

    def body(self, token_stats: bool) -> dict[str, Any]:
        """The `/v1/completions` body of all spans (`token_stats`: a workbench server's)."""
        return score_body(self.spans, self.logprobs, token_stats=token_stats)

    def assemble(self, answers: Sequence[Any], tokenizer: Any = None) -> list[LogprobTable]:
        """A table per span: from its `RequestOutput`, or from choice i of the completions body
        at `answers[i]` (the same body for all, answering `body`)."""
        return [scored_table(answer, span, i, tokenizer)
                for i, (answer, span) in enumerate(zip(answers, self.spans))]
