"""Trace: pipeline stages and engine phases of one request, in order, non-negative."""

from __future__ import annotations

import re

import pytest

from workbench.inspect.trace import Span, Trace


@pytest.fixture(scope="module")
def wb(default_model):
    from workbench import LLM, Workbench

    with Workbench(LLM(model=default_model, max_model_len=512, seed=0)) as bench:
        yield bench


def test_trace_of_a_served_request_has_stages_and_engine_phases(wb):
    trace = wb.completions("Hello", max_tokens=3, temperature=0).trace
    names = [s.name for s in trace.spans]
    assert names[:5] == ["check model", "validate", "preprocess", "sampling params",
                         "prepare generators"]
    assert names[5:8] == ["queued", "prefill", "decode"]
    assert all(s.duration >= 0 for s in trace.spans)
    assert trace["prefill"].end <= trace["decode"].end <= trace.total
    assert isinstance(trace.num_prefill_steps, int)  # RequestMetrics' counts, as given
    assert list(trace.to_frame()["name"]) == names


def test_trace_from_an_offline_request_output(default_model):
    from workbench import LLM, SamplingParams

    out = LLM(model=default_model, max_model_len=512).generate(
        ["Hi"], SamplingParams(max_tokens=2, temperature=0))[0]
    assert [s.name for s in Trace.from_request_output(out).spans] == ["queued", "prefill",
                                                                     "decode"]


def test_html_marks_every_time_for_sanitizers():
    trace = Trace((Span("validate", "pipeline", 0.0, 0.0012), Span("decode", "engine", 0.0012,
                                                                   0.0345)))
    html = trace._repr_html_()
    assert html == Trace(trace.spans)._repr_html_()
    times = re.findall(r'<span class="wb-time">([^<]*)</span>', html)
    assert times == ["34.5 ms", "1.2 ms", "33.3 ms"]
    assert re.sub(r'<span class="wb-time">[^<]*</span>', "", html).count(" ms") == 0
