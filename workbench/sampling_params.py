"""How to sample one request: vLLM's `SamplingParams` and `BeamSearchParams`, with validation;
`StructuredOutputsParams`, the output constraint a `SamplingParams` may carry.

Field names, defaults and error messages follow vLLM 0.32 so code moves between the two.
Validation happens in two steps: `__post_init__` checks what the parameters alone decide
(ranges, types); `verify(vocab_size, max_logprobs, max_model_len)` checks what depends on the
model. Both raise `ValidationError` (a `ValueError`) naming the parameter and the value.
"""

from __future__ import annotations

import copy
import enum
import json
import math
from dataclasses import dataclass, field
from typing import Any

from workbench.errors import refuse
from workbench.inside import resolve as inside_resolve
from workbench.inside.resolve import Inside, ModelShape
from workbench.inside.spec import (
    CaptureParams,
    FeaturesParams,
    Intervention,
    LogitLensParams,
    parse_inside,
)

MAX_N_SEQUENCES = 16384
MAX_LOGPROB_TOKEN_IDS = 128  # vLLM's limit on `logprob_token_ids`
_SAMPLING_EPS = 1e-5
_MIN_TEMPERATURE = 0.01


class RequestOutputKind(enum.Enum):
    """What each `RequestOutput` of a running request carries."""

    CUMULATIVE = 0  # everything generated so far
    DELTA = 1  # only what is new since the previous output
    FINAL_ONLY = 2  # a single output when the request finishes


