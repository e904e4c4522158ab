"""`branch`: what if generated token `position` of an output had been another.

A `BranchPlan` holds the context of the forced position (the prompt and the tokens generated
before it), the tokens to force there and what is known of their logprobs, and says which
requests to run:

1. `probe`: where the output has no logprobs and `top=n` was asked, one greedy token after the
   context with its `n + 1` best (`Probe`); `probed(answer)` picks the alternatives from it;
2. `requests`: one continuation per forced token (`Continue`: the context, then the token,
   continued with the caller's own sampling), and, where some forced token's logprob is not in
   the output's, a `Probe` of the context tracking them (`logprob_token_ids`);
3. `assemble(answers)`: the `BranchTree` from each request's `Answer` (its path, prompt tokens
   from the prefix cache, and the raw output), in the order of `requests`.

`LLM.branch` runs the requests on its engine (all of step 2 in one batch, with the original's
`SamplingParams`); `Workbench.branch` as completions requests of token ids (each probe alone,
then the continuations as one request of several prompts, with the result's own body). What
each refuses of the caller's sampling is here too: `check_params` (an `LLM`'s `SamplingParams`)
and `continuation_fields` (a `Workbench` body).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from workbench.errors import ValidationError
from workbench.inspect import branch_tree as bt
from workbench.sampling_params import RequestOutputKind, SamplingParams

__all__ = ["NOT_IN_A_BRANCH", "Answer", "BranchPlan", "Continue", "Probe", "check_params",
           "continuation_fields", "continuation_params", "probe_fields", "probe_params"]

# fields refused in a branch: one plain completion (a grammar would start afresh after the token)
NOT_IN_A_BRANCH = ("stream", "echo", "n", "best_of", "use_beam_search", "response_format",
                   "structured_outputs")


@dataclass(frozen=True)
class Continue:
    """A branch: `prompt_token_ids` (the context, then the forced token) continued with the
    branch's sampling."""

    prompt_token_ids: list[int]


@dataclass(frozen=True)
class Probe:
    """One greedy token after `prompt_token_ids`, with its `logprobs` best and the logprobs of
    `track` there."""

    prompt_token_ids: list[int]
    logprobs: int
    track: list[int]


@dataclass(frozen=True)
class Answer:
    """A request's answer as a plan reads it: its generated `path`, its prompt's tokens served
    from the prefix cache (None: not reported), and the `output` itself (a `RequestOutput`, or a
    completions choice)."""

    path: bt.Path
    num_cached_tokens: int | None
    output: Any


@dataclass(frozen=True)
class BranchPlan:
    """The branches of one output at one position (see the module docstring)."""

    tree: bt.BranchTree
    position: int
    tokenizer: Any
    forced: list[int] | None = None  # None: not known before the probe
    pairs: tuple[tuple[int, float], ...] = ()  # the position's (id, logprob) best, known
    top: int | None = None

    @classmethod
    def of(cls, output: Any, tokenizer: Any, position: Any, index: int = 0) -> "BranchPlan":
        """The plan of `output` (a `RequestOutput`, or a completions body or `Result` with token
        ids) at `position`, forcing nothing yet; refuses a position outside its tokens."""
        tree = bt.BranchTree.of(output, tokenizer, index)
        bt.check_position(tree.original, position)
        return cls(tree, int(position), tokenizer)

    @property
    def context(self) -> list[int]:
        """The prompt and the tokens generated before the position."""
        return list(self.tree.prompt_token_ids) + self.tree.original.token_ids[:self.position]

    def forcing(self, tokens: Any, top: Any, vocab_size: int) -> "BranchPlan":
        """This plan forcing `tokens`, or the `top` best alternatives of the output's logprobs
        (where it has none: after the `probe`)."""
        original = self.tree.original
        forced = bt.forced_tokens(original, self.position, tokens, top, vocab_size)
        return replace(self, forced=forced, pairs=original.tokens[self.position].top, top=top)

    @property
    def probe(self) -> Probe | None:
        """The request for the position's best tokens, where the output has no logprobs."""
        if self.forced is not None or self.top is None:
            return None
        return Probe(self.context, self.top + 1, [])

    def probed(self, answer: Answer) -> "BranchPlan":
        """This plan forcing the `top` best alternatives of the probe's `answer`."""
        assert self.top is not None
        pairs = answer.path.tokens[0].top
        forced = bt.alternatives(pairs, self.tree.original.token_ids[self.position], self.top,
                                 self.position)
        return replace(self, forced=forced, pairs=pairs)

    @property
    def unknown(self) -> list[int]:
        """The forced tokens whose logprob at the position the output did not return."""
        known = dict(self.pairs)
        return [t for t in self.forced or () if t not in known]

    @property
    def requests(self) -> list[Continue | Probe]:
        """One `Continue` per forced token, then a `Probe` of the unknown logprobs if any."""
        assert self.forced is not None, "the probe's answer first (`probed`)"
        context = self.context
        asks: list[Continue | Probe] = [Continue(context + [t]) for t in self.forced]
        if self.unknown:
            asks.append(Probe(context, 1, self.unknown))
        return asks

    def assemble(self, answers: Sequence[Answer], skip_special_tokens: bool = True
                 ) -> bt.BranchTree:
        """The tree with its branches, from the `Answer`s of `requests` in their order."""
        assert self.forced is not None
        known: dict[int, float | None] = dict(self.pairs)
        if self.unknown:
            probed = dict(answers[len(self.forced)].path.tokens[0].top)
            known.update({t: probed.get(t) for t in self.unknown})
        text = bt.token_texts(self.tokenizer)
        original, position = self.tree.original, self.position
        branches = []
        for t, answer in zip(self.forced, answers):
            token = bt.PathToken(t, text(t), known[t], self.pairs)
            whole = self.tokenizer.decode(original.token_ids[:position] + [t],
                                          skip_special_tokens=skip_special_tokens
                                          ) + answer.path.text
            branches.append(bt.Branch(position, bt.forced_path(original, position, token,
                                                               answer.path, whole),
                                      answer.num_cached_tokens, answer.output))
        return self.tree.with_branches(branches)


