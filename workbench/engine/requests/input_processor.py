"""Turns what a caller submits (text, token ids or embeddings, `SamplingParams`) into a checked
`Request`.

Every check that depends on the model happens here, before anything is scheduled, and fails
with a `ValidationError` naming the parameter: empty or out-of-vocabulary prompts, prompts too
long for the context, `max_tokens` that can't fit, logprob counts above the cap.
"""

from __future__ import annotations

from typing import Any

from workbench.engine.requests.prompt_embeds import PLACEHOLDER_TOKEN_ID, check_prompt_embeds
from workbench.engine.requests.recording import Recording
from workbench.engine.requests.request import Request
from workbench.engine.requests.structured import GrammarCompiler
from workbench.errors import ValidationError
from workbench.inside.resolve import ModelShape
from workbench.sampling_params import SamplingParams

PromptInput = str | list[int] | dict[str, Any]


class InputProcessor:
    """Tokenizes and validates requests for one model."""

    def __init__(self, tokenizer, vocab_size: int, max_model_len: int, max_logprobs: int,
                 eos_token_id: int | None, extra_eos_ids: set[int], hidden_size: int,
                 model_shape: ModelShape | None = None):
        self.tokenizer = tokenizer
        self.model_shape = model_shape  # what captures and interventions are checked against
        self.hidden_size = hidden_size  # of `prompt_embeds` rows
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.max_logprobs = max_logprobs
        self.eos_token_id = eos_token_id
        self.extra_eos_ids = extra_eos_ids
        # structured outputs: compiled grammars, cached (engine/requests/structured.py)
        self.grammars = GrammarCompiler(tokenizer, vocab_size,
                                        [eos_token_id, *sorted(extra_eos_ids)])

    def tokenize(self, prompt: PromptInput) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            return prompt, self.tokenizer(prompt, add_special_tokens=True)["input_ids"]
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), list(prompt["prompt_token_ids"])
            if "prompt" in prompt:
                return self.tokenize(prompt["prompt"])
            raise ValidationError("A prompt dict needs 'prompt', 'prompt_token_ids' or "
                                  "'prompt_embeds'.",
                                  parameter="prompt", value=sorted(prompt))
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return None, list(prompt)
        raise ValidationError(f"Unsupported prompt type {type(prompt).__name__}.",
                              parameter="prompt", value=type(prompt).__name__)

    def process(self, request_id: str, prompt: PromptInput, params: SamplingParams,
                **request_kwargs) -> Request:
        embeds = None
        if isinstance(prompt, dict) and prompt.get("prompt_embeds") is not None:
            # placeholder ids stand for the embedded positions
            embeds = check_prompt_embeds(prompt["prompt_embeds"], self.hidden_size)
            text, ids = prompt.get("prompt"), [PLACEHOLDER_TOKEN_ID] * len(embeds)
            if params.prompt_logprobs is not None:
                raise ValidationError("prompt_logprobs is not compatible with prompt embeds.",
                                      parameter="prompt_logprobs", value=params.prompt_logprobs)
        else:
            text, ids = self.tokenize(prompt)
        if isinstance(prompt, dict) and request_kwargs.get("cache_salt") is None:
            request_kwargs["cache_salt"] = prompt.get("cache_salt")
        params = params.clone()
        ids = self._truncate(ids, params.truncate_prompt_tokens)
        if embeds is not None:
            embeds = embeds[len(embeds) - len(ids):]
            request_kwargs["prompt_embeds"] = embeds
        self._check_prompt(ids)
        params.verify(self.vocab_size, self.max_logprobs)
        self._resolve_max_tokens(params, len(ids))
        self._resolve_inside(params, len(ids), request_kwargs)
        if not params.ignore_eos:
            params._all_stop_token_ids |= self.extra_eos_ids
        params._bad_words_token_ids = self._bad_words(params.bad_words)
        banned = params._all_stop_token_ids | (
            {self.eos_token_id} if self.eos_token_id is not None else set())
        if params.structured_outputs is not None:  # compiled now: a schema it can't take is a 400
            request_kwargs["compiled_grammar"] = self.grammars.compile(params.structured_outputs)
        return Request(request_id, text, ids, params, min_tokens_stop_ids=frozenset(banned),
                       **request_kwargs)

    def _resolve_inside(self, params: SamplingParams, num_prompt: int,
                        request_kwargs: dict[str, Any]) -> None:
        """A capture, logit lens or interventions resolved against the model (once: params the
        serving layer resolved already carry their `Inside`), and the request's `Recording`."""
        if not params.wants_inside:
            return
        if self.model_shape is None:
            name = "capture" if params.capture is not None else \
                "logit_lens" if params.logit_lens is not None else "interventions"
            raise ValidationError(f"{name} needs a decoder whose layers the engine runs; this "
                                  "model has none.", parameter=name, value=None)
        assert params.max_tokens is not None  # resolved just before
        inside = params.resolve_inside(self.model_shape, num_prompt + params.max_tokens)
        assert inside is not None
        request_kwargs["inside"] = inside
        if inside.records:
            request_kwargs["recording"] = Recording(inside, num_prompt,
                                                  self.model_shape.num_layers)

    def _truncate(self, ids: list[int], keep: int | None) -> list[int]:
        if keep is None:
            return ids
        if keep > self.max_model_len:
            raise ValidationError(
                f"truncate_prompt_tokens={keep} cannot be greater than max_model_len = "
                f"{self.max_model_len}. Please request a smaller truncation size.",
                parameter="truncate_prompt_tokens", value=keep)
        if keep == -1:
            keep = self.max_model_len - 1
        return ids[-keep:]

    def _check_prompt(self, ids: list[int]) -> None:
        if not ids:
            raise ValidationError("The decoder prompt cannot be empty", parameter="prompt", value=ids)
        bad = next((t for t in ids if not isinstance(t, int) or not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise ValidationError(f"Token id {bad} is out of vocabulary", parameter="prompt", value=bad)
        if len(ids) >= self.max_model_len:
            raise ValidationError(
                f"The decoder prompt (length {len(ids)}) is longer than the maximum model length "
                f"of {self.max_model_len}. Make sure that `max_model_len` is no smaller than the "
                "number of text tokens.", parameter="prompt", value=len(ids))

    def _resolve_max_tokens(self, params: SamplingParams, prompt_len: int) -> None:
        room = self.max_model_len - prompt_len
        if params.max_tokens is None:
            params.max_tokens = room
        elif params.max_tokens > room:
            raise ValidationError(
                f"max_tokens={params.max_tokens} with a prompt of {prompt_len} tokens exceeds "
                f"max_model_len={self.max_model_len}; at most {room} tokens can be generated.",
                parameter="max_tokens", value=params.max_tokens)
        if params.min_tokens > params.max_tokens:
            raise ValidationError(
                f"min_tokens must be less than or equal to max_tokens={params.max_tokens}, "
                f"got {params.min_tokens}.", parameter="min_tokens", value=params.min_tokens)

    def _bad_words(self, words: list[str] | None) -> list[list[int]]:
        """Token sequences of each bad word, with and without a leading space (as vLLM)."""
        seqs: list[list[int]] = []
        for word in words or []:  # SamplingParams makes it a list
            for variant in (word, " " + word.lstrip()):
                ids = self.tokenizer(variant, add_special_tokens=False)["input_ids"]
                if ids and ids not in seqs:
                    seqs.append(ids)
        return seqs
