"""`compare` / `compare_chat`: one text teacher-forced through variants of the model.

A `ComparePlan` holds the variants (`workbench.serving.compare.Variant`: column name, served
model, adapter, interventions), the compared tokens (a `ScoredSpan`: the prompt's, then the
text's), the reference and the base model's name, and runs one of two ways:

- on an engine (`LLM.compare`): one request per variant, all in one batch, with `params` (the
  prompt's logprobs and whole distributions from the text's first token); `assemble` gives the
  exact comparison (`serving.compare.comparison_body`, as `/v1/compare` answers);
- on a server that is not ours (`Workbench.compare` against vLLM; its variants:
  `variants_of_body`): one completions request of prompt logprobs per variant (`bodies`); `assemble_tables` gives logprobs, ranks and argmax
  tokens exact and KL marked unavailable with the reason (never approximated).

(`Workbench.compare` against ours, or in the kernel, sends the whole comparison as one
`/v1/compare` request: `workbench_variant` says each variant as that body's field.) What a
variant may be, per facade: `offline_variant` (`LLM`), `workbench_variant` (`Workbench`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from workbench.errors import ValidationError
from workbench.inspect.model_compare import ModelComparison, body_from_tables
from workbench.inspect.scoring import ScoredSpan, score_body, scored_table
from workbench.lora.request import LoRARequest
from workbench.sampling_params import SamplingParams
from workbench.serving import compare as cmp

__all__ = ["ComparePlan", "offline_variant", "variants_of_body", "workbench_variant"]


def offline_variant(given: Any, base: str) -> cmp.Variant:
    """An offline comparison's variant: None (the base model), a `LoRARequest`, or a dict
    of `lora_request`, `interventions`, `name`."""
    if given is None or isinstance(given, LoRARequest):
        given = {"lora_request": given}
    if not isinstance(given, dict):
        raise TypeError("A variant is None (the base model), a LoRARequest or a dict of "
                        f"lora_request, interventions, name; got {type(given).__name__}.")
    unknown = set(given) - {"lora_request", "interventions", "name"}
    if unknown:
        raise ValidationError(f"A variant takes lora_request, interventions, name; got "
                              f"{sorted(unknown)}.", parameter="variants", value=sorted(unknown))
    lora = given.get("lora_request")
    model = lora.lora_name if lora is not None else base
    interventions = given.get("interventions") or None
    return cmp.Variant(cmp.variant_name(given.get("name"), model, interventions), model, lora,
                       interventions)


def workbench_variant(variant: Any, index: int, served_name: Callable[[LoRARequest], str]
                      ) -> dict[str, Any]:
    """A `Workbench` comparison's variant as a `/v1/compare` body's entry: None (the base
    model), a served model or adapter name, a `LoRARequest` (`served_name` serves it), or a
    dict of `model` (or `lora_request`), `interventions`, `name`."""
    if variant is None:
        return {}
    if isinstance(variant, str):
        return {"model": variant}
    if isinstance(variant, LoRARequest):
        return {"model": served_name(variant)}
    if isinstance(variant, dict):
        out = dict(variant)
        lora = out.pop("lora_request", None)
        if lora is not None:
            out["model"] = served_name(lora)
        return out
    raise ValidationError(f"variants[{index}]: None, a model name, a LoRARequest or a dict "
                          f"of model, interventions, name; got {type(variant).__name__}.",
                          parameter=f"variants[{index}]")


def variants_of_body(body: dict[str, Any], model: str, where: str) -> list[cmp.Variant]:
    """The variants of a `/v1/compare` body for a server that is not ours (`where`):
    interventions refused, each named by its model; checked as `ComparePlan.of` checks them."""
    for i, v in enumerate(body["variants"]):
        if v.get("interventions"):
            raise ValidationError(
                f"variants[{i}].interventions need a workbench server: {where} is "
                "not one, and an OpenAI-compatible server such as vLLM ignores them; "
                "nothing was sent.", parameter=f"variants[{i}].interventions")
    variants = [cmp.Variant(cmp.variant_name(v.get("name"), v.get("model") or model, None),
                            v.get("model") or model) for v in body["variants"]]
    cmp.check_variants(variants, body["reference"])
    return variants


@dataclass(frozen=True)
class ComparePlan:
    """A comparison of `variants` on `span`'s text (see the module docstring)."""

    variants: list[cmp.Variant]
    span: ScoredSpan
    reference: int
    model: str  # the base model's served name

    @classmethod
    def of(cls, variants: list[cmp.Variant], span: ScoredSpan, reference: int, model: str
           ) -> "ComparePlan":
        """Refuses fewer than two variants, repeated names, or a reference out of range."""
        cmp.check_variants(variants, reference)
        return cls(variants, span, reference, model)

    @property
    def token_ids(self) -> list[int]:
        return self.span.token_ids

    def params(self, vocab_size: int) -> list[SamplingParams]:
        """Each variant's engine request (refused where the kept distributions would pass
        `serving.compare.MAX_DISTRIBUTIONS_MB`)."""
        return [cmp.compare_params(self.span.start, len(self.token_ids), vocab_size,
                                   v.interventions, len(self.variants)) for v in self.variants]

    def assemble(self, outputs: Sequence[Any], text_of: Callable[[int], str]
                 ) -> ModelComparison:
        """The exact comparison from each variant's `RequestOutput` (with its distributions)."""
        return ModelComparison.from_body(cmp.comparison_body(
            outputs, self.variants, self.token_ids, self.span.start, self.reference,
            self.model, text_of))

    def bodies(self) -> list[dict[str, Any]]:
        """Each variant's completions request of top-1 prompt logprobs (vLLM's fields)."""
        return [{**score_body([self.span], 1, token_stats=False), "model": v.model}
                for v in self.variants]

    def assemble_tables(self, responses: Sequence[dict[str, Any]], reason: str
                        ) -> dict[str, Any]:
        """The comparison body from each variant's completions answer to `bodies`: KL
        unavailable, `reason` says why."""
        tables = [scored_table(r, self.span) for r in responses]
        return body_from_tables(tables, [v.name for v in self.variants],
                                [v.model for v in self.variants], self.span.token_ids,
                                self.span.start, self.reference, self.model, reason)
