"""`ServeContext`: a later stage reading a part no earlier stage set is a pipeline bug."""

from __future__ import annotations

import pytest

from workbench.serving.context import ServeContext


def test_require_returns_what_the_stage_set():
    ctx = ServeContext(request=None, request_id="cmpl-1", model_name="m")
    ctx.engine_prompts, ctx.params, ctx.final_res_batch = [], ["p"], ["r"]
    assert ctx.require_prompts() == [] and ctx.require_params() == ["p"]
    assert ctx.require_results() == ["r"]


@pytest.mark.parametrize("read, stage", [
    ("require_prompts", "preprocess"), ("require_params", "preprocess"),
    ("require_generator", "prepare generators"), ("require_results", "collect")])
def test_require_before_its_stage_ran_is_a_runtime_error(read, stage):
    ctx = ServeContext(request=None, request_id="cmpl-1", model_name="m")
    with pytest.raises(RuntimeError, match=stage):
        getattr(ctx, read)()
