"""`replay`: one request run alone, batched with others and with a warm prefix cache, compared.

`Workbench.replay(result_or_body)` sends the same completions or chat body three times through
the Workbench's back end (in the kernel, or to any OpenAI-compatible server: ours, vLLM), as
its `ReplayPlan` says (`ReplayPlan.of(body, ours, others)`: `reference`, the body of the first
two runs, and `batch`, the third's bodies; `scenario` reads a run, `assemble` compares them):

1. `alone`, the reference, first, on a prefix cache of its own (a fresh `cache_salt`: no
   earlier request's blocks), nothing else sent with it;
2. `warm`, right after, with the reference's salt: its prompt's full blocks now come from the
   prefix cache, only the rest is computed;
3. `batch`, on another fresh salt, in flight together with `others` requests of other prompts
   and lengths (greedy, `ignore_eos`, each over twice the reference's `max_tokens`), sent
   before it: in the kernel their coroutines are gathered on the back end's loop, so the
   engine schedules them in the same steps; remotely they are concurrent HTTP requests, one
   thread each, which a server admits as they arrive: the others, started first and running
   longer, are still decoding while the reference arrives and decodes.

What the comparison needs is forced on every run: `logprobs` with at least the top 2
alternatives (completions `logprobs >= 2`; chat `logprobs=True`, `top_logprobs >= 2`), the
token ids (`return_token_ids`), and, where the back end is ours, `token_stats` (the exact
top-2 margin over the whole vocabulary; another server would drop it, so it is not sent).
Sampling must be reproducible: greedy (`temperature=0`) or seeded (`seed`); anything else is
refused with a `ValidationError` naming `temperature`, and so are `n`/`best_of` above 1 and
beam search (one choice is compared). The result is a `DivergenceReport`
(`workbench/inspect/divergence.py`).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from workbench.errors import ValidationError
from workbench.inspect.divergence import TIE, DivergenceReport, RunTokens, Scenario

__all__ = ["OTHER_PROMPTS", "ReplayPlan", "other_bodies", "replay_body"]

# the other requests of the `batch` scenario: prompts of different lengths (a second round
# repeats each one, longer)
OTHER_PROMPTS = (
    "Once upon a time",
    "The capital of France is",
    "def fibonacci(n):",
    "List three colours of the rainbow:",
    "In 1969 the first people to walk on the Moon were",
    "Translate to French: good morning, how are you?",
    "The recipe needs flour, sugar, eggs and",
    "Why is the sky blue? Because sunlight",
)


def replay_body(body: dict[str, Any], ours: bool) -> tuple[str, dict[str, Any]]:
    """(endpoint, the body with what a comparison needs) of a completions or chat body;
    refuses what cannot be replayed reproducibly."""
    if not isinstance(body, dict) or ("prompt" in body) == ("messages" in body):
        raise ValidationError("replay takes a completions body (prompt=...) or a chat body "
                              "(messages=...), or a Result of either.", parameter="request")
    chat = "messages" in body
    temperature, seed = body.get("temperature"), body.get("seed")
    if seed is None and (temperature is None or temperature > 0):
        said = ("is not set (the server's default applies)" if temperature is None
                else f"is {temperature!r}")
        raise ValidationError(
            f"a replay compares runs bit for bit, so its sampling must be reproducible: "
            f"temperature {said} and there is no seed; use temperature=0 (greedy) or give "
            "seed=N.", parameter="temperature", value=temperature)
    for name in ("n", "best_of"):
        if (body.get(name) or 1) != 1:
            raise ValidationError(f"a replay compares one choice: `{name}` must be 1, got "
                                  f"{body[name]!r}.", parameter=name, value=body[name])
    if body.get("use_beam_search"):
        raise ValidationError("a replay compares one sampled choice, not a beam search.",
                              parameter="use_beam_search", value=True)
    out = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    if chat:
        out["logprobs"] = True
        out["top_logprobs"] = max(out.get("top_logprobs") or 0, 2)
    else:
        out["logprobs"] = max(out.get("logprobs") or 0, 2)
    out["return_token_ids"] = True
    if ours:
        out["token_stats"] = True
    else:
        out.pop("token_stats", None)
    return ("chat" if chat else "completions"), out


def other_bodies(endpoint: str, body: dict[str, Any], others: Any) -> list[dict[str, Any]]:
    """The `batch` scenario's other requests: `others` prompts (a count of `OTHER_PROMPTS`,
    or the prompts themselves), greedy, each running over twice the reference's length."""
    if isinstance(others, bool) or not isinstance(others, (int, list, tuple)):
        raise ValidationError(f"others must be a count or a list of prompts, got {others!r}.",
                              parameter="others", value=others)
    if isinstance(others, int):
        if others < 1:
            raise ValidationError(f"others must be at least 1, got {others}.",
                                  parameter="others", value=others)
        n = len(OTHER_PROMPTS)
        others = [" ".join([OTHER_PROMPTS[i % n]] * (1 + i // n)) for i in range(others)]
    length = body.get("max_tokens") or body.get("max_completion_tokens") or 16
    bodies = []
    for i, text in enumerate(others):
        prompt = ({"messages": [{"role": "user", "content": text}]} if endpoint == "chat"
                  else {"prompt": text})
        bodies.append({**prompt, "max_tokens": 2 * length + 2 + i % 5, "temperature": 0.0,
                       "ignore_eos": True})
    return bodies


def _scenario(name: str, result: Any, others: int = 0) -> Scenario:
    """A run's `Scenario`: its tokens, and the counts the back end reported."""
    if not result.ok:
        raise RuntimeError(f"the {name} run failed: {result.error}")
    response = result.response
    trace = result.trace
    cached = getattr(trace, "num_cached_tokens", None)
    if cached is None:  # a server's usage, where it reports cached tokens
        details = (response.get("usage") or {}).get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens")
    return Scenario(name, RunTokens.of(response), result.text, cached,
                    getattr(trace, "num_shared_steps", None),
                    getattr(trace, "max_step_requests", None), others, result)


@dataclass(frozen=True)
class ReplayPlan:
    """The three runs of one body (module docstring): `endpoint`, the body `sent` (with what
    the comparison needs), the `others` of the batch, and the replay's own cache `salt`."""

    endpoint: str
    sent: dict[str, Any]
    others: list[dict[str, Any]]
    salt: str

    @classmethod
    def of(cls, body: dict[str, Any], ours: bool, others: Any = 7) -> "ReplayPlan":
        """The plan of `body` for a back end that is ours or not; refuses what cannot be
        replayed reproducibly, and `others` that are neither a count nor prompts."""
        endpoint, sent = replay_body(body, ours)
        extra = other_bodies(endpoint, sent, others)
        salt = f"wb-replay-{uuid.uuid4().hex}"  # a prefix cache of the replay's own, never shared
        return cls(endpoint, sent, extra, salt)

    @property
    def reference(self) -> dict[str, Any]:
        """The body of `alone`, then of `warm` (the same salt: its prompt's blocks cached)."""
        return {**self.sent, "cache_salt": self.salt}

    @property
    def batch(self) -> list[dict[str, Any]]:
        """The bodies of `batch`, in flight together: the others first, the reference last."""
        return [*self.others, {**self.sent, "cache_salt": self.salt + "-batch"}]

    def scenario(self, name: str, result: Any) -> Scenario:
        """A run's `Scenario` from its `Result`; a failed run raises `RuntimeError`."""
        return _scenario(name, result)

    def assemble(self, alone: Scenario, warm: Scenario, batch: list[Any], tie: float = TIE,
                 where: str = "") -> DivergenceReport:
        """The report from the `alone` and `warm` scenarios and the `batch`'s `Result`s (in the
        order of `batch`); a failed other raises `RuntimeError`."""
        *extra, mine = batch
        for i, result in enumerate(extra):
            if not result.ok:
                raise RuntimeError(f"the batch's other request {i} failed: {result.error}")
        return DivergenceReport(alone, [_scenario("batch", mine, len(extra)), warm], tie,
                                where, self.sent)
