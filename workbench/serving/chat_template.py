"""Chat templating: OpenAI messages -> the model's prompt text, through its jinja template.

`ChatRenderer.render` flattens content parts to text, parses assistant tool-call arguments,
maps `developer` to `system` when the template does not know it, merges template kwargs
(server defaults < request `chat_template_kwargs` < explicit fields), drops kwargs the
template never reads, and refuses a request-supplied template unless the server trusts them.
A render is bounded by `render_timeout` seconds (`offload.render_deadline`): past it, a 400.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from workbench.errors import ValidationError
from workbench.serving.offload import RenderTimeout, render_deadline

logger = logging.getLogger("workbench.serving")

UNTRUSTED_TEMPLATE = ("Chat template is passed with request, but --trust-request-chat-template "
                      "is not set. Refused request with untrusted chat template.")
NO_TEMPLATE = ("As of transformers v4.44, default chat template is no longer allowed, so you must "
               "provide a chat template if the tokenizer does not define one.")
_TEXT_PARTS = ("text", "input_text", "output_text", "refusal")
UNRENDERED_TOOLS = (
    "The chat template does not render `tools`: the model is not shown the tools' "
    "definitions (required and named tool choices are still enforced by constrained decoding, "
    "but the model fills them in blind: SmolLM2 answers get_time(city=\"kyo\") for Tokyo). "
    "Start the server with a template that renders them (for SmolLM2: --chat-template "
    "workbench/serving/chat_templates/smollm2_tools.jinja).")


@dataclass(frozen=True)
class RenderedChat:
    prompt: str  # the templated prompt text
    conversation: list[dict[str, Any]]  # the messages as the template saw them


def content_text(content: str | list[dict[str, Any]] | None) -> str | None:
    """Joins text content parts with newlines (vLLM's "string" content format); a null
    content renders as the empty string."""
    if content is None or isinstance(content, str):
        return content
    texts = []
    for part in content:
        kind = part.get("type", "text" if "text" in part else None)
        if kind not in _TEXT_PARTS:
            raise ValidationError(f"Content part type '{kind}' is not supported: the served "
                                  "model is text-only.", parameter="messages")
        texts.append(part.get("refusal") if kind == "refusal" else part.get("text", ""))
    return "\n".join(t or "" for t in texts)


def _tool_calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Assistant tool-call arguments arrive as JSON strings; templates expect dicts."""
    parsed = []
    for call in calls:
        call = dict(call)
        function = dict(call.get("function") or {})
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                function["arguments"] = json.loads(arguments)
            except json.JSONDecodeError:
                logger.warning("tool call arguments are not valid JSON; passing {} to the template")
                function["arguments"] = {}
        call["function"] = function
        parsed.append(call)
    return parsed


def to_conversation(messages: list[Any], template: str) -> list[dict[str, Any]]:
    conversation = []
    knows_developer = "developer" in template
    for message in messages:
        item: dict[str, Any] = {"role": message.role, "content": content_text(message.content) or ""}
        if message.role == "developer" and not knows_developer:
            item["role"] = "system"
        for name in ("name", "tool_call_id", "reasoning"):
            if getattr(message, name) is not None:
                item[name] = getattr(message, name)
        if message.tool_calls:
            item["tool_calls"] = _tool_calls(message.tool_calls)
        conversation.append(item)
    return conversation


def template_variables(template: str) -> set[str] | None:
    """Names the template reads; None when jinja cannot parse it (then nothing is filtered)."""
    # deferred: jinja2 costs ~45 ms at import, and only this parse of a template needs it
    import jinja2.meta
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"])
    try:
        return set(jinja2.meta.find_undeclared_variables(env.parse(template)))
    except Exception:  # noqa: BLE001 - HF templates may use tags plain jinja lacks
        return None


def effective_kwargs(defaults: dict[str, Any], request_kwargs: dict[str, Any] | None
                     ) -> dict[str, Any]:
    """The template kwargs in effect: the server's `--default-chat-template-kwargs`, then the
    request's `chat_template_kwargs` (vLLM's order; the renderer and the reasoning parsers,
    which read `enable_thinking`, both use it)."""
    return {**defaults, **(request_kwargs or {})}


class ChatRenderer:
    """Renders chat requests for one tokenizer under one server configuration."""

    render_timeout: float | None = 10.0  # seconds one render may take

    def __init__(self, tokenizer: Any, *, chat_template: str | None = None,
                 trust_request_chat_template: bool = False,
                 default_chat_template_kwargs: dict[str, Any] | None = None):
        self.tokenizer = tokenizer
        self.server_template = chat_template
        self.trusted = trust_request_chat_template
        self.default_kwargs = dict(default_chat_template_kwargs or {})
        self._variables: dict[str, set[str] | None] = {}
        self._warned: set[str] = set()  # templates whose unrendered tools were logged

    @classmethod
    def for_server(cls, tokenizer: Any, config: Any) -> ChatRenderer:
        """The renderer under a `ServerConfig`'s chat template, its trust in a request's own
        and its default template kwargs."""
        return cls(tokenizer, chat_template=config.chat_template,
                   trust_request_chat_template=config.trust_request_chat_template,
                   default_chat_template_kwargs=config.default_chat_template_kwargs)

    def resolve_template(self, request_template: str | None,
                         kwargs: dict[str, Any] | None = None) -> str:
        kwargs_template = (kwargs or {}).get("chat_template")
        if (request_template or kwargs_template) and not self.trusted:
            raise ValidationError(UNTRUSTED_TEMPLATE, parameter="chat_template")
        template = (request_template or kwargs_template or self.server_template
                    or getattr(self.tokenizer, "chat_template", None))
        if not template:
            raise ValidationError(NO_TEMPLATE, parameter="chat_template")
        return template

    def reads(self, template: str, name: str) -> bool | None:
        """Whether `template` reads the variable `name` (None: jinja cannot parse it)."""
        if template not in self._variables:
            self._variables[template] = template_variables(template)
        known = self._variables[template]
        return None if known is None else name in known

    def template_kwargs(self, template: str, request_kwargs: dict[str, Any] | None,
                        explicit: dict[str, Any]) -> dict[str, Any]:
        merged = effective_kwargs(self.default_kwargs, request_kwargs)
        merged.update({k: v for k, v in explicit.items() if v is not None})
        merged.pop("chat_template", None)
        self.reads(template, "")
        known = self._variables[template]
        if known is None:
            return merged
        return {k: v for k, v in merged.items() if k in known}

    def render(self, messages: list[Any], *, add_generation_prompt: bool = True,
               continue_final_message: bool = False, chat_template: str | None = None,
               chat_template_kwargs: dict[str, Any] | None = None,
               tools: list[dict[str, Any]] | None = None, documents: list[dict] | None = None,
               reasoning_effort: str | None = None) -> RenderedChat:
        template = self.resolve_template(chat_template, chat_template_kwargs)
        conversation = to_conversation(messages, template)
        explicit: dict[str, Any] = {"reasoning_effort": reasoning_effort}
        if reasoning_effort is not None and "enable_thinking" not in (chat_template_kwargs or {}):
            explicit["enable_thinking"] = reasoning_effort != "none"
        kwargs = self.template_kwargs(template, chat_template_kwargs, explicit)
        if tools and self.reads(template, "tools") is False and template not in self._warned:
            self._warned.add(template)  # once a template: every request of it would say it
            logger.warning(UNRENDERED_TOOLS)
        try:
            with render_deadline(self.render_timeout):
                prompt = self.tokenizer.apply_chat_template(
                    conversation, chat_template=template, tools=tools, documents=documents,
                    add_generation_prompt=add_generation_prompt,
                    continue_final_message=continue_final_message, tokenize=False, **kwargs)
        except RenderTimeout as exc:
            given = chat_template or (chat_template_kwargs or {}).get("chat_template")
            raise ValidationError(
                f"Rendering the chat template took too long: {exc}. Shorten the messages or "
                "simplify the template.", parameter="chat_template" if given else "messages"
            ) from None
        return RenderedChat(prompt=prompt, conversation=conversation)
