"""Beam searches: a request's sequences are its live beams (`engine/beam_search.py`).

Each step every live beam's row gives its top 2 x width candidates (one `top_candidates` call
for every beam of the step); once all beams of a search have theirs, the search advances and
the next beams are forks of their parents (sharing KV blocks, copy-on-write) with the chosen
token appended; parents left behind are freed. A search reports once, when it ends.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from workbench.engine.beam_search import BeamSearch, BeamSearchOutput, top_candidates
from workbench.engine.handlers.base import KindHandler
from workbench.engine.request import SequenceStatus, unique_requests
from workbench.errors import ValidationError
from workbench.sampling_params import SamplingParams

if TYPE_CHECKING:
    from workbench.engine.input_processor import PromptInput
    from workbench.engine.request import Request, Sequence
    from workbench.engine.runner import LogitRows
    from workbench.lora.request import LoRARequest
    from workbench.sampling_params import BeamSearchParams


class BeamHandler(KindHandler):
    """Beam search (`LLMEngine.add_beam_request`)."""

    def make_request(self, request_id: str, prompt: PromptInput, params: BeamSearchParams,
                     lora_request: LoRARequest | None = None, priority: int = 0) -> Request:
        """A checked beam-search `Request` with its `BeamSearch`."""
        engine = self.engine
        max_num_seqs = engine.config.max_num_seqs
        if params.beam_width > max_num_seqs:
            raise ValidationError(
                f"beam_width={params.beam_width} is greater than max_num_seqs={max_num_seqs}.",
                parameter="n", value=params.beam_width)
        sp = SamplingParams(max_tokens=params.max_tokens, temperature=params.temperature,
                            ignore_eos=params.ignore_eos, detokenize=False,
                            skip_special_tokens=params.skip_special_tokens)
        if isinstance(prompt, dict) and prompt.get("prompt_embeds") is not None:
            raise ValidationError("Beam search is not supported with prompt embeds.",
                                  parameter="prompt_embeds")
        req = engine.inputs.process(request_id, prompt, sp, priority=priority,
                                    lora_request=lora_request)
        req.beam = BeamSearch(req.prompt_token_ids, params, engine.outputs.eos_token_id,
                              engine.outputs.texts, lora_request, req.prompt)
        return req

    def advance(self, batch: list[tuple[Sequence, int]], rows: LogitRows) -> None:
        """Records each beam's candidates; a search whose beams all have theirs takes a step."""
        if not batch:
            return
        searches = unique_requests(s.request for s, _ in batch)
        try:
            k = max(_search(s.request).num_candidates for s, _ in batch)
            ids, lps = top_candidates(rows.logits[[r for _, r in batch]], k,
                                      self.engine.vocab_size)
        except Exception as exc:  # noqa: BLE001 - the batch can't be attributed: its searches
            for req in searches:
                self.engine.fail_request(req, exc)
            return
        for i, (seq, _) in enumerate(batch):
            n = _search(seq.request).num_candidates
            seq.beam_candidates = (ids[i][:n], lps[i][:n])
        for req in searches:
            try:
                candidates = [s.beam_candidates for s in req.sequences]
                ready = [c for c in candidates if c is not None]
                if len(ready) == len(candidates):
                    self._step(req, ready)
            except Exception as exc:  # noqa: BLE001 - contained to this search
                self.engine.fail_request(req, exc)

    def _step(self, req: Request, candidates: list[tuple[list[int], list[float]]]) -> None:
        """The next beams: forks of their parents plus one token; parents left behind are freed.

        `candidates`: each live beam's (ids, logprobs), in the order of `req.sequences`."""
        engine, search, old = self.engine, _search(req), req.sequences
        parents = search.advance([ids for ids, _ in candidates], [lps for _, lps in candidates])
        req.forked = True  # the search holds its slots from now on
        by_index: dict[int, Sequence] = {}  # new beam index -> its sequence
        for b, parent in enumerate(old):
            parent.beam_candidates = None
            kids = [i for i, p in enumerate(parents) if p == b]
            if not kids:
                engine.scheduler.finish(parent)
                continue
            for i in kids[1:]:  # forked before the parent gets its own next token
                child = parent.fork(i)
                engine.block_manager.fork(parent, child)
                if parent.status is SequenceStatus.WAITING:  # preempted: recomputed, like it
                    engine.scheduler.add(child)
                else:
                    engine.scheduler.add_running(child)
                by_index[i] = child
            by_index[kids[0]] = parent
        beams = [by_index[i] for i in range(len(parents))]
        for index, (seq, beam) in enumerate(zip(beams, search.live)):
            seq.index = index
            seq.token_ids.append(beam.tokens[-1])
        req.sequences = beams
        engine.generation_tokens_total += len(beams)
        if search.done:
            for seq in beams:
                engine.scheduler.finish(seq)

    def output(self, req: Request) -> BeamSearchOutput | None:
        """Its result once it ends (or a single error output); nothing before."""
        if not req.finished:
            return None
        search = _search(req)
        if req.errored:
            return search.error(req.request_id)
        aborted = any(s.finish_reason == "abort" for s in req.sequences)
        skip = search.params.skip_special_tokens
        tokenizer = self.engine.tokenizer
        return search.result(lambda ids: tokenizer.decode(ids, skip_special_tokens=skip),
                               req.request_id, "abort" if aborted else "length")

    def error_output(self, req: Request) -> BeamSearchOutput:
        return _search(req).error(req.request_id)


def _search(req: Request) -> BeamSearch:
    """The state of a beam-search request (`make_request` gives every one its search)."""
    assert req.beam is not None
    return req.beam
