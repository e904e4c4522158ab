"""Beam searches: a request's sequences are its live beams (`engine/requests/beam_search.py`).

Each step every live beam's row gives its top 2 x width candidates (one `top_candidates` call
for every beam of the step); once all beams of a search have theirs, the search advances and
its next beams go to the step's results: the bookkeeper forks them from their parents
(sharing KV blocks, copy-on-write) with the chosen token appended and ends the parents left
behind. A search reports once, when it ends.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from workbench.engine.handlers.base import KindHandler
from workbench.engine.requests.beam_search import BeamSearch, BeamSearchOutput, top_candidates
from workbench.engine.requests.request import unique_requests
from workbench.engine.requests.step_results import NextBeams
from workbench.errors import ValidationError
from workbench.sampling_params import SamplingParams

if TYPE_CHECKING:
    from workbench.engine.requests.input_processor import InputProcessor, PromptInput
    from workbench.engine.requests.output_processor import OutputProcessor
    from workbench.engine.requests.request import Request, Sequence
    from workbench.engine.requests.step_results import StepResults
    from workbench.engine.step.runner import LogitRows
    from workbench.lora.request import LoRARequest
    from workbench.sampling_params import BeamSearchParams


class BeamHandler(KindHandler):
    """Beam search (`LLMEngine.add_beam_request`)."""

    kind = "beam"

    def __init__(self, inputs: InputProcessor, outputs: OutputProcessor, tokenizer: Any,
                 vocab_size: int, max_num_seqs: int):
        self.inputs = inputs
        self.outputs = outputs  # the EOS id and the memoized token texts of the tree
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_num_seqs = max_num_seqs

    def make_request(self, request_id: str, prompt: PromptInput, params: BeamSearchParams,
                     lora_request: LoRARequest | None = None, priority: int = 0) -> Request:
        """A checked beam-search `Request` with its `BeamSearch`."""
        if params.beam_width > self.max_num_seqs:
            raise ValidationError(
                f"beam_width={params.beam_width} is greater than max_num_seqs={self.max_num_seqs}.",
                parameter="n", value=params.beam_width)
        sp = SamplingParams(max_tokens=params.max_tokens, temperature=params.temperature,
                            ignore_eos=params.ignore_eos, detokenize=False,
                            skip_special_tokens=params.skip_special_tokens)
        if isinstance(prompt, dict) and prompt.get("prompt_embeds") is not None:
            raise ValidationError("Beam search is not supported with prompt embeds.",
                                  parameter="prompt_embeds")
        req = self.inputs.process(request_id, prompt, sp, priority=priority,
                                  lora_request=lora_request)
        req.beam = BeamSearch(req.prompt_token_ids, params, self.outputs.eos_token_id,
                              self.outputs.texts, lora_request, req.prompt)
        return req

    def compute(self, batch: list[tuple[Sequence, int]], rows: LogitRows,
                results: StepResults) -> None:
        """Records each beam's candidates; a search whose beams all have theirs takes a step."""
        if not batch:
            return
        searches = unique_requests(s.request for s, _ in batch)
        try:
            k = max(_search(s.request).num_candidates for s, _ in batch)
            ids, lps = top_candidates(rows.logits[[r for _, r in batch]], k, self.vocab_size)
        except Exception as exc:  # noqa: BLE001 - the batch can't be attributed: its searches
            for req in searches:
                results.fail(req, exc)
            return
        for i, (seq, _) in enumerate(batch):
            n = _search(seq.request).num_candidates
            seq.beam_candidates = (ids[i][:n], lps[i][:n])
        for req in searches:
            try:
                candidates = [s.beam_candidates for s in req.sequences]
                ready = [c for c in candidates if c is not None]
                if len(ready) == len(candidates):
                    results.beams.append(self._step(req, ready))
            except Exception as exc:  # noqa: BLE001 - contained to this search
                results.fail(req, exc)

    @staticmethod
    def _step(req: Request, candidates: list[tuple[list[int], list[float]]]) -> NextBeams:
        """The search's step: each next beam's parent and token.

        `candidates`: each live beam's (ids, logprobs), in the order of `req.sequences`."""
        search = _search(req)
        parents = search.advance([ids for ids, _ in candidates], [lps for _, lps in candidates])
        for seq in req.sequences:
            seq.beam_candidates = None
        return NextBeams(req, parents, [beam.tokens[-1] for beam in search.live], search.done)

    def output(self, req: Request) -> BeamSearchOutput | None:
        """Its result once it ends (or a single error output); nothing before."""
        if not req.finished:
            return None
        search = _search(req)
        if req.errored:
            return search.error(req.request_id, req.error)
        aborted = any(s.finish_reason == "abort" for s in req.sequences)
        skip = search.params.skip_special_tokens
        tokenizer = self.tokenizer
        return search.result(lambda ids: tokenizer.decode(ids, skip_special_tokens=skip),
                             req.request_id, "abort" if aborted else "length")

    def error_output(self, req: Request) -> BeamSearchOutput:
        return _search(req).error(req.request_id, req.error)


def _search(req: Request) -> BeamSearch:
    """The state of a beam-search request (`make_request` gives every one its search)."""
    assert req.beam is not None
    return req.beam
