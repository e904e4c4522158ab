"""LoRA in the engine: outputs equal transformers + peft, mixed batches equal separate runs,
resident slots with LRU eviction, the scheduler's max_loras rule, prefix cache, beam search."""

from __future__ import annotations

import pytest
import torch

from tests.lora.helpers import fresh_tiny, make_adapter, peft_greedy
from workbench import LLM, BeamSearchParams, LoRARequest, SamplingParams
from workbench.errors import ValidationError

PROMPTS = ["Hello there, how are", "Once upon a time in", "The capital of France is"]
GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


def ids_of(tokenizer, texts):
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def make(**kwargs) -> LLM:
    kwargs.setdefault("max_loras", 2)
    kwargs.setdefault("num_kv_blocks", 64)
    kwargs.setdefault("max_model_len", 256)
    return LLM(fresh_tiny(), enable_lora=True, dtype="float32", **kwargs)


def tokens(outputs):
    return [list(o.outputs[0].token_ids) for o in outputs]


@pytest.fixture(scope="module")
def references(adapters):
    """transformers (+ peft) greedy tokens per adapter name (None = base) for PROMPTS."""
    tok = fresh_tiny().tokenizer
    prompts = ids_of(tok, PROMPTS)
    return {name: peft_greedy(fresh_tiny().model, tok, adapters.get(name), prompts, 8)
            for name in (None, "a", "b")}


def test_adapter_output_equals_transformers_plus_peft(adapters, references):
    llm = make()
    for name in ("a", "b"):
        lora = LoRARequest(name, 1 if name == "a" else 2, str(adapters[name]))
        assert tokens(llm.generate(PROMPTS, GREEDY, lora_request=lora)) == references[name]
    assert references["a"] != references[None] and references["b"] != references[None]


def test_mixed_batch_equals_separate_runs(adapters, references):
    llm = make()
    a = LoRARequest("a", 1, str(adapters["a"]))
    b = LoRARequest("b", 2, str(adapters["b"]))
    loras = [None, a, b] * 3
    outs = llm.generate(PROMPTS * 3, GREEDY, lora_request=loras)
    expected = [references[None if lora is None else lora.lora_name][i % 3]
                for i, lora in enumerate(loras)]
    assert tokens(outs) == expected
    assert sorted(llm.llm_engine.lora.resident) == [1, 2]


def test_one_adapter_for_all_prompts_and_chat(adapters, references):
    llm = make()
    a = LoRARequest("a", 1, str(adapters["a"]))
    assert tokens(llm.generate(PROMPTS, GREEDY, lora_request=a)) == references["a"]
    chat = [{"role": "user", "content": "Hi"}]
    with_a = llm.chat([chat, chat], GREEDY, lora_request=[None, a])
    assert tokens(with_a)[0] == tokens(llm.chat(chat, GREEDY))[0]
    assert tokens(with_a)[1] == tokens(llm.chat(chat, GREEDY, lora_request=a))[0]
    assert tokens(with_a)[0] != tokens(with_a)[1]


def test_scheduler_runs_at_most_max_loras_adapters_per_step(adapters, references):
    llm = make(max_loras=1)
    engine = llm.llm_engine
    seen: list[set] = []
    execute = engine.runner.execute

    def spy(out):
        seen.append({s.seq.request.lora_request.lora_int_id for s in out.scheduled
                     if s.seq.request.lora_request is not None})
        return execute(out)

    engine.runner.execute = spy
    a = LoRARequest("a", 1, str(adapters["a"]))
    b = LoRARequest("b", 2, str(adapters["b"]))
    loras = [a, b, None, b, a, None]
    outs = llm.generate(PROMPTS * 2, GREEDY, lora_request=loras)
    expected = [references[None if lora is None else lora.lora_name][i % 3]
                for i, lora in enumerate(loras)]
    assert tokens(outs) == expected
    assert max(len(s) for s in seen) == 1
    assert {1, 2} <= set().union(*seen)  # both ran, one after the other
    assert engine.lora.stats.slot_evictions >= 1


