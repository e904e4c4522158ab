"""Chat templating with the real SmolLM2 tokenizer (ChatML template)."""

from __future__ import annotations

import pytest

from workbench.errors import ValidationError
from workbench.serving.chat_template import (
    NO_TEMPLATE,
    UNTRUSTED_TEMPLATE,
    ChatRenderer,
    content_text,
    template_variables,
)
from workbench.serving.protocol import ChatMessageParam


def msgs(*items):
    return [ChatMessageParam(**m) for m in items]


def test_renders_chatml_with_generation_prompt(tokenizer):
    prompt = ChatRenderer(tokenizer).render(msgs({"role": "user", "content": "Hi"})).prompt
    assert prompt.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_continue_final_message_leaves_it_open(tokenizer):
    prompt = ChatRenderer(tokenizer).render(
        msgs({"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hel"}),
        add_generation_prompt=False, continue_final_message=True).prompt
    assert prompt.endswith("<|im_start|>assistant\nHel")


def test_content_parts_are_joined_with_newlines():
    assert content_text([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]) == "a\nb"


def test_non_text_parts_are_refused():
    with pytest.raises(ValidationError, match="'image_url' is not supported") as info:
        content_text([{"type": "image_url", "image_url": {"url": "x"}}])
    assert info.value.parameter == "messages"


def test_developer_becomes_system_when_the_template_does_not_know_it(tokenizer):
    rendered = ChatRenderer(tokenizer).render(msgs({"role": "developer", "content": "Be brief"},
                                                   {"role": "user", "content": "Hi"}))
    assert rendered.conversation[0]["role"] == "system"
    assert "<|im_start|>system\nBe brief" in rendered.prompt


def test_request_template_refused_unless_trusted(tokenizer):
    with pytest.raises(ValidationError) as info:
        ChatRenderer(tokenizer).render(msgs({"role": "user", "content": "x"}), chat_template="{{ 1 }}")
    assert (info.value.message, info.value.parameter) == (UNTRUSTED_TEMPLATE, "chat_template")
    with pytest.raises(ValidationError, match="untrusted chat template"):
        ChatRenderer(tokenizer).render(msgs({"role": "user", "content": "x"}),
                                       chat_template_kwargs={"chat_template": "{{ 1 }}"})
    trusted = ChatRenderer(tokenizer, trust_request_chat_template=True)
    template = "{% for m in messages %}[{{ m.content }}]{% endfor %}"
    assert trusted.render(msgs({"role": "user", "content": "x"}), chat_template=template).prompt == "[x]"


def test_kwargs_merge_server_defaults_under_request_and_drop_unknown(tokenizer):
    template = "{{ greeting }}|{{ name }}|{% for m in messages %}{{ m.content }}{% endfor %}"
    renderer = ChatRenderer(tokenizer, chat_template=template,
                            default_chat_template_kwargs={"greeting": "hello", "name": "server"})
    kwargs = renderer.template_kwargs(template, {"name": "request", "unused": 1}, {})
    assert kwargs == {"greeting": "hello", "name": "request"}
    assert renderer.render(msgs({"role": "user", "content": "x"}),
                           chat_template_kwargs={"name": "req"}).prompt == "hello|req|x"


def test_tool_call_arguments_are_parsed_for_the_template(tokenizer):
    rendered = ChatRenderer(tokenizer).render(msgs(
        {"role": "user", "content": "w?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}},
            {"id": "2", "type": "function", "function": {"name": "g", "arguments": "{bad"}}]}))
    calls = rendered.conversation[1]["tool_calls"]
    assert [c["function"]["arguments"] for c in calls] == [{"a": 1}, {}]


def test_no_template_at_all_is_refused(tokenizer):
    renderer = ChatRenderer(tokenizer)
    renderer.tokenizer = type("T", (), {"chat_template": None})()
    with pytest.raises(ValidationError) as info:
        renderer.resolve_template(None)
    assert info.value.message == NO_TEMPLATE


def test_template_variables():
    assert template_variables("{{ a }}{% for m in messages %}{{ b }}{% endfor %}") == \
        {"a", "b", "messages"}


def test_tools_a_template_does_not_render_are_said_once(tokenizer, caplog):
    """SmolLM2's own template ignores `tools`: the model would not see them, so the server
    says so (once a template), naming the template that renders them."""
    import logging

    from workbench.serving.chat_template import UNRENDERED_TOOLS
    from workbench.serving.chat_tools import TOOLS_TEMPLATE

    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    renderer = ChatRenderer(tokenizer)
    with caplog.at_level(logging.WARNING, logger="workbench.serving"):
        for _ in range(2):
            renderer.render(msgs({"role": "user", "content": "Hi"}), tools=tools)
    assert [r.getMessage() for r in caplog.records].count(UNRENDERED_TOOLS) == 1
    assert "smollm2_tools.jinja" in UNRENDERED_TOOLS
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="workbench.serving"):
        prompt = ChatRenderer(tokenizer, chat_template=TOOLS_TEMPLATE.read_text()).render(
            msgs({"role": "user", "content": "Hi"}), tools=tools).prompt
        ChatRenderer(tokenizer).render(msgs({"role": "user", "content": "Hi"}))  # no tools
    assert "get_time" in prompt and not caplog.records
