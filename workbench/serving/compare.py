"""Comparing variants of the model on the same tokens: `POST /v1/compare` and `LLM.compare`.

A text after a prompt is teacher-forced through each variant (the base model, a LoRA adapter,
interventions, or both) as one scoring request per variant: the prompt's tokens then the
text's, `prompt_logprobs`, and `prompt_distributions_from` at the text's first token, so the
engine keeps each scored position's whole next-token distribution (float32 over the full
vocabulary, from the same logits as the logprobs). All variants are queued under one hold of
the engine's lock (`generate_together`), so they run in the same steps. Then, per position and
per variant, exactly: the logprob and rank of the forced token, the argmax token, the entropy,
KL(reference || variant) and KL(variant || reference) over the whole vocabulary (summed in
float64). `comparison_body` builds the answer's JSON from the engine outputs; the offline
`LLM.compare` builds the same body, and `workbench.inspect.model_compare.ModelComparison`
reads it. The distributions themselves never go over the wire.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from workbench.errors import ValidationError
from workbench.sampling_params import RequestOutputKind, SamplingParams
from workbench.serving.base import EngineServing, RequestMeta, unique_engine_id
from workbench.serving.chat_template import ChatRenderer
from workbench.serving.protocol.compare import CompareRequest

MAX_DISTRIBUTIONS_MB = 512  # the kept float32 rows of one comparison, all variants together


@dataclass
class Variant:
    """One variant as the engine runs it: its column name, served model name, adapter
    (`LoRARequest` or None) and interventions (None: none)."""

    name: str
    model: str
    lora_request: Any = None
    interventions: list[Any] | None = None


def variant_name(name: str | None, model: str, interventions: Any) -> str:
    """A variant's default column name: the model's, with "+ interventions" when it has any."""
    if name:
        return name
    return f"{model} + interventions" if interventions else model


def check_variants(variants: Sequence[Variant], reference: int) -> None:
    """At least two, distinct names, a reference among them."""
    if len(variants) < 2:
        raise ValidationError("A comparison needs at least two variants.", parameter="variants",
                              value=len(variants))
    names = [v.name for v in variants]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValidationError(f"Variant names must differ (they name the table's columns): "
                              f"{repeated} repeat; give each a `name`.", parameter="variants",
                              value=repeated)
    if not isinstance(reference, int) or not 0 <= reference < len(variants):
        raise ValidationError(f"reference must be the index of a variant (0..{len(variants) - 1}"
                              f"), got {reference!r}.", parameter="reference", value=reference)


def scored_ids(tokenizer: Any, prompt: str, text: str) -> tuple[list[int], int]:
    """(the prompt's tokens then the text's, the index of the text's first token), tokenized
    as `score_text` does: the prompt with special tokens, the text without."""
    context = list(tokenizer(prompt)["input_ids"])
    scored = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    if not context:
        raise ValidationError("The prompt has no tokens: the text's first token has nothing to "
                              "be predicted from.", parameter="prompt", value=prompt)
    if not scored:
        raise ValidationError("The text to compare on has no tokens.", parameter="text",
                              value=text)
    return context + scored, len(context)


def turn_ids(renderer: Any, tokenizer: Any, messages: list[Any],
             chat_template_kwargs: dict[str, Any] | None = None) -> tuple[list[int], int]:
    """(the whole conversation's tokens, the index of its last turn's first token), as
    `score_chat` tells them apart: the conversation before the turn rendered with the
    generation prompt, then the whole; the last message must be the assistant's."""
    if len(messages) < 2 or _role(messages[-1]) != "assistant":
        raise ValidationError("A chat comparison scores the last message: it must be the "
                              "assistant's, after at least one other.", parameter="messages")

    def ids(conv: list[Any], generation_prompt: bool) -> list[int]:
        text = renderer.render(conv, add_generation_prompt=generation_prompt,
                               chat_template_kwargs=chat_template_kwargs).prompt
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    before, whole = ids(list(messages[:-1]), True), ids(list(messages), False)
    if whole[:len(before)] != before or len(whole) == len(before):
        raise ValidationError("The chat template renders the conversation before the last turn "
                              "as something the whole conversation does not start with (or the "
                              "turn renders to no tokens).", parameter="messages")
    return whole, len(before)


def _role(message: Any) -> Any:
    return message.get("role") if isinstance(message, dict) else getattr(message, "role", None)


def compare_params(start: int, num_tokens: int, vocab_size: int,
                   interventions: list[Any] | None, num_variants: int) -> SamplingParams:
    """A variant's engine request: the prompt's logprobs and whole distributions from `start`
    on, one greedy token (dropped); refuses a comparison whose kept rows would pass
    `MAX_DISTRIBUTIONS_MB`."""
    size = (num_tokens - start) * vocab_size * 4 * num_variants
    if size > MAX_DISTRIBUTIONS_MB * 2**20:
        raise ValidationError(f"Comparing {num_tokens - start} tokens over {num_variants} variants "
                              f"keeps {size / 2**20:.0f} MiB of distributions, over "
                              f"{MAX_DISTRIBUTIONS_MB} MiB: compare a shorter text or fewer "
                              "variants.", parameter="text", value=num_tokens - start)
    p = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0,
                       prompt_distributions_from=start, interventions=interventions)
    p.output_kind = RequestOutputKind.FINAL_ONLY
    return p


