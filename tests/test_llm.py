"""`LLM`, the synchronous offline API: prompt forms, output order, chat, several engines at once."""

import pytest

from tests.engine.helpers import greedy, make_llm
from workbench.sampling_params import RequestOutputKind, SamplingParams

PROMPT = "Once upon a time"


@pytest.fixture()
def llm(tiny_llama):
    return make_llm(tiny_llama, block_size=4, num_kv_blocks=64)


def first_tokens(outputs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


def test_text_token_ids_and_dict_prompts_are_the_same_request(llm, tiny_llama):
    ids = tiny_llama.tokenizer(PROMPT)["input_ids"]
    forms = [PROMPT, ids, {"prompt_token_ids": ids}, {"prompt": PROMPT}]
    results = [llm.generate(form, greedy(6))[0] for form in forms]
    assert all(r.prompt_token_ids == ids for r in results)
    assert len({tuple(r.outputs[0].token_ids) for r in results}) == 1
    assert [r.prompt for r in results] == [PROMPT, None, None, PROMPT]


def test_outputs_come_back_in_prompt_order(llm):
    prompts = ["A long prompt that takes a while to prefill, " * 3, "Hi", PROMPT]
    params = [greedy(2), greedy(12, ignore_eos=True), greedy(6, ignore_eos=True)]
    outputs = llm.generate(prompts, params)
    assert [o.prompt for o in outputs] == prompts
    assert [len(o.outputs[0].token_ids) for o in outputs] == [2, 12, 6]
    assert len({o.request_id for o in outputs}) == 3


def test_one_params_object_applies_to_every_prompt(llm):
    outputs = llm.generate(["Hi", PROMPT], greedy(3, ignore_eos=True))
    assert [len(t) for t in first_tokens(outputs)] == [3, 3]


def test_a_params_list_of_the_wrong_length_is_refused(llm):
    with pytest.raises(ValueError, match="2 sampling params for 3 prompts"):
        llm.generate(["a", "b", "c"], [greedy(2), greedy(2)])


def test_the_callers_params_are_not_changed(llm):
    params = SamplingParams(temperature=0.0, max_tokens=3)
    llm.generate(PROMPT, params)
    assert params.output_kind is RequestOutputKind.CUMULATIVE and params.max_tokens == 3


def test_unknown_engine_arguments_are_refused(tiny_llama):
    with pytest.raises(TypeError, match="max_num_sequences"):
        make_llm(tiny_llama, max_num_sequences=4)


def test_chat_applies_the_chat_template(llm, tiny_llama):
    messages = [{"role": "user", "content": "Hi there"}]
    out = llm.chat(messages, greedy(4))[0]
    expected = tiny_llama.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                        tokenize=True, return_dict=True)
    assert out.prompt_token_ids == list(expected["input_ids"])


def test_chat_takes_a_list_of_conversations(llm):
    conversations = [[{"role": "user", "content": "Hi"}], [{"role": "user", "content": "Bye"}]]
    outputs = llm.chat(conversations, greedy(3))
    assert len(outputs) == 2 and outputs[0].prompt_token_ids != outputs[1].prompt_token_ids


def test_chat_refuses_continue_final_message_with_a_generation_prompt(llm):
    with pytest.raises(ValueError, match="continue_final_message"):
        llm.chat([{"role": "user", "content": "Hi"}], continue_final_message=True)


def test_two_llms_on_different_models_give_their_own_results(tiny_llama, tiny_qwen2):
    a, b = make_llm(tiny_llama, block_size=4), make_llm(tiny_qwen2, block_size=4)
    alone_a = first_tokens(a.generate([PROMPT, "Hi"], greedy(8)))
    alone_b = first_tokens(b.generate([PROMPT, "Hi"], greedy(8)))
    assert alone_a != alone_b
    for i, (prompt, llm) in enumerate([(PROMPT, a), (PROMPT, b), ("Hi", a), ("Hi", b)]):
        llm.llm_engine.add_request(f"r{i}", prompt, greedy(8))
    finals = {}
    while a.llm_engine.has_unfinished_requests() or b.llm_engine.has_unfinished_requests():
        for llm in (a, b):  # interleaved steps of the two engines
            finals.update({o.request_id: o for o in llm.llm_engine.step() if o.finished})
    assert [finals[f"r{i}"].outputs[0].token_ids for i in (0, 2)] == alone_a
    assert [finals[f"r{i}"].outputs[0].token_ids for i in (1, 3)] == alone_b


def test_two_llms_on_one_model_keep_separate_caches(tiny_llama):
    long_prompt = "In a hole in the ground there lived a hobbit, not a nasty dirty wet hole"
    a, b = make_llm(tiny_llama, block_size=4), make_llm(tiny_llama, block_size=4)
    want = first_tokens(a.generate(long_prompt, greedy(8)))[0]
    # a re-reads its cached blocks while b writes other text into the same block ids of its own
    a.llm_engine.add_request("x", long_prompt, greedy(8))
    b.llm_engine.add_request("x", "Something else entirely, and rather longer than that", greedy(8))
    finals = {}
    while a.llm_engine.has_unfinished_requests():
        b.llm_engine.step()
        finals.update({o.request_id: o for o in a.llm_engine.step() if o.finished})
    assert finals["x"].num_cached_tokens > 0
    assert finals["x"].outputs[0].token_ids == want


def test_priority_policy_serves_lower_priority_values_first(tiny_llama):
    llm = make_llm(tiny_llama, block_size=4, max_num_seqs=1, scheduling_policy="priority")
    outputs = llm.generate(["first", "second", "third"], greedy(3, ignore_eos=True),
                           priority=[2, 0, 1])
    order = sorted(range(3), key=lambda i: outputs[i].metrics.first_scheduled_time)
    assert order == [1, 2, 0]
    assert [o.prompt for o in outputs] == ["first", "second", "third"]


def test_beam_search_progress_counts_steps(tiny_llama, monkeypatch):
    """use_tqdm=True on a beam search: a bar over its steps (it reports only at the end), full
    when it is done, also when a search ends early."""
    import workbench.llm as llm_module
    from workbench import LLM
    from workbench.sampling_params import BeamSearchParams

    bars = []

    class Bar:
        def __init__(self, total, enabled, desc):
            self.total, self.desc, self.n, self.updates = total, desc, 0, []
            bars.append(self)

        def update(self, k):
            self.n += k
            self.updates.append(k)

        def close(self):
            pass

    monkeypatch.setattr(llm_module, "_progress", Bar)
    llm = LLM(tiny_llama, max_model_len=128, num_kv_blocks=64)
    llm.beam_search(["Hello", "The quick brown fox"], BeamSearchParams(beam_width=2, max_tokens=6),
                    use_tqdm=True)
    bar, = bars
    assert (bar.total, bar.desc, bar.n) == (12, "Beam search steps", 12)
    assert len(bar.updates) >= 6 and all(k >= 0 for k in bar.updates)


def test_an_llm_says_at_once_that_it_takes_a_loaded_model_over():
    """The caller's object becomes the engine's (its projections the kernels' own weights, one
    copy each): the call's own warning says so, naming the model, and how to keep yours."""
    import pytest

    from workbench import LLM
    from workbench.llm import ModelTakenOverWarning
    from workbench.models import tiny_model

    loaded = tiny_model("llama")
    with pytest.warns(ModelTakenOverWarning, match="takes the loaded model 'tiny-llama' over"
                      ".*copy.deepcopy"):
        LLM(model=loaded)
    with pytest.raises(RuntimeError, match="belongs to a workbench engine"):
        loaded.model.state_dict()
    assert "ModelTakenOverWarning" in LLM.__doc__