def _is_text(text: str) -> bool:
    """False for a string holding a lone UTF-16 surrogate (it has no UTF-8 form)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


_CONSTRAINTS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
MAX_JSON_SCHEMA_DEPTH = 64


def _json_depth(value: Any) -> int:
    """How deeply objects and arrays nest in a JSON value (a scalar is 0)."""
    depth, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        if isinstance(item, (dict, list)):
            depth = max(depth, level)
            stack.extend((child, level + 1) for child in children)
    return depth


@dataclass
class StructuredOutputsParams:
    """One output constraint, as vLLM's `StructuredOutputsParams`; enforced by the engine as a
    token mask from an llguidance grammar matcher (workbench/engine/requests/structured.py).

    Exactly one of: `json` (a JSON schema, dict or JSON string), `regex`, `choice` (the output is
    one of these strings), `grammar` (Lark or llama.cpp GBNF syntax, as llguidance reads them),
    `json_object=True` (any JSON object). `structural_tag` is vLLM's, refused here (the backend
    does not take vLLM's tag format). Options: `disable_any_whitespace` (JSON without free
    whitespace between tokens), `disable_additional_properties` (objects of the schema get
    `additionalProperties: false` where they say nothing), `whitespace_pattern` (a regex for
    JSON whitespace).

    `after_token_ids` is ours: when set, the constraint applies only once the output contains
    this token sequence (e.g. the ids of `</think>`: structured output after reasoning ends);
    tokens up to and including it are unconstrained, and the grammar starts right after it. When
    the prompt already closed the reasoning, leave it None.

    >>> StructuredOutputsParams(choice=["yes", "no"]).kind
    'choice'
    """

    json: str | dict | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    after_token_ids: list[int] | None = None
    # the request field errors name: "response_format" when the serving layer built it from that
    parameter: str = field(default="structured_outputs", repr=False, compare=False)

    def __post_init__(self) -> None:
        given = [name for name in _CONSTRAINTS if getattr(self, name) is not None]
        p = self.parameter
        if len(given) > 1:
            refuse("You can only use one kind of constraints for structured outputs "
                  "('json', 'regex' or 'choice').", p, given)
        if not given:
            refuse("You must use one kind of structured outputs constraint but none are "
                  f"specified (one of {', '.join(_CONSTRAINTS)}).", p, None)
        if self.json is not None:
            self._check_json()
        if self.regex is not None:
            if not isinstance(self.regex, str) or not self.regex:
                refuse("structured_outputs.regex must be a non-empty string.", p, self.regex)
            if "\x00" in self.regex:
                refuse("structured_outputs.regex must not contain NUL characters.", p, self.regex)
        if self.choice is not None:
            if not isinstance(self.choice, list) or not self.choice or not all(
                    isinstance(c, str) for c in self.choice):
                refuse("structured_outputs.choice must be a non-empty list of strings.", p,
                      self.choice)
        if self.grammar is not None and (not isinstance(self.grammar, str)
                                         or not self.grammar.strip()):
            refuse("structured_outputs.grammar must be a non-empty string.", p, self.grammar)
        if self.json_object is not None and self.json_object is not True:
            refuse("structured_outputs.json_object must be true when given.", p, self.json_object)
        if self.structural_tag is not None:
            refuse("structural_tag is not supported: the structured-output backend here "
                  "(llguidance) takes json, regex, choice, grammar or json_object.", p,
                  "structural_tag")
        if self.after_token_ids is not None and (
                not self.after_token_ids
                or not all(isinstance(t, int) and t >= 0 for t in self.after_token_ids)):
            refuse("structured_outputs.after_token_ids must be a non-empty list of token ids.",
                  p, self.after_token_ids)

    def _check_json(self) -> None:
        p, schema = self.parameter, self.json
        if isinstance(schema, str):
            if not schema.strip():
                refuse("The JSON schema must not be empty.", p, schema)
            try:
                schema = json.loads(schema)
            except ValueError as exc:
                refuse(f"The JSON schema is not valid JSON: {exc}.", p, self.json)
        if not isinstance(schema, (dict, bool)):
            refuse(f"The JSON schema must be an object, got {type(schema).__name__}.", p, schema)
        if _json_depth(schema) > MAX_JSON_SCHEMA_DEPTH:
            refuse("The JSON schema is nested too deeply: objects and arrays may nest at most "
                  f"{MAX_JSON_SCHEMA_DEPTH} levels", p, None)

    @property
    def kind(self) -> str:
        """Which constraint this is: 'json', 'regex', 'choice', 'grammar' or 'json_object'."""
        return next(name for name in _CONSTRAINTS if getattr(self, name) is not None)


@dataclass
class SamplingParams:
    """Sampling parameters for one request, as vLLM's.

    >>> SamplingParams(temperature=0, max_tokens=8).greedy
    True
    """

    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    # logprobs of exactly these ids at each generated position (besides the sampled token's),
    # whatever their rank; turns logprobs on by itself
    logprob_token_ids: list[int] | None = None
    # the whole distribution at every position that carries logprobs (generated ones with
    # `logprobs`, prompt ones with `prompt_logprobs`), exactly: entropy over the full
    # vocabulary, the token's rank, the top-2 margin, the top-k's mass (`TokenStats`)
    token_stats: bool = False
    # engine-level, never on the wire: keep the full vocabulary's log-probabilities of every
    # prompt token from this index on (>= 1) as one float32 tensor on the output
    # (`RequestOutput.prompt_distributions`, [tokens, V]), from the same logits as
    # `prompt_logprobs` (which it needs); what `LLM.compare` computes KL divergences from
    prompt_distributions_from: int | None = None
    # end the reasoning by force after this many reasoning tokens (-1 / None: no limit); the
    # reasoning ends with `reasoning_end_token_ids` and opens at the first output token, or,
    # with `reasoning_start_token_ids`, once the output ends with them (`engine/requests/thinking.py`)
    thinking_token_budget: int | None = None
    reasoning_end_token_ids: list[int] | None = None
    reasoning_start_token_ids: list[int] | None = None
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    truncate_prompt_tokens: int | None = None
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    # a constraint on the output (JSON schema, regex, choice, grammar): `StructuredOutputsParams`
    # or a dict of its fields; not with beam search
    structured_outputs: StructuredOutputsParams | None = None
    # what to see or change inside the model (`workbench/inside/spec.py`, TransformerLens's
    # names): activations to record, the logit lens, interventions on this request's rows;
    # parsed here, resolved against the model once (`resolve_inside`)
    capture: CaptureParams | None = None
    logit_lens: LogitLensParams | None = None
    interventions: list[Intervention] | None = None
    # an SAE's features to read (`FeaturesParams`: its name, top_k, indices, positions)
    features: FeaturesParams | None = None
    # engine-level, never on the wire (TransformerLens's `stop_at_layer`): the forward ends
    # before this layer (negative: from the end) and the request with its prompt, with no
    # logits and no token (finish_reason 'stop_at_layer'): for what it records or changes in
    # the layers before, at their cost only (a capture job's rows of a middle layer)
    stop_at_layer: int | None = None
    # filled by `resolve_inside`: the three resolved for the model, which later stages read
    _inside: Inside | None = field(default=None, repr=False, compare=False)
    # filled by the engine: token-id sequences of `bad_words`, the model's extra EOS ids
    _bad_words_token_ids: list[list[int]] = field(default_factory=list, repr=False)
    _all_stop_token_ids: set[int] = field(default_factory=set, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        self.bad_words = list(self.bad_words or [])
        if self.logprob_token_ids is not None:
            self.logprob_token_ids = list(self.logprob_token_ids)
        if self.seed == -1:
            self.seed = None
        if self.logit_bias is not None:
            self.logit_bias = self._parse_logit_bias(self.logit_bias)
        if isinstance(self.structured_outputs, dict):
            self.structured_outputs = StructuredOutputsParams(**self.structured_outputs)
        self.capture, self.logit_lens, self.interventions = parse_inside(
            self.capture, self.logit_lens, self.interventions)
        if self.features is not None:
            self.features = FeaturesParams.parse(self.features)
        self._verify_args()
        if 0 < self.temperature < _MIN_TEMPERATURE:
            self.temperature = _MIN_TEMPERATURE
        if self.temperature < _SAMPLING_EPS:
            # greedy: the truncation knobs mean nothing
            self.top_p, self.top_k, self.min_p = 1.0, 0, 0.0
        self._all_stop_token_ids = set(self.stop_token_ids)

    @staticmethod
    def _parse_logit_bias(bias: dict) -> dict[int, float]:
        parsed, bad = {}, []
        for key, value in bias.items():
            try:
                token_id = int(key)
            except (TypeError, ValueError):
                bad.append(key)
                continue
            parsed[token_id] = min(100.0, max(-100.0, float(value)))
        if bad:
            refuse(
                f"logit_bias contains key(s) that cannot be converted to integer token IDs: {bad}",
                "logit_bias", bad,
            )
        return parsed

    def _verify_args(self) -> None:
        if not isinstance(self.n, int) or isinstance(self.n, bool):
            refuse(f"n must be an int, but is of type {type(self.n).__name__}", "n", self.n)
        if self.n < 1:
            refuse(f"n must be at least 1, got {self.n}.", "n", self.n)
        if self.n > MAX_N_SEQUENCES:
            refuse(
                f"n must be at most {MAX_N_SEQUENCES}, got {self.n}. To increase this limit, "
                "set the VLLM_MAX_N_SEQUENCES environment variable.", "n", self.n,
            )
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not (-2.0 <= value <= 2.0):
                refuse(f"{name} must be in [-2, 2], got {value}.", name, value)
        if not (self.repetition_penalty > 0.0 and math.isfinite(self.repetition_penalty)):
            refuse(
                f"repetition_penalty must be greater than zero, got {self.repetition_penalty}.",
                "repetition_penalty", self.repetition_penalty,
            )
        if not math.isfinite(self.temperature) or self.temperature < 0.0:
            refuse(
                f"temperature must be non-negative, got {self.temperature}.",
                "temperature", self.temperature,
            )
        if not (0.0 < self.top_p <= 1.0):
            refuse(f"top_p must be in (0, 1], got {self.top_p}.", "top_p", self.top_p)
        if self.top_k == -1:
            self.top_k = 0
        if not isinstance(self.top_k, int) or self.top_k < 0:
            refuse(f"top_k must be 0 (disable), or at least 1, got {self.top_k}.", "top_k", self.top_k)
        if not (0.0 <= self.min_p <= 1.0):
            refuse(f"min_p must be in [0, 1], got {self.min_p}.", "min_p", self.min_p)
        if self.max_tokens is not None and self.max_tokens < 1:
            refuse(f"max_tokens must be at least 1, got {self.max_tokens}.", "max_tokens", self.max_tokens)
        if self.min_tokens < 0:
            refuse(
                f"min_tokens must be greater than or equal to 0, got {self.min_tokens}.",
                "min_tokens", self.min_tokens,
            )
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            refuse(
                f"min_tokens must be less than or equal to max_tokens={self.max_tokens}, "
                f"got {self.min_tokens}.", "min_tokens", self.min_tokens,
            )
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and value < -1:
                refuse(f"{name} must be non-negative or -1, got {value}.", name, value)
        if self.logprob_token_ids is not None and len(self.logprob_token_ids) > MAX_LOGPROB_TOKEN_IDS:
            refuse(
                f"Requested logprob_token_ids of length {len(self.logprob_token_ids)}, which is "
                f"greater than max allowed: {MAX_LOGPROB_TOKEN_IDS}", "logprob_token_ids",
                len(self.logprob_token_ids),
            )
        if not isinstance(self.token_stats, bool):
            refuse(f"token_stats must be a boolean, got {self.token_stats!r}.", "token_stats",
                   self.token_stats)
        if self.token_stats and not self.wants_logprobs and self.prompt_logprobs is None:
            refuse("token_stats describes the positions that carry logprobs: ask for logprobs "
                   "(generated tokens) or prompt_logprobs (prompt tokens) with it.",
                   "token_stats", self.token_stats)
        start = self.prompt_distributions_from
        if start is not None and (not isinstance(start, int) or isinstance(start, bool)
                                  or start < 1 or self.prompt_logprobs is None):
            refuse("prompt_distributions_from is the first prompt token (>= 1) whose whole "
                   f"distribution is kept, with prompt_logprobs set; got {start!r}.",
                   "prompt_distributions_from", start)
        if self.thinking_token_budget is not None:
            if self.thinking_token_budget < -1:
                refuse(f"thinking_token_budget must be -1 (no limit) or >= 0, got "
                      f"{self.thinking_token_budget}.", "thinking_token_budget",
                      self.thinking_token_budget)
            if self.thinking_token_budget >= 0 and not self.reasoning_end_token_ids:
                refuse("thinking_token_budget needs reasoning_end_token_ids: the token ids that "
                      "end the reasoning.", "thinking_token_budget", self.thinking_token_budget)
        if self.truncate_prompt_tokens is not None and (
            self.truncate_prompt_tokens == 0 or self.truncate_prompt_tokens < -1
        ):
            refuse(
                f"truncate_prompt_tokens must be >= 1 or -1, got {self.truncate_prompt_tokens}",
                "truncate_prompt_tokens", self.truncate_prompt_tokens,
            )
        if any(not s for s in self.stop):
            refuse("stop cannot contain an empty string.", "stop", self.stop)
        for s in self.stop:  # a lone surrogate can never match decoded text, nor be logged
            if not _is_text(s):
                refuse("stop strings must be valid Unicode text (a lone UTF-16 surrogate is "
                      "not).", "stop", s.encode("utf-8", "backslashreplace").decode())
        if any(not w for w in self.bad_words):
            refuse(f"bad_words cannot contain an empty string. Got bad_words={self.bad_words}",
                  "bad_words", self.bad_words)
        if self.greedy and self.n > 1:
            refuse(f"n must be 1 when using greedy sampling, got {self.n}.", "n", self.n)
        if self.allowed_token_ids is not None and len(self.allowed_token_ids) == 0:
            refuse("allowed_token_ids is not None and empty!", "allowed_token_ids", self.allowed_token_ids)
        recording = [name for name in ("capture", "logit_lens", "features")
                     if getattr(self, name) is not None]
        if recording and self.n > 1:
            refuse(f"{recording[0]} records one sequence: n must be 1, got {self.n}.",
                   recording[0], self.n)
        if self.stop_at_layer is not None:
            self._verify_stop_at_layer()

    def _verify_stop_at_layer(self) -> None:
        """A forward that stops early computes no logits: nothing may ask for them."""
        stop = self.stop_at_layer
        if not isinstance(stop, int) or isinstance(stop, bool):
            refuse(f"stop_at_layer must be an integer, got {stop!r}.", "stop_at_layer", stop)
        if self.capture is None and self.logit_lens is None and self.features is None:
            refuse("stop_at_layer ends the request with no token: without a capture, features "
                   "or a logit lens it would return nothing.", "stop_at_layer", stop)
        if self.max_tokens != 1 or self.n != 1:
            name, value = ("max_tokens", self.max_tokens) if self.max_tokens != 1 \
                else ("n", self.n)
            refuse(f"stop_at_layer ends the request with its prompt, sampling no token: "
                   f"{name} must be 1, got {value}.", name, value)
        for name in ("logprobs", "prompt_logprobs", "logprob_token_ids", "structured_outputs"):
            value = getattr(self, name)
            if value is not None:
                refuse(f"{name} needs the model's logits, which a forward that stops before "
                       "the LM head (stop_at_layer) never computes.", name, value)

    def verify(self, vocab_size: int, max_logprobs: int) -> None:
        """Checks what depends on the model: vocabulary ids and the logprob cap (-1 = none)."""
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            requested = vocab_size if value == -1 else value
            if value is not None and max_logprobs != -1 and requested > max_logprobs:
                kind = "sample" if name == "logprobs" else "prompt"
                refuse(
                    f"Requested {kind} logprobs of {requested}, which is greater than max "
                    f"allowed: {max_logprobs}", name, value,
                )
        for name, ids in (
            ("stop_token_ids", self.stop_token_ids),
            ("logit_bias", list(self.logit_bias or {})),
            ("logprob_token_ids", self.logprob_token_ids or []),
            ("reasoning_end_token_ids", self.reasoning_end_token_ids or []),
            ("reasoning_start_token_ids", self.reasoning_start_token_ids or []),
        ):
            bad = [t for t in ids if not 0 <= t < vocab_size]
            if bad:
                refuse(
                    f"token_id(s) {bad} in {name} contain out-of-vocab token ids. "
                    f"Vocabulary size: {vocab_size}", name, bad,
                )
        if self.allowed_token_ids is not None and any(
            not 0 <= t < vocab_size for t in self.allowed_token_ids
        ):
            refuse("allowed_token_ids contains out-of-vocab token id!",
                  "allowed_token_ids", self.allowed_token_ids)

    @property
    def wants_inside(self) -> bool:
        """Whether it records or intervenes inside the model."""
        return self.capture is not None or self.logit_lens is not None or \
            self.features is not None or bool(self.interventions)

    def resolve_inside(self, shape: ModelShape, num_positions: int) -> Inside | None:
        """Its capture, logit lens and interventions resolved against the model for sequences
        of at most `num_positions` (`workbench.inside.resolve`), once: kept on the params (and
        their clones), so a later stage asking again for the same model and length gets the
        same `Inside`. None when it has none; a `ValidationError` naming the field."""
        if not self.wants_inside:
            return None
        done = self._inside
        if done is None or not done.resolved_for(shape, num_positions):
            done = self._inside = inside_resolve.resolve(
                self.capture, self.logit_lens, self.interventions or [], shape, num_positions,
                self.features, self.stop_at_layer)
        return done

    @property
    def greedy(self) -> bool:
        return self.temperature < _SAMPLING_EPS

    @property
    def wants_logprobs(self) -> bool:
        """Whether generated positions carry logprobs (a top-k count or tracked ids)."""
        return self.logprobs is not None or bool(self.logprob_token_ids)

    def num_logprobs(self, vocab_size: int) -> int | None:
        """Top-k logprobs per generated position, resolving -1 to the whole vocabulary."""
        return vocab_size if self.logprobs == -1 else self.logprobs

    def num_prompt_logprobs(self, vocab_size: int) -> int | None:
        return vocab_size if self.prompt_logprobs == -1 else self.prompt_logprobs

    def clone(self) -> "SamplingParams":
        return copy.deepcopy(self)


@dataclass
class BeamSearchParams:
    """Beam search parameters, as vLLM's (`beam_width` beams, scored with `length_penalty`)."""

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.beam_width, int) or self.beam_width < 1:
            refuse(f"beam_width must be at least 1, got {self.beam_width}.", "n", self.beam_width)
        if self.beam_width > MAX_N_SEQUENCES:
            refuse(f"n must be at most {MAX_N_SEQUENCES}, got {self.beam_width}.", "n", self.beam_width)
        if self.max_tokens is None or self.max_tokens < 1:
            refuse(f"max_tokens must be at least 1, got {self.max_tokens}.", "max_tokens", self.max_tokens)
        if not math.isfinite(self.temperature) or self.temperature < 0:
            refuse(f"temperature must be non-negative, got {self.temperature}.",
                  "temperature", self.temperature)
        if not math.isfinite(self.length_penalty):
            refuse(f"length_penalty must be finite, got {self.length_penalty}.",
                  "length_penalty", self.length_penalty)