def divergences(reference: torch.Tensor, other: torch.Tensor) -> dict[str, list[float | None]]:
    """Per row of two log-probability tensors [n, V]: KL(reference || other), KL(other ||
    reference), the other's entropy, in nats, summed in float64 (zero-probability terms are 0)."""
    ref, oth = reference.double(), other.double()  # [n, V]
    p, q = ref.exp(), oth.exp()
    kl = torch.where(p > 0, p * (ref - oth), 0.0).sum(-1)  # [n]
    kl_reverse = torch.where(q > 0, q * (oth - ref), 0.0).sum(-1)
    entropy = torch.where(q > 0, -q * oth, 0.0).sum(-1)
    return {"kl": _floats(kl), "kl_reverse": _floats(kl_reverse), "entropy": _floats(entropy)}


def _floats(values: torch.Tensor) -> list[float | None]:
    """Plain floats; a non-finite one (an infinite KL) as None, which JSON can carry."""
    return [v if math.isfinite(v) else None for v in values.tolist()]


def comparison_body(outputs: Sequence[Any], variants: Sequence[Variant], token_ids: list[int],
                    start: int, reference: int, model: str, text_of: Any) -> dict[str, Any]:
    """The comparison's JSON (see the module docstring) from each variant's `RequestOutput`
    (with `prompt_distributions`); `text_of(token_id)` is a token's text."""
    scored = token_ids[start:]
    dists = [out.prompt_distributions for out in outputs]
    for v, d in zip(variants, dists):
        if d is None or len(d) != len(scored):
            raise RuntimeError(f"The engine kept no distributions for variant {v.name!r}.")
    ref = dists[reference]
    rows = []
    for v, out, dist in zip(variants, outputs, dists):
        entries = [out.prompt_logprobs[start + i][t] for i, t in enumerate(scored)]
        argmax = dist.argmax(-1).tolist()
        rows.append({"name": v.name, "model": v.model,
                     "interventions": len(v.interventions) if v.interventions else 0,
                     "logprobs": [e.logprob for e in entries],
                     "ranks": [e.rank for e in entries], "argmax_ids": argmax,
                     "argmax_tokens": [text_of(t) for t in argmax], **divergences(ref, dist)})
    return {"object": "comparison", "model": model, "reference": reference,
            "prompt_tokens": start, "token_ids": scored,
            "tokens": [text_of(t) for t in scored],
            "kl_available": True, "kl_unavailable_reason": None, "variants": rows}


class CompareServing(EngineServing):
    """`POST /v1/compare`: a `CompareRequest` -> the comparison body (see the module
    docstring); names are checked as completions checks them (404 for an unknown model)."""

    supports_lora = True

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.renderer = ChatRenderer.for_server(self.tokenizer, self.config)

    def prepare(self, request: CompareRequest
                ) -> tuple[list[Variant], list[SamplingParams], list[int], int]:
        """The variants, their params, the token ids and the text's start (off the loop)."""
        self.check_model(request.model)
        base = request.model or self.model_name
        variants = []
        for i, given in enumerate(request.variants):
            model = given.model or base
            try:
                self.check_model(model)
            except Exception as exc:  # noqa: BLE001 - the same refusal, naming the variant
                exc.parameter = f"variants[{i}].model"  # type: ignore[attr-defined]
                raise
            lora = None
            if model not in self.served_model_names and self.adapters is not None:
                lora = self.adapters.adapter_for(model)
            variants.append(Variant(variant_name(given.name, model, given.interventions),
                                    model, lora, given.interventions or None))
        check_variants(variants, request.reference)
        if request.messages is not None:
            ids, start = turn_ids(self.renderer, self.tokenizer, request.messages,
                                  request.chat_template_kwargs)
        else:
            assert request.prompt is not None and request.text is not None  # the validator's
            ids, start = scored_ids(self.tokenizer, request.prompt, request.text)
        if len(ids) + 1 > self.max_model_len:
            raise ValidationError(f"The prompt and text are {len(ids)} tokens; with the one "
                                  f"generated token that is over this model's context of "
                                  f"{self.max_model_len}.", parameter="text", value=len(ids))
        shape = getattr(self.engine, "model_shape", None)
        params = []
        for i, v in enumerate(variants):
            try:
                p = compare_params(start, len(ids), self.engine.vocab_size, v.interventions,
                                   len(variants))
                if shape is not None:  # resolved once: the engine reuses it
                    p.resolve_inside(shape, len(ids) + 1)
            except ValidationError as exc:
                if exc.parameter and exc.parameter.startswith("interventions"):
                    exc.parameter = f"variants[{i}].{exc.parameter}"
                raise
            params.append(p)
        return variants, params, ids, start

    async def create(self, request: CompareRequest, meta: RequestMeta | None = None
                     ) -> dict[str, Any]:
        variants, params, ids, start = await self.cpu.run(self.prepare, request)
        base_id = self.base_request_id(meta or RequestMeta(), request.request_id)
        engine_id = unique_engine_id(f"cmp-{base_id}")
        outputs = await self.engine.generate_together(
            [(f"{engine_id}-{i}", {"prompt_token_ids": ids}, p, v.lora_request)
             for i, (v, p) in enumerate(zip(variants, params))])
        failed = [o.error for o in outputs if o.error is not None]
        if failed:
            raise RuntimeError(f"The engine failed a variant: {failed[0]}")
        texts = _TokenTexts(self.tokenizer)
        return comparison_body(outputs, variants, ids, start, request.reference,
                               request.model or self.model_name, texts)


class _TokenTexts:
    """A token's text, as `Logprob.decoded_token` spells it."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer

    def __call__(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False,
                                     clean_up_tokenization_spaces=False)
