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