# -- what each facade continues with ----------------------------------------------------------
def check_params(base: SamplingParams | None, request_id: str) -> SamplingParams:
    """The `LLM`'s sampling params of a branch's continuation (`base`: the original request's,
    or the caller's), refused where a branch cannot continue with them."""
    if base is None:
        raise ValidationError(f"the sampling params of request {request_id!r} are "
                              "not known here (it was not generated by this LLM, or long "
                              "ago): pass params=SamplingParams(...).", parameter="params")
    if base.n != 1:
        raise ValidationError(f"a branch is one continuation: params.n must be 1, got "
                              f"{base.n}.", parameter="params", value=base.n)
    if base.structured_outputs is not None:
        raise ValidationError("a branch's continuation would start its grammar afresh after "
                              "the forced token, not where the original's matcher was: "
                              "pass params without structured_outputs.", parameter="params")
    return base


def continuation_params(base: SamplingParams) -> SamplingParams:
    """`base`, final outputs only, with at least `logprobs=0` (every branch has its tokens')."""
    cont = base.clone()
    cont.output_kind = RequestOutputKind.FINAL_ONLY
    if cont.logprobs is None:
        cont.logprobs = 0
    return cont


def probe_params(probe: Probe) -> SamplingParams:
    """A `Probe` as the engine's request."""
    p = SamplingParams(max_tokens=1, temperature=0.0, logprobs=probe.logprobs,
                       logprob_token_ids=probe.track or None)
    p.output_kind = RequestOutputKind.FINAL_ONLY
    return p


def continuation_fields(sent: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """A `Workbench` branch's completions fields: the original's body `sent` updated by
    `body`, without its prompt, with at least `logprobs=0`; refuses what is not one plain
    completion."""
    for name in NOT_IN_A_BRANCH:
        value = body[name] if name in body else sent.get(name)
        if value is not None and value is not False and (name not in ("n", "best_of")
                                                        or value != 1):
            raise ValidationError(f"a branch is one plain completion: `{name}` "
                                  f"({value!r}) is not allowed.", parameter=name, value=value)
    fields = {k: v for k, v in {**sent, **body}.items()
              if k != "prompt" and k not in NOT_IN_A_BRANCH}
    if fields.get("logprobs") is None:
        fields["logprobs"] = 0  # every branch carries its tokens' logprobs
    return fields


def probe_fields(probe: Probe) -> dict[str, Any]:
    """A `Probe` as a completions body (token ids back, as `token_id:N` keys)."""
    fields: dict[str, Any] = {"logprobs": probe.logprobs}
    if probe.track:
        fields["logprob_token_ids"] = probe.track
    return {"prompt": probe.prompt_token_ids, "max_tokens": 1, "temperature": 0.0,
            "return_token_ids": True, "return_tokens_as_token_ids": True, **fields}

