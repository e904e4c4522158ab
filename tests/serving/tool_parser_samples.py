"""Real-looking outputs of each tool-call format, with the calls a parser must find in them.

Each sample: (parser name, model output, expected content, [(name, arguments dict), ...]).
Outputs follow the models' own formats (Hermes / Qwen2.5, Llama 3.1, Mistral v11 and v3,
Llama 4 pythonic, Qwen3-Coder), including the shapes users report breaking in the reference:
empty arguments before another call, nested objects, escaped quotes, unicode, `}` inside
strings, arguments as a JSON string, missing closing tags.
"""

from __future__ import annotations

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                     "metric": {"type": "boolean"},
                                     "hours": {"type": "array"}, "ratio": {"type": "number"}},
    "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {}}}}

SAMPLES = [
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n'
               "</tool_call>", None, [("get_weather", {"city": "Paris", "days": 3})]),
    ("hermes", "I'll look that up for you.\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": "
               '{}}\n</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": '
               '"S\\u00e3o \\"Paulo\\"", "hours": [1, 2, {"a": "}"}]}}\n</tool_call>',
     "I'll look that up for you.\n",
     [("get_time", {}), ("get_weather", {"city": 'São "Paulo"', "hours": [1, 2, {"a": "}"}]})]),
    ("hermes", '<tool_call>{"arguments":{"city":"Zürich","metric":true},"name":"get_weather"}',
     None, [("get_weather", {"city": "Zürich", "metric": True})]),
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}\n'
               "</tool_call>", None, [("get_weather", {"city": "Oslo"})]),
    ("hermes", "The weather in Paris is sunny, no <tool_ call needed.",
     "The weather in Paris is sunny, no <tool_ call needed.", []),
    ("llama3_json", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
     None, [("get_weather", {"city": "Paris"})]),
    ("llama3_json", '{"name": "get_time", "parameters": {}}; {"name": "get_weather", '
                    '"parameters": {"city": "Rome", "ratio": -1.5e3}}',
     None, [("get_time", {}), ("get_weather", {"city": "Rome", "ratio": -1.5e3})]),
    ("llama3_json", "Paris is the capital of France.", "Paris is the capital of France.", []),
    ("llama3_json", '{"answer": 42}', '{"answer": 42}', []),
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 2}',
     None, [("get_weather", {"city": "Paris", "days": 2})]),
    ("mistral", 'Sure.[TOOL_CALLS]get_time[ARGS]{}[TOOL_CALLS]get_weather[ARGS]{"city": "Lyon"}',
     "Sure.", [("get_time", {}), ("get_weather", {"city": "Lyon"})]),
    ("mistral", '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Nice"}}, '
                '{"name": "get_time", "arguments": {}}]',
     None, [("get_weather", {"city": "Nice"}), ("get_time", {})]),
    ("mistral", "No tools needed [here].", "No tools needed [here].", []),
    ("pythonic", '[get_weather(city="Paris", days=3, metric=True), get_time()]',
     None, [("get_weather", {"city": "Paris", "days": 3, "metric": True}), ("get_time", {})]),
    ("pythonic", "[get_weather(city='it\\'s \"x\"', hours=[1, (2, 3)], ratio=None)]",
     None, [("get_weather", {"city": "it's \"x\"", "hours": [1, [2, 3]], "ratio": None})]),
    ("pythonic", "[1] is a citation, not a call.", "[1] is a citation, not a call.", []),
    ("pythonic", "The answer is 4.", "The answer is 4.", []),
    ("qwen3_xml", "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n"
                  "<parameter=days>\n5\n</parameter>\n<parameter=metric>\nfalse\n</parameter>\n"
                  "</function>\n</tool_call>",
     None, [("get_weather", {"city": "New York", "days": 5, "metric": False})]),
    ("qwen3_xml", "Checking both.\n<tool_call>\n<function=get_time>\n</function>\n</tool_call>\n"
                  "<tool_call>\n<function=get_weather>\n<parameter=city>\n<b>Bern</b>\n</parameter>"
                  "\n<parameter=hours>\n[9, 12]\n</parameter>\n<parameter=ratio>\n0.5\n"
                  "</parameter>\n</function>\n</tool_call>",
     "Checking both.\n",
     [("get_time", {}), ("get_weather", {"city": "<b>Bern</b>", "hours": [9, 12], "ratio": 0.5})]),
    ("qwen3_xml", "Plain <answer> with a < sign.", "Plain <answer> with a < sign.", []),
    ("granite", '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Boston"}}, '
                '{"name": "get_time", "arguments": {}}]',
     None, [("get_weather", {"city": "Boston"}), ("get_time", {})]),
    ("granite", 'Here you go.<tool_call>[{"name": "get_time", "arguments": {}}]',
     "Here you go.", [("get_time", {})]),
    ("jamba", '<tool_calls>[{"name": "get_weather", "arguments": {"city": "Lima", "days": 1}}]'
              "</tool_calls>", None, [("get_weather", {"city": "Lima", "days": 1})]),
    ("jamba", "I can answer directly: <tool_calls> is a tag.",
     "I can answer directly: <tool_calls> is a tag.", []),
    ("phi4_mini_json", 'functools[{"name": "get_weather", "arguments": {"city": "Kyiv"}}]',
     None, [("get_weather", {"city": "Kyiv"})]),
    ("phi4_mini_json", "Use the functools module.", "Use the functools module.", []),
]
