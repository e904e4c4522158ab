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


def test_steps_shared_with_other_requests_are_counted(tiny_llama):
    llm = make_llm(tiny_llama)
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in (3, 6)]
    alone = llm.generate({"prompt_token_ids": list(range(100, 110))}, params[0])[0].metrics
    assert (alone.num_shared_steps, alone.max_step_requests) == (0, 1)
    short, long = (o.metrics for o in llm.generate(
        [{"prompt_token_ids": list(range(100, 110))}, {"prompt_token_ids": list(range(200, 205))}],
        params))
    assert (short.num_shared_steps, short.max_step_requests) == (3, 2)  # all of its steps
    assert (long.num_shared_steps, long.max_step_requests) == (3, 2)  # then 3 on its own
    assert long.num_prefill_steps + long.num_decode_steps == 6


def test_the_engine_counts_its_steps(tiny_llama):
    llm = make_llm(tiny_llama, max_num_batched_tokens=8)
    engine = llm.llm_engine
    assert engine.stats().num_steps == 0
    params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    llm.generate({"prompt_token_ids": list(range(100, 120))}, params)  # prefill 8+8+4, 2 decodes
    assert engine.stats().num_steps == 5
    llm.generate([{"prompt_token_ids": [100 + i, 101, 102]} for i in range(2)], params)
    assert engine.stats().num_steps == 5 + 3  # the two requests side by side: one batch a step
