"""Request fields -> one output constraint: `response_format` and `structured_outputs`.

As the reference (`structured_outputs_from_response_format`): `response_format` json_schema sets
`json`, json_object sets `json_object`, text sets nothing; it overrides the matching field of
`structured_outputs`, and a second kind of constraint beside it is refused. `structured_outputs`
takes vLLM's fields (json, regex, choice, grammar, json_object, disable_any_whitespace,
disable_additional_properties, whitespace_pattern) and our `after_token_ids`. Errors name the
field the user wrote; the engine compiles the grammar and names what the backend can't take.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from workbench.errors import refuse
from workbench.sampling_params import StructuredOutputsParams

_FIELDS = {f.name for f in fields(StructuredOutputsParams)} - {"parameter"}
_BOOLS = ("disable_any_whitespace", "disable_additional_properties")


def from_response_format(response_format: dict[str, Any] | None) -> dict[str, Any]:
    """The constraint fields a `response_format` sets (none for text)."""
    if not response_format:
        return {}
    kind = response_format.get("type", "text")
    if kind == "text":
        return {}
    if kind == "json_object":
        return {"json_object": True}
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict):  # missing: the protocol check already said so
            refuse("response_format.json_schema must be an object with `name` and `schema`.",
                    "response_format", spec)
        if not isinstance(spec.get("name"), str) or not spec["name"]:
            refuse("response_format.json_schema.name is required (a non-empty string).",
                    "response_format", spec.get("name"))
        schema = spec.get("schema", spec.get("json_schema"))
        if not isinstance(schema, (dict, str)):
            refuse("response_format.json_schema.schema must be a JSON schema object.",
                    "response_format", schema)
        return {"json": schema}
    if kind == "structural_tag":
        refuse("response_format type 'structural_tag' is not supported: the structured-output "
                "backend here (llguidance) takes json_schema, json_object or text.",
                "response_format", kind)
    refuse(f"response_format type '{kind}' is not supported; use 'text', 'json_object' or "
            "'json_schema'.", "response_format", kind)
    return {}


def _from_extras(structured: dict[str, Any] | None) -> dict[str, Any]:
    if not structured:
        return {}
    if not isinstance(structured, dict):
        refuse("structured_outputs must be an object.", "structured_outputs", structured)
    if "backend" in structured:
        refuse("structured_outputs.backend cannot be chosen per request: this server uses "
                "llguidance.", "structured_outputs", structured["backend"])
    unknown = sorted(set(structured) - _FIELDS)
    if unknown:
        refuse(f"structured_outputs has unknown field(s) {unknown}; it takes "
                f"{', '.join(sorted(_FIELDS))}.", "structured_outputs", unknown)
    for name in _BOOLS:
        if structured.get(name) is not None and not isinstance(structured[name], bool):
            refuse(f"structured_outputs.{name} must be a boolean.", "structured_outputs",
                    structured[name])
    return {k: v for k, v in structured.items() if v is not None}


def structured_outputs_from_request(request: Any) -> StructuredOutputsParams | None:
    """The request's constraint, or None; `ValidationError` naming the field at fault."""
    extras = _from_extras(getattr(request, "structured_outputs", None))
    override = from_response_format(getattr(request, "response_format", None))
    if not extras and not override:
        return None
    if getattr(request, "use_beam_search", False):
        refuse("Structured outputs are not supported with beam search.",
                "response_format" if override else "structured_outputs")
    values = {**extras, **override}  # response_format wins over the same field
    return StructuredOutputsParams(
        **values, parameter="response_format" if override else "structured_outputs")
