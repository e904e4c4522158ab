"""Exception -> error envelope mapping (reference §4) and message sanitizing."""

from __future__ import annotations

import jinja2
import pytest

from workbench.errors import EngineDeadError, EngineStepError, NotFoundError, ValidationError
from workbench.serving.errors import ENGINE_DEAD_MESSAGE, error_response, sanitize_message


@pytest.mark.parametrize("exc, code, kind, param", [
    (ValidationError("bad", parameter="top_p", value=2), 400, "BadRequestError", "top_p"),
    (NotFoundError("no", parameter="model"), 404, "NotFoundError", "model"),
    (ValueError("v"), 400, "BadRequestError", None),
    (TypeError("t"), 400, "BadRequestError", None),
    (RuntimeError("r"), 400, "BadRequestError", None),
    (OverflowError("o"), 400, "BadRequestError", None),
    (jinja2.TemplateSyntaxError("oops", 1), 400, "BadRequestError", None),
    (NotImplementedError("later"), 501, "NotImplementedError", None),
    (EngineDeadError("dead"), 500, "InternalServerError", None),
    (EngineStepError({"r": "RuntimeError: boom"}), 500, "InternalServerError", None),
    (KeyError("k"), 500, "InternalServerError", None),
])
def test_status_type_and_param(exc, code, kind, param):
    error = error_response(exc).error
    assert (error.code, error.type, error.param) == (code, kind, param)


def test_validation_message_carries_parameter_and_value_like_vllm():
    message = error_response(ValidationError("top_p must be in (0, 1], got 2.0.",
                                             parameter="top_p", value=2.0)).error.message
    assert message == "top_p must be in (0, 1], got 2.0. (parameter=top_p, value=2.0)"
    assert error_response(ValidationError("m", parameter="p")).error.message == "m (parameter=p)"


def test_engine_dead_message():
    assert error_response(EngineDeadError("x")).error.message == ENGINE_DEAD_MESSAGE


def test_an_engine_step_error_keeps_its_cause_in_the_log_not_the_answer():
    answer = error_response(EngineStepError({"r": "RuntimeError: at /work/x.py"})).error
    assert answer.message == "Internal server error"


def test_sanitize_strips_paths_addresses_and_traceback_lines():
    raw = ('Traceback\n  File "/usr/lib/x.py", line 3, in f\n    boom()\n'
           'failed <Obj at 0x7f00aa> reading /home/me/secret/model.bin')
    clean = sanitize_message(raw)
    assert "0x7f" not in clean and "/home" not in clean and 'File "' not in clean
    assert "<path>" in clean
