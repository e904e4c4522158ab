"""Structured outputs in the engine: a grammar matcher per sequence, a token mask per step.

A request's `StructuredOutputsParams` is compiled once into an llguidance grammar; compiled
matchers are cached by the grammar's text, so the same schema in many requests compiles once,
and each sequence starts from a copy of the cached matcher. Before sampling, each constrained
row's matcher says which tokens its grammar allows next (a packed bitmask, unpacked to bool
[V]); the sampler sets every other logit to -inf. After sampling the matcher consumes the token.
EOS (and the model's other EOS ids) are allowed only where the grammar may end; once it has
ended only they are. Every constrained step is recorded as a `GrammarStep` (how many tokens were
allowed, which of the model's top candidates the grammar masked) for
`CompletionOutput.grammar_steps`. Logprobs stay those of the raw logits.

Memory is bounded: compiling computes the first mask at once (where llguidance builds its
lexer), measures what the grammar took on the heap, and refuses one over `max_grammar_bytes`
(a 400 naming the constraint's parameter); the cache keeps compiled grammars up to
`cache_bytes` in all, least recently used first out. A grammar that fails while generating
(a parser or lexer limit, a grammar with no finite match) finishes its sequence with
`length`, never with `stop`: the output does not match it.

n > 1: every sample has its own matcher. Preemption recomputes the KV cache only: the tokens
and the matcher state stay with the sequence. Beam search does not take constraints.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch

from workbench.engine.requests.outputs import GrammarStep
from workbench.errors import ValidationError
from workbench.sampling_params import StructuredOutputsParams

if TYPE_CHECKING:
    from llguidance import LLTokenizer
    from llguidance._lib import JsonCompileOptions  # only in the type stubs

GRAMMAR_TOP_K = 5  # the model's top candidates checked against the mask at each step
MAX_GRAMMAR_BYTES = 64 << 20  # one compiled grammar (its lexer, built on the first mask)
CACHE_BYTES = 512 << 20  # every cached grammar together
_LEXER_STATE_BYTES = 2048  # llguidance: about 1-2 kB per lexer state


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


@functools.cache
def _mallinfo2() -> Any:
    """glibc's `mallinfo2` (the heap llguidance allocates from), or None elsewhere."""
    try:
        fn = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _MallInfo2
    return fn


def heap_bytes() -> int:
    """Bytes in use on the process's C heap (glibc), else its resident set size."""
    fn = _mallinfo2()
    if fn is not None:
        info = fn()
        return info.uordblks + info.hblkhd
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


