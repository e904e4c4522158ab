"""One request and its sequences, as the scheduler and the block manager see them.

A `Request` holds what the user asked (prompt, `SamplingParams`); each of its `n` samples is a
`Sequence` with its own tokens, block table and status. A request with `n > 1` starts with one
sequence; when its prompt is computed the engine forks the other `n - 1` from it, sharing the
prompt's KV blocks. Torch-free: plain Python, unit-tested without a model.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from workbench.engine.requests.outputs import Logprob, RequestMetrics, TokenStats
from workbench.sampling_params import SamplingParams

if TYPE_CHECKING:  # torch and the engine's heavier modules stay out of this one at run time
    import torch

    from workbench.engine.requests.beam_search import BeamSearch
    from workbench.engine.requests.detokenizer import IncrementalDetokenizer
    from workbench.engine.requests.recording import Recording
    from workbench.engine.requests.structured import CompiledGrammar, SequenceGrammar
    from workbench.engine.requests.thinking import ThinkingBudget
    from workbench.inside.resolve import Inside
    from workbench.lora.request import LoRARequest
    from workbench.pooling_params import PoolingParams


# which kind handler (`engine/handlers/`) drives a request: sampled generation, beam search,
# pooling; the engine sets it when it adds the request
RequestKind = Literal["generate", "beam", "pool"]


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Request:
    """What the user asked for, plus its per-request state shared by its sequences."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    priority: int = 0
    arrival_time: float = field(default_factory=time.time)
    cache_salt: str | None = None
    lora_request: LoRARequest | None = None
    prompt_embeds: torch.Tensor | None = None  # [tokens, hidden]: the ids are then placeholders
    sequences: list[Sequence] = field(default_factory=list)
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
    # `token_stats` with prompt logprobs: one per prompt position, beside `prompt_logprobs`
    prompt_token_stats: list[TokenStats | None] | None = None
    # `prompt_distributions_from`: the kept rows of full log-probabilities, in prompt order
    prompt_distributions: list[torch.Tensor] | None = None
    num_cached_tokens: int = 0
    metrics: RequestMetrics = field(init=False)  # set from arrival_time by __post_init__
    min_tokens_stop_ids: frozenset[int] = frozenset()  # EOS and stop ids banned before min_tokens
    forked: bool = False  # the n - 1 siblings exist
    prompt_logprobs_sent: bool = False  # DELTA outputs carry them once
    error: str | None = None  # why the engine failed it ("RuntimeError: ..."): it ends with "error"
    beam: BeamSearch | None = None  # a beam search's state: its sequences are the live beams
    compiled_grammar: CompiledGrammar | None = None  # when the output is constrained
    pooling: PoolingParams | None = None  # a pooling request: it ends when its prompt is
    pooled: torch.Tensor | None = None  # computed, with this result instead of sampled tokens
    kind: RequestKind = "generate"
    # its capture, logit lens and interventions resolved (`SamplingParams.resolve_inside`),
    # and what the capture and lens recorded so far
    inside: Inside | None = None
    recording: Recording | None = None

    @property
    def interventions_key(self) -> str | None:
        """A digest of its interventions: the prefix cache shares blocks only between requests
        with the same (None: none)."""
        return None if self.inside is None else self.inside.key

    @property
    def stop_at_layer(self) -> int | None:
        """The layer its forward ends before (its KV after that is never written), or None."""
        return None if self.inside is None else self.inside.stop_at_layer

    def __post_init__(self) -> None:
        self.metrics = RequestMetrics(arrival_time=self.arrival_time)
        if self.params.prompt_logprobs is not None:
            self.prompt_logprobs = [None]
            if self.params.token_stats:
                self.prompt_token_stats = [None]
            if self.params.prompt_distributions_from is not None:
                self.prompt_distributions = []

    @property
    def errored(self) -> bool:
        return self.error is not None

    @property
    def finished(self) -> bool:
        return all(s.is_finished for s in self.sequences)

    @property
    def max_sequences(self) -> int:
        """How many sequences it will run at once: `n`, or the beam width."""
        return self.beam.params.beam_width if self.beam is not None else self.params.n


class Sequence:
    """One sample of a request: its tokens, how many are in the KV cache, its blocks."""

    def __init__(self, request: Request, index: int, token_ids: list[int], num_prompt_tokens: int):
        self.request = request
        self.index = index  # 0..n-1: the `CompletionOutput.index`
        self.token_ids = list(token_ids)
        self.num_prompt_tokens = num_prompt_tokens
        self.num_computed_tokens = 0  # tokens whose KV is in the cache
        self.block_table: list[int] = []
        self.status = SequenceStatus.WAITING
        self.cumulative_logprob = 0.0
        self.logprobs: list[dict[int, Logprob]] | None = (
            [] if request.params.wants_logprobs else None
        )
        # `token_stats`: one per generated token, beside `logprobs`
        self.token_stats: list[TokenStats] | None = (
            [] if request.params.wants_logprobs and request.params.token_stats else None
        )
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.detok: IncrementalDetokenizer | None = None  # set when the engine starts it
        self.generator: torch.Generator | None = None  # of a seeded request
        self.thinking: ThinkingBudget | None = None  # with a `thinking_token_budget`
        self.num_preemptions = 0
        self.num_sent_tokens = 0  # DELTA outputs: output tokens already handed out
        self.final_sent = False  # DELTA outputs: the finishing output went out
        self.beam_candidates: tuple[list[int], list[float]] | None = None  # beams: this step's top-2W
        # its own matcher of the request's `compiled_grammar` when the output is constrained
        self.grammar_matcher: SequenceGrammar | None = None

    @property
    def seq_id(self) -> str:
        return f"{self.request.request_id}#{self.index}"

    @property
    def priority(self) -> tuple[int, float]:
        return (self.request.priority, self.request.arrival_time)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def fork(self, index: int) -> Sequence:
        """A sibling with the same tokens and computed state; blocks are shared by the caller."""
        child = Sequence(self.request, index, self.token_ids, self.num_prompt_tokens)
        child.num_computed_tokens = self.num_computed_tokens
        child.block_table = list(self.block_table)
        child.status = self.status
        return child

    def __repr__(self) -> str:
        return (f"Sequence({self.seq_id}, tokens={len(self.token_ids)}, "
                f"computed={self.num_computed_tokens}, status={self.status.value})")


def unique_requests(requests: Iterable[Request]) -> list[Request]:
    """Each request once, in order of first appearance (ids are unique among live requests)."""
    return list({req.request_id: req for req in requests}.values())
