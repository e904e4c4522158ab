"""The calculator tool and the tool server: arithmetic only, every hostile input a ToolError."""

from __future__ import annotations

import pytest

from workbench.tools import Calculator, LocalToolServer, ToolError, default_tool_server, evaluate


@pytest.mark.parametrize("expression, value", [
    ("1 + 2 * 3", 7), ("(1 + 2) * 3", 9), ("7 / 2", 3.5), ("7 // 2", 3), ("7 % 3", 1),
    ("2 ** 10", 1024), ("-3 ** 2", -9), ("+4 - -4", 8), ("2 ** -1", 0.5), ("1.5 * 4", 6.0),
    ("3 ** 2 ** 2", 81), ("10 ** 1000 // 10 ** 999", 10),
])
def test_arithmetic(expression, value):
    assert evaluate(expression) == value


@pytest.mark.parametrize("expression, reason", [
    ("__import__('os')", "Call is not allowed"),
    ("__import__('os').system('echo pwned')", "not allowed"),
    ("open('/etc/passwd').read()", "not allowed"),
    ("().__class__.__bases__[0].__subclasses__()", "not allowed"),
    ("x + 1", "names are not allowed"),
    ("'a' * 3", "only numbers"),
    ("True + 1", "only numbers"),
    ("1j * 2", "only numbers"),
    ("lambda: 1", "Lambda is not allowed"),
    ("[1] * 10", "List is not allowed"),
    ("1 if 1 else 2", "IfExp is not allowed"),
    ("1 < 2", "Compare is not allowed"),
    ("9 ** 9 ** 9", "too large"),
    ("2 ** 100000", "too large"),
    ("10 ** 5000", "too large"),
    ("(2 ** 4000) * (2 ** 4000)", "too large"),
    ("2.0 ** 5000", "too large"),
    ("2 ** 1e9", "too large"),
    ("1e308 * 10", "too large"),
    ("(-8) ** 0.5", "not a real number"),
    ("1 / 0", "division by zero"), ("1 % 0", "division by zero"), ("0 ** -1", "negative power"),
    ("(" * 40 + "1" + " + 1)" * 40, "nested too deeply"),
    ("(" * 300 + "1" + ")" * 300, "too long"),
    ("-" * 100 + "1", "nested too deeply"),
    ("1" + " + 1" * 150, "too long"),
    ("1" * 600, "too long"),
    ("2 +", "not an arithmetic expression"),
    ("import os", "not an arithmetic expression"),
    ("", "not an arithmetic expression"),
])
def test_hostile_or_oversized_input_is_a_tool_error(expression, reason):
    with pytest.raises(ToolError, match=reason):
        evaluate(expression)


def test_redundant_parentheses_are_harmless():
    assert evaluate("(" * 200 + "1" + ")" * 200) == 1  # no nodes, no depth


def test_tool_server_calls_by_name_with_json_arguments():
    server = default_tool_server()
    assert [spec.name for spec in server.list_tools()] == ["calculator"]
    assert server.has_tool("calculator") and not server.has_tool("python")
    assert server.call("calculator", '{"expression": "6 * 7"}') == "42"
    assert server.call("calculator", {"expression": 2.5}) == "2.5"
    spec = server.spec("calculator").as_function()
    assert spec["function"]["parameters"]["required"] == ["expression"]


@pytest.mark.parametrize("arguments, reason", [
    ("not json", "not valid JSON"), ("[1, 2]", "must be a JSON object"),
    ("{}", "missing argument 'expression'"), ('{"expression": ["1"]}', "must be a string"),
])
def test_bad_arguments_are_tool_errors(arguments, reason):
    with pytest.raises(ToolError, match=reason):
        default_tool_server().call("calculator", arguments)


def test_unknown_tool_is_a_tool_error():
    with pytest.raises(ToolError, match="unknown tool 'python'; available: calculator"):
        LocalToolServer([Calculator()]).call("python", "{}")
