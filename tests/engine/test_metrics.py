"""Request metrics: step counts and timestamps in order."""

from tests.engine.helpers import make_llm
from workbench import SamplingParams


def test_prefill_and_decode_steps_are_counted(tiny_llama):
    llm = make_llm(tiny_llama, max_num_batched_tokens=8)
    prompt = list(range(100, 120))  # 20 tokens: chunks of 8, 8, 4
    out = llm.generate({"prompt_token_ids": prompt},
                       SamplingParams(max_tokens=5, temperature=0, ignore_eos=True))[0]
    m = out.metrics
    assert (m.num_prefill_steps, m.num_decode_steps) == (3, 4)
    assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.finished_time
