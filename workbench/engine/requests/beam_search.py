"""Beam search as vLLM's online beam search, independent of who computes the logprobs.

`BeamSearch` holds the state of one search: live beams (prompt + generated tokens, cumulative
logprob, per-step logprob dicts), completed beams and the `BeamTreeData`. Each step the caller
gives, for every live beam, its top `2 * beam_width` (token, raw logprob) candidates;
`advance` then:
1. turns every EOS candidate (unless `ignore_eos`) into a completed beam (finish_reason "stop",
   stop_reason the EOS id; EOS kept in the tokens only with `include_stop_str_in_output`);
2. keeps the best `beam_width` other candidates by cumulative logprob (ties: beam, then rank
   order) and returns, for each new live beam, the index of its parent.
After `max_tokens` steps, completed and live beams are ranked by
`cum_logprob / max(len(tokens), 1) ** length_penalty` (tokens count the prompt, minus a final
EOS) and the best `beam_width` are returned, decoded without EOS. Logprobs are raw (before
temperature), as vLLM's default `raw_logprobs` mode, so temperature does not change the result.
The engine (`handlers/beam.py`, beams as forked sequences sharing KV blocks) and the client-side
search over HTTP (`workbench/inspect/remote_beam.py`) both drive this class.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from workbench.engine.requests.beam_tree import BeamNode, BeamTreeData
from workbench.engine.requests.outputs import CompletionOutput, Logprob, RequestOutput
from workbench.sampling_params import BeamSearchParams

if TYPE_CHECKING:  # only an annotation: the client-side search runs without torch
    import torch


@dataclass
class BeamSearchSequence:
    """One returned beam, as vLLM's: `tokens` are prompt + generated ids."""

    tokens: list[int]
    logprobs: list[dict[int, Logprob]]
    cum_logprob: float = 0.0
    text: str | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    lora_request: Any = None
    node: int | None = field(default=None, repr=False)  # its last node in the tree


@dataclass
class BeamSearchOutput:
    """The result of one beam search: `sequences` best first, and the `tree` of candidates."""

    sequences: list[BeamSearchSequence]
    tree: BeamTreeData | None = None
    request_id: str | None = None
    prompt: str | None = None
    prompt_token_ids: list[int] = field(default_factory=list)
    finished: bool = True
    error: str | None = None  # the engine failed the search: why ("RuntimeError: ...")

    def to_request_output(self) -> RequestOutput:
        """One `RequestOutput` with a `CompletionOutput` per beam, as vLLM's serving layer."""
        n = len(self.prompt_token_ids)
        outs = [CompletionOutput(index=i, text=s.text or "", token_ids=s.tokens[n:],
                                 cumulative_logprob=s.cum_logprob,
                                 logprobs=s.logprobs[:len(s.tokens) - n],  # not a dropped EOS's
                                 finish_reason=s.finish_reason, stop_reason=s.stop_reason,
                                 lora_request=s.lora_request)
                for i, s in enumerate(self.sequences)]
        lora = self.sequences[0].lora_request if self.sequences else None
        return RequestOutput(request_id=self.request_id or "", prompt=self.prompt,
                             prompt_token_ids=self.prompt_token_ids, prompt_logprobs=None,
                             outputs=outs, finished=True, lora_request=lora, error=self.error)


def beam_score(tokens: list[int], cum_logprob: float, eos_token_id: int | None,
               length_penalty: float) -> float:
    """vLLM's `get_beam_search_score`: the length counts the prompt, not a final EOS."""
    seq_len = len(tokens)
    if tokens and tokens[-1] == eos_token_id:
        seq_len -= 1
    return cum_logprob / (max(seq_len, 1) ** length_penalty)


def top_candidates(logits: torch.Tensor, k: int, vocab_size: int):
    """logits: [B, V'] raw -> (ids [B, k], raw logprobs [B, k]) as lists, best first."""
    logprobs = logits[:, :vocab_size].float().log_softmax(-1)  # [B, V]
    lps, ids = logprobs.topk(k, dim=-1)  # [B, k]
    return ids.tolist(), lps.tolist()


@dataclass
class _Beam:
    tokens: list[int]
    cum_logprob: float
    logprobs: list[dict[int, Logprob]]
    node: int | None