def _no_additional_properties(schema: Any) -> Any:
    """A copy of `schema` whose objects say `additionalProperties: false` where they say nothing."""
    if isinstance(schema, list):
        return [_no_additional_properties(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _no_additional_properties(v) for k, v in schema.items()}
    if (out.get("type") == "object" or "properties" in out) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def grammar_text(so: StructuredOutputsParams) -> str:
    """The llguidance grammar (its JSON text) for one constraint; checked later, when compiled."""
    # deferred: llguidance loads only once a request is constrained
    from llguidance import LLMatcher, grammar_from, regex_to_lark

    if so.json is not None or so.json_object:
        schema: Any = {"type": "object"} if so.json_object else so.json
        if isinstance(schema, str):
            schema = json.loads(schema)
        if schema is True:  # the schema that accepts any JSON value
            schema = {}
        if so.disable_additional_properties:
            schema = _no_additional_properties(schema)
        options: JsonCompileOptions = {"whitespace_flexible": not so.disable_any_whitespace}
        if so.whitespace_pattern is not None and not so.disable_any_whitespace:
            options["whitespace_pattern"] = so.whitespace_pattern
        return LLMatcher.grammar_from_json_schema(schema, defaults=options)
    if so.regex is not None:  # `\d` means ASCII digits, as users expect (Rust's is Unicode)
        return LLMatcher.grammar_from_lark(f"start: /{regex_to_lark(so.regex, 'd')}/")
    if so.choice is not None:
        return grammar_from("choice", json.dumps(so.choice))  # it takes the list as JSON text
    assert so.grammar is not None  # exactly one constraint is set (StructuredOutputsParams)
    try:  # Lark, or llama.cpp's GBNF converted to Lark
        return grammar_from("grammar", so.grammar)
    except ValueError as exc:
        raise ValidationError(
            f"The grammar is neither Lark nor GBNF syntax (llguidance backend): {exc}",
            parameter=so.parameter, value="grammar") from None


def _describe(so: StructuredOutputsParams, error: str) -> str:
    """The backend's compile error, said in terms of what the request gave."""
    error = error.strip()
    if so.json is not None:
        what = ("The JSON schema in response_format" if so.parameter == "response_format"
                else "The JSON schema in structured_outputs.json")
        return f"{what} is not supported: {error}"
    if so.regex is not None:
        return f"structured_outputs.regex is not a supported regular expression: {error}"
    if so.choice is not None:
        return f"structured_outputs.choice could not be compiled: {error}"
    if so.grammar is not None:
        return ("structured_outputs.grammar is not a valid grammar (llguidance takes Lark or "
                f"GBNF syntax): {error}")
    return f"The structured output constraint could not be compiled: {error}"


def _what(so: StructuredOutputsParams) -> str:
    """The constraint as the request named it (`structured_outputs.regex`, ...)."""
    if so.parameter == "response_format":
        return "The JSON schema in response_format"
    return f"structured_outputs.{so.kind}"


class CompiledGrammar:
    """One compiled constraint: a pristine matcher each sequence copies, and its trigger."""

    def __init__(self, matcher: Any, after_token_ids: list[int] | None, eos_ids: list[int],
                 nbytes: int = 0):
        self._matcher = matcher
        self.nbytes = nbytes  # heap it took to compile (and build its first mask)
        self._lock = threading.Lock()
        self.after_token_ids = list(after_token_ids) if after_token_ids else None
        self.eos_ids = eos_ids

    def start(self) -> "SequenceGrammar":
        """A fresh matcher for one sequence (a copy: compiling again is not needed)."""
        with self._lock:
            matcher = self._matcher.deep_copy()
        return SequenceGrammar(matcher, self.after_token_ids, self.eos_ids)


class SequenceGrammar:
    """One sequence's matcher, whether it is active yet, and its record of constrained steps."""

    def __init__(self, matcher: Any, after_token_ids: list[int] | None, eos_ids: list[int]):
        self.matcher = matcher
        self.trigger = after_token_ids
        self.active = after_token_ids is None
        self.eos_ids = eos_ids
        self.steps: list[GrammarStep | None] = []  # one per output token; None = unconstrained
        self._recent: list[int] = []
        self._pending: GrammarStep | None = None

    @property
    def finished(self) -> bool:
        """The grammar has ended (EOS consumed) or failed: only EOS is allowed now."""
        return self.matcher.is_stopped() or self.matcher.is_error()

    @property
    def failed(self) -> bool:
        """The matcher gave up (a parser or lexer limit, no finite match): the output so far
        cannot be completed into a match, so the sequence finishes with `length`."""
        return self.active and self.matcher.is_error()

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        """Writes the allowed-token bitmask of the next position into bitmask[row] (int32)."""
        view = bitmask[row]
        self.matcher.unsafe_compute_mask_ptr(view.data_ptr(), view.numel() * view.element_size())

    def accept(self, token: int) -> None:
        """The sampled token: advances the matcher (or watches for the trigger) and records."""
        if not self.active:
            assert self.trigger is not None  # inactive only while waiting for its trigger
            self.steps.append(None)
            self._recent = (self._recent + [token])[-len(self.trigger):]
            self.active = self._recent == self.trigger
            return
        self.steps.append(self._pending)
        self._pending = None
        if not self.finished:
            self.matcher.consume_token(token)  # a refused token leaves it in its error state

    @property
    def error(self) -> str | None:
        return self.matcher.get_error() if self.matcher.is_error() else None


class GrammarCompiler:
    """Compiles constraints for one tokenizer, caching compiled matchers by grammar text."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: Iterable[int | None], *,
                 max_grammar_bytes: int = MAX_GRAMMAR_BYTES, cache_bytes: int = CACHE_BYTES):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_ids = [t for t in dict.fromkeys(eos_ids) if t is not None and t < vocab_size]
        self.max_grammar_bytes = max_grammar_bytes
        self.cache_bytes = cache_bytes
        self._ll_tokenizer: LLTokenizer | None = None
        self._cache: OrderedDict[str, CompiledGrammar] = OrderedDict()
        self._lock = threading.Lock()
        self.num_compiled = 0  # cache misses, for tests and stats

    @property
    def cached_bytes(self) -> int:
        return sum(c.nbytes for c in self._cache.values())

    def ll_tokenizer(self) -> LLTokenizer:
        """llguidance's view of the tokenizer (built once, on the first constraint: ~0.5 s)."""
        if self._ll_tokenizer is None:
            import llguidance.hf  # deferred: it imports transformers (seconds)

            self._ll_tokenizer = llguidance.hf.from_tokenizer(
                self.tokenizer, n_vocab=self.vocab_size, eos_token=self.eos_ids or None)
        return self._ll_tokenizer

    def compile(self, so: StructuredOutputsParams) -> CompiledGrammar:
        """The compiled constraint; `ValidationError` naming what the backend can't take."""
        from llguidance import LLMatcher  # deferred: loads only once a request is constrained

        if so.json is False or so.json == "false":
            raise ValidationError("The JSON schema `false` accepts no value at all.",
                                  parameter=so.parameter, value="json")
        try:
            text = grammar_text(so)
        except ValidationError:
            raise
        except ValueError as exc:  # the backend's own checks of the schema's shape
            raise ValidationError(_describe(so, str(exc)), parameter=so.parameter,
                                  value=so.kind) from None
        key = text
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return self._with_trigger(hit, so)
            tokenizer = self.ll_tokenizer()
            is_error, messages = LLMatcher.validate_grammar_with_warnings(text, tokenizer)
            if is_error:
                raise ValidationError(_describe(so, messages[0] if messages else "invalid"),
                                      parameter=so.parameter, value=so.kind)
            compiled = self._build(so, text, tokenizer)
            self.num_compiled += 1
            self._cache[key] = compiled
            while len(self._cache) > 1 and self.cached_bytes > self.cache_bytes:
                self._cache.popitem(last=False)
            return self._with_trigger(compiled, so)

    def _build(self, so: StructuredOutputsParams, text: str, tokenizer: Any) -> CompiledGrammar:
        """A matcher with its first mask computed (its lexer built), measured and bounded."""
        from llguidance import LLMatcher, LLParserLimits  # deferred: only constrained requests

        limits = LLParserLimits(max_lexer_states=max(1000, self.max_grammar_bytes
                                                     // _LEXER_STATE_BYTES))
        before = heap_bytes()
        matcher = LLMatcher(tokenizer, text, log_level=0, limits=limits)
        if not matcher.is_error():
            scratch = torch.zeros((self.vocab_size + 31) // 32, dtype=torch.int32)
            matcher.unsafe_compute_mask_ptr(scratch.data_ptr(), scratch.numel() * 4)
        if matcher.is_error():
            raise ValidationError(_describe(so, matcher.get_error().split("\n")[0]),
                                  parameter=so.parameter, value=so.kind)
        nbytes = max(heap_bytes() - before, len(text))
        if nbytes > self.max_grammar_bytes:
            del matcher
            raise ValidationError(
                f"{_what(so)} compiles to {nbytes / 2**20:.1f} MiB, over the limit of "
                f"{self.max_grammar_bytes / 2**20:.1f} MiB per grammar: simplify it (bounded "
                "repetitions multiply).", parameter=so.parameter, value=so.kind)
        return CompiledGrammar(matcher, None, self.eos_ids, nbytes)

    @staticmethod
    def _with_trigger(compiled: CompiledGrammar, so: StructuredOutputsParams) -> CompiledGrammar:
        if not so.after_token_ids:
            return compiled
        view = CompiledGrammar.__new__(CompiledGrammar)
        view.__dict__.update(compiled.__dict__)
        view.after_token_ids = list(so.after_token_ids)
        return view


def grammar_masks(grammars: list[SequenceGrammar | None], logits: torch.Tensor,
                  top_k: list[int]) -> list[torch.Tensor | None]:
    """Bool [V] allowed-token masks for the active grammars among `grammars` (None elsewhere);
    records each one's pending `GrammarStep` against the raw logits [R, V]."""
    masks: list[torch.Tensor | None] = [None] * len(grammars)
    active = [(i, g) for i, g in enumerate(grammars) if g is not None and g.active]
    if not active:
        return masks
    rows = [i for i, _ in active]
    vocab = logits.shape[1]
    bitmask = torch.zeros((len(rows), (vocab + 31) // 32), dtype=torch.int32)  # [G, W]
    ended = []
    for j, (_, g) in enumerate(active):
        if g.finished:
            ended.append((j, g.eos_ids))
        else:
            g.fill(bitmask, j)
    shifts = torch.arange(32, dtype=torch.int32)
    allowed = ((bitmask.unsqueeze(-1) >> shifts) & 1).view(len(rows), -1)[:, :vocab].bool()  # [G, V]
    for j, eos_ids in ended:  # the grammar is over: only EOS may follow
        allowed[j, eos_ids] = True
    k = max(top_k[i] for i in rows)
    raw = logits[rows].float().log_softmax(-1)  # [G, V]: as the sampler's raw logprobs, bit for bit
    top_lp, top_ids = (t.cpu() for t in raw.topk(min(k, vocab), dim=-1))  # [G, k]; masks on CPU
    top_ok = allowed.gather(1, top_ids)  # [G, k]
    counts = allowed.sum(-1).tolist()
    for j, (i, g) in enumerate(active):
        masks[i] = allowed[j]
        kk = top_k[i]
        masked = {int(t): float(lp) for t, lp, ok in zip(
            top_ids[j, :kk].tolist(), top_lp[j, :kk].tolist(), top_ok[j, :kk].tolist()) if not ok}
        g._pending = GrammarStep(num_allowed=int(counts[j]), masked=masked)
    return masks


def attach_grammar_masks(seqs: list[Any], rows: list[Any], logits: torch.Tensor,
                         vocab_size: int) -> None:
    """Sets `grammar_mask` on the `SamplingRow`s of constrained sequences (logits: [R, V+])."""
    grammars = [s.grammar_matcher for s in seqs]
    if all(g is None for g in grammars):
        return
    top_k = [max(GRAMMAR_TOP_K, s.request.params.num_logprobs(vocab_size) or 0) for s in seqs]
    masks = grammar_masks(grammars, logits[:, :vocab_size], top_k)
    for row, mask in zip(rows, masks):
        row.grammar_mask = mask
