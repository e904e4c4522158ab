"""workbench.apps.bench's beam benchmark: both sides make exactly width x tokens tokens (no timing)."""

from __future__ import annotations

from tests.engine.helpers import make_llm
from workbench.apps import bench


def test_both_beam_sides_make_width_times_tokens(tiny_llama):
    from workbench.models import tiny_model

    prompt = tiny_llama.tokenizer("Once upon a time")["input_ids"]
    assert bench.ours_beam(make_llm(tiny_llama), prompt, 4, 5) == 20
    assert bench.hf_beam(tiny_model("llama", seed=0), prompt, 4, 5) == 20