class BeamSearch:
    """The state of one search (see the module docstring)."""

    def __init__(self, prompt_token_ids: list[int], params: BeamSearchParams,
                 eos_token_id: int | None, token_text: Callable[[int], str],
                 lora_request: Any = None, prompt: str | None = None):
        self.params = params
        self.prompt_token_ids = list(prompt_token_ids)
        self.eos_token_id = eos_token_id
        self.token_text = token_text
        self.lora_request = lora_request
        self.prompt = prompt
        self.live = [_Beam(list(prompt_token_ids), 0.0, [], None)]
        self.completed: list[_Beam] = []
        self.num_steps = 0
        self.tree = BeamTreeData(list(prompt_token_ids), params.beam_width, params.length_penalty,
                                 prompt_text=prompt)

    @property
    def num_candidates(self) -> int:
        return 2 * self.params.beam_width

    @property
    def done(self) -> bool:
        return self.num_steps >= self.params.max_tokens or not self.live

    def _score(self, tokens: list[int], cum: float) -> float:
        return beam_score(tokens, cum, self.eos_token_id, self.params.length_penalty)

    def advance(self, top_ids: list[list[int]], top_lps: list[list[float]]) -> list[int]:
        """One step from each live beam's candidates (best first); returns the new beams' parents."""
        p, eos = self.params, self.eos_token_id
        self.num_steps += 1
        cands = []  # (cum, beam index, rank, token, logprob, entry)
        for b, (beam, ids, lps) in enumerate(zip(self.live, top_ids, top_lps)):
            entry = {t: Logprob(lp, r, self.token_text(t))
                     for r, (t, lp) in enumerate(zip(ids, lps), start=1)}
            for r, (t, lp) in enumerate(zip(ids, lps), start=1):
                cands.append((beam.cum_logprob + lp, b, r, t, lp, entry))
        eos_ends = not p.ignore_eos and eos is not None
        going = [c for c in cands if not (eos_ends and c[3] == eos)]
        kept = sorted(range(len(going)), key=lambda i: -going[i][0])[:p.beam_width]
        kept_set = {id(going[i]) for i in kept}
        new_live: list[_Beam | None] = [None] * len(kept)
        order = {id(going[i]): j for j, i in enumerate(kept)}
        parents = [going[i][1] for i in kept]
        for c in cands:
            cum, b, r, t, lp, entry = c
            parent = self.live[b]
            if eos_ends and t == eos:
                tokens = parent.tokens + [t] if p.include_stop_str_in_output else list(parent.tokens)
                state = "completed"
            else:
                tokens = parent.tokens + [t]
                state = "kept" if id(c) in kept_set else "pruned"
            node = self._add_node(t, lp, cum, parent.node, r, state, self._score(tokens, cum))
            beam = _Beam(tokens, cum, parent.logprobs + [entry], node)
            if state == "completed":
                self.completed.append(beam)
            elif state == "kept":
                new_live[order[id(c)]] = beam
        self.live = [b for b in new_live if b is not None]
        return parents

    def _add_node(self, token, lp, cum, parent, rank, status, score) -> int:
        node = BeamNode(len(self.tree.nodes), self.num_steps, token, self.token_text(token), lp,
                        cum, parent, rank, status, score)
        self.tree.nodes.append(node)
        return node.id

    def result(self, decode: Callable[[list[int]], str], request_id: str | None = None,
               live_reason: str = "length") -> BeamSearchOutput:
        """Ranks completed + live beams, returns the best `beam_width`, decoded without EOS."""
        p, n = self.params, len(self.prompt_token_ids)
        pool = [(b, "stop") for b in self.completed] + [(b, live_reason) for b in self.live]
        pool.sort(key=lambda x: self._score(x[0].tokens, x[0].cum_logprob), reverse=True)
        sequences = []
        for b, reason in pool[:p.beam_width]:
            gen = b.tokens[n:]
            if gen and gen[-1] == self.eos_token_id and not p.ignore_eos:
                gen = gen[:-1]
            sequences.append(BeamSearchSequence(
                tokens=b.tokens, logprobs=b.logprobs, cum_logprob=b.cum_logprob, text=decode(gen),
                finish_reason=reason, stop_reason=self.eos_token_id if reason == "stop" else None,
                lora_request=self.lora_request, node=b.node))
        self._mark_returned([s.node for s in sequences])
        return BeamSearchOutput(sequences, self.tree, request_id, self.prompt, self.prompt_token_ids)

    def _mark_returned(self, nodes: list[int | None]) -> None:
        ids = [i for i in nodes if i is not None]
        for pos, i in enumerate(ids):
            self.tree.nodes[i] = replace(self.tree.nodes[i], returned=pos)
        self.tree.returned = ids

    def error(self, request_id: str | None = None, error: str | None = None
              ) -> BeamSearchOutput:
        """The single output of a search that the engine failed: finish_reason 'error',
        `error` its cause."""
        seq = BeamSearchSequence(tokens=list(self.prompt_token_ids), logprobs=[], text="",
                                 finish_reason="error", lora_request=self.lora_request)
        return BeamSearchOutput([seq], self.tree, request_id, self.prompt, self.prompt_token_ids,
                                error=error)