def test_lru_eviction_of_slots_and_memory(adapters, references, tmp_path):
    c = make_adapter(tmp_path / "c", seed=7)
    llm = make(max_loras=2, max_cpu_loras=2)
    manager = llm.llm_engine.lora
    a = LoRARequest("a", 1, str(adapters["a"]))
    b = LoRARequest("b", 2, str(adapters["b"]))
    cr = LoRARequest("c", 3, str(c))
    llm.generate(PROMPTS[:1], GREEDY, lora_request=a)
    llm.generate(PROMPTS[:1], GREEDY, lora_request=b)
    assert manager.resident == [1, 2]
    llm.generate(PROMPTS[:1], GREEDY, lora_request=a)  # a is now the most recently used
    llm.generate(PROMPTS[:1], GREEDY, lora_request=cr)  # evicts b, the least recently used
    assert manager.resident == [1, 3]
    assert manager.list_loras() == {1, 3}  # memory holds 2: b went there too
    assert manager.stats.slot_evictions == 1 and manager.stats.cpu_evictions == 1
    # b comes back from its path, still right
    assert tokens(llm.generate(PROMPTS, GREEDY, lora_request=b)) == references["b"]
    assert manager.stats.loads == 4


def test_prefix_cache_keys_on_the_adapter(adapters):
    llm = make(block_size=4, num_kv_blocks=256)
    a = LoRARequest("a", 1, str(adapters["a"]))
    prompt = "A long enough prompt to fill several blocks of the cache, surely"
    base_first = llm.generate([prompt], GREEDY)[0]
    with_a = llm.generate([prompt], GREEDY, lora_request=a)[0]
    assert with_a.num_cached_tokens == 0  # the base model's blocks are not the adapter's
    again = llm.generate([prompt], GREEDY, lora_request=a)[0]
    assert again.num_cached_tokens > 0 and again.outputs[0].token_ids == with_a.outputs[0].token_ids
    fresh = make().generate([prompt], GREEDY, lora_request=a)[0]
    assert fresh.outputs[0].token_ids == with_a.outputs[0].token_ids
    assert base_first.outputs[0].token_ids != with_a.outputs[0].token_ids


def test_beam_search_keeps_the_adapter(adapters):
    """Every beam runs with the adapter: the search equals one over the adapter merged into
    the weights (peft's merge_and_unload), and differs from the base model's."""
    from peft import PeftModel

    merged = fresh_tiny()
    merged.model = PeftModel.from_pretrained(merged.model, str(adapters["b"])).merge_and_unload()
    params = BeamSearchParams(beam_width=3, max_tokens=6, ignore_eos=True)
    llm = make()
    b = LoRARequest("b", 2, str(adapters["b"]))
    got = llm.beam_search(PROMPTS[:2], params, lora_request=b)
    want = LLM(merged, dtype="float32", num_kv_blocks=64, max_model_len=256).beam_search(PROMPTS[:2], params)
    base = llm.beam_search(PROMPTS[:2], params)
    assert [[s.tokens for s in r.sequences] for r in got] == \
        [[s.tokens for s in r.sequences] for r in want]
    assert [r.sequences[0].tokens for r in got] != [r.sequences[0].tokens for r in base]


def test_refusals():
    plain = LLM(fresh_tiny(), dtype="float32", num_kv_blocks=64, max_model_len=256)
    lora = LoRARequest("a", 1, "/nowhere")
    with pytest.raises(ValidationError, match="LoRA is not enabled"):
        plain.generate(PROMPTS[:1], GREEDY, lora_request=lora)
    with pytest.raises(ValidationError, match="LoRA is not enabled"):
        plain.beam_search(PROMPTS[:1], BeamSearchParams(beam_width=2, max_tokens=2),
                          lora_request=lora)
    llm = make()
    with pytest.raises(ValueError, match="same length as the prompts"):
        llm.generate(PROMPTS, GREEDY, lora_request=[None])
    with pytest.raises(ValidationError, match="No adapter found for /nowhere"):
        llm.generate(PROMPTS[:1], GREEDY, lora_request=lora)
    with pytest.raises(ValueError, match="id must be > 0"):
        LoRARequest("a", 0, "/x")
    assert not llm.llm_engine.has_unfinished_requests()


