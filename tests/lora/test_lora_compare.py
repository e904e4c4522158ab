"""`Workbench.compare_lora` and `LogprobTable.diff`: base vs adapter side by side."""

from __future__ import annotations

import pytest

from tests.lora.helpers import fresh_tiny
from workbench import LLM, LoRARequest, Workbench
from workbench.inspect.logprob_diff import LogprobDiff
from workbench.serving.config import ServerConfig


@pytest.fixture(scope="module")
def wb(adapters):
    llm = LLM(fresh_tiny(), enable_lora=True, max_loras=2, dtype="float32", num_kv_blocks=64,
              max_model_len=256)
    bench = Workbench(llm, config=ServerConfig(lora_modules=(f"b={adapters['b']}",)))
    yield bench
    bench.close()


def test_compare_lora_completions(wb):
    cmp = wb.compare_lora("Once upon a time in", "b", max_tokens=6, ignore_eos=True)
    assert cmp.base.ok and cmp.lora.ok
    assert cmp.lora.response["model"] == "b" and cmp.base.response["model"] == "tiny-llama"
    assert cmp.texts[0] == wb.completions("Once upon a time in", max_tokens=6, temperature=0,
                                          ignore_eos=True).text
    assert cmp.texts[1] == wb.completions("Once upon a time in", model="b", max_tokens=6,
                                          temperature=0, ignore_eos=True).text
    diff = cmp.diff
    assert isinstance(diff, LogprobDiff) and len(diff) == 6
    assert diff.a_name == "tiny-llama" and diff.b_name == "b"
    first = diff.diverged_at
    assert first is not None and cmp.texts[0] != cmp.texts[1]
    assert all(r.same for r in diff.rows[:first]) and not diff[first].same
    assert all(not r.same_context for r in diff.rows[first + 1:])
    assert diff[first].a_logprob_of_b is None or diff[first].a_logprob_of_b < diff[first].a_logprob
    assert "wb-lora-compare" in cmp._repr_html_() and "wb-logprob-diff" in cmp._repr_html_()
    # the side labels follow the theme (a fixed dark grey was unreadable on a dark page)
    assert "color:var(--jp-content-font-color2" in cmp._repr_html_()


def test_compare_lora_chat_with_a_lora_request(wb, adapters):
    lora = LoRARequest("a", 1, str(adapters["a"]))
    cmp = wb.compare_lora(messages=[{"role": "user", "content": "Hi"}], adapter=lora,
                          max_tokens=4)
    assert cmp.lora.response["model"] == "a" and cmp.diff is not None
    assert "a" in [m["id"] for m in wb.models().response["data"]]  # served under its name now
    with pytest.raises(ValueError, match="needs a prompt"):
        wb.compare_lora(adapter="a")
    missing = wb.compare_lora("x", "nope", max_tokens=2)
    assert missing.lora.status_code == 404 and missing.diff is None