def test_one_id_one_adapter(adapters):
    llm = make()
    llm.generate(PROMPTS[:1], GREEDY, lora_request=LoRARequest("a", 1, str(adapters["a"])))
    with pytest.raises(ValidationError, match="lora_int_id 1 is already used"):
        llm.generate(PROMPTS[:1], GREEDY, lora_request=LoRARequest("b", 1, str(adapters["b"])))
    assert llm.llm_engine.remove_lora(1)
    llm.generate(PROMPTS[:1], GREEDY, lora_request=LoRARequest("b", 1, str(adapters["b"])))


def test_config_checks():
    from workbench.config import EngineConfig

    with pytest.raises(ValidationError, match="max_loras must be at least 1"):
        EngineConfig(max_loras=0)
    with pytest.raises(ValidationError, match=r"max_cpu_loras \(1\) must be >= max_loras \(2\)"):
        EngineConfig(max_loras=2, max_cpu_loras=1)


def test_bf16_fused_projections_equal_unfused(adapters):
    """In bfloat16 the engine fuses q/k/v and gate/up (engine/step/fusion.py): each part's delta is
    added to its own columns, bit-identical to the unfused projections with theirs."""
    from workbench.engine.step.fusion import fuse_projections
    from workbench.engine.step.lora_manager import LoRAManager

    fused, plain = fresh_tiny("llama", "bfloat16"), fresh_tiny("llama", "bfloat16")
    assert fuse_projections(fused.model, kernel="torch") == 4
    managers = [LoRAManager(m.model, max_loras=2) for m in (fused, plain)]
    b = LoRARequest("b", 2, str(adapters["b"]))
    a = LoRARequest("a", 1, str(adapters["a"]))

    class Row:  # what begin_step reads: a scheduled sequence's request and token count
        def __init__(self, lora, n):
            self.seq = type("S", (), {"request": type("R", (), {"lora_request": lora})()})()
            self.num_tokens = n

    x = torch.randn(1, 7, 64, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    results = []
    for loaded, manager in zip((fused, plain), managers):
        manager.begin_step([Row(None, 2), Row(b, 3), Row(a, 2)])
        layer = loaded.model.model.layers[1]
        with torch.inference_mode():
            outs = [getattr(layer.self_attn, n)(x) for n in ("q_proj", "k_proj", "v_proj")]
            outs += [getattr(layer.mlp, n)(x) for n in ("gate_proj", "up_proj")]
        manager.end_step()
        results.append(outs)
    for got, want in zip(*results):
        assert torch.equal(got, want)
    base = fresh_tiny("llama", "bfloat16").model.model.layers[1].self_attn.q_proj(x)
    assert torch.equal(results[1][0][:, :2], base[:, :2])  # base rows untouched
    assert not torch.equal(results[1][0][:, 2:5], base[:, 2:5])


def test_pooling_models_refuse_lora():
    from workbench.models.tiny import tiny_model

    with pytest.raises(ValidationError, match="not supported for pooling models"):
        LLM(tiny_model("bert"), enable_lora=True)


def test_lean_decoder_loop_applies_adapters(adapters):
    """In bfloat16 the runner's lean loop (engine/step/decoder.py) calls the LoRA wrappers too: a
    mixed batch gives bit-identical logprobs with it and with transformers' layers."""
    a = LoRARequest("a", 1, str(adapters["a"]))
    b = LoRARequest("b", 2, str(adapters["b"]))
    params = SamplingParams(max_tokens=6, temperature=0, logprobs=2, ignore_eos=True)
    results = []
    for lean in (True, False):
        llm = LLM(fresh_tiny("llama", "bfloat16"), enable_lora=True, max_loras=2,
                  num_kv_blocks=64, max_model_len=256)
        assert llm.llm_engine.runner.stack is not None
        if not lean:
            llm.llm_engine.runner.stack = None
        outs = llm.generate(PROMPTS[:1] * 3 + PROMPTS, params,
                            lora_request=[None, a, b] * 2)
        results.append([(list(o.outputs[0].token_ids), o.outputs[0].logprobs) for o in outs])
    assert results[0] == results[1]
    base, with_a, with_b = results[0][:3]  # one prompt: the adapters change its logprobs
    assert base != with_a and base != with_b
