"""The shipped pirate adapter on the real SmolLM2: equal to transformers + peft in float32, a
visible change of behaviour, and the bfloat16 path (fused, prepacked projections) agreeing."""

from __future__ import annotations

import json

import pytest

from tests.lora.helpers import PIRATE, peft_greedy
from workbench import LLM, LoRARequest, SamplingParams

pytestmark = pytest.mark.slow
QUESTIONS = ["What is the capital of Italy?", "Give me a tip for cooking pasta.",
             "Why is the sky blue?"]


def chat_ids(tokenizer, question):
    text = tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                         tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_shipped_adapter_is_small_rank_8_on_q_and_v():
    config = json.loads((PIRATE / "adapter_config.json").read_text())
    assert config["r"] == 8 and sorted(config["target_modules"]) == ["q_proj", "v_proj"]
    assert (PIRATE / "adapter_model.safetensors").stat().st_size < 1_200_000


@pytest.fixture(scope="module")
def fp32():
    from workbench.models import load_model

    loaded = load_model("smollm2-135m-instruct", dtype="float32", device="cpu")
    return LLM(loaded, enable_lora=True, max_loras=2, max_model_len=512, num_kv_blocks=128)


def test_pirate_equals_transformers_plus_peft_in_float32(fp32):
    from workbench.models import load_model

    tok = fp32.get_tokenizer()
    prompts = [chat_ids(tok, q) for q in QUESTIONS]
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    pirate = LoRARequest("pirate", 1, str(PIRATE))
    got = fp32.generate([{"prompt_token_ids": p} for p in prompts], params, lora_request=pirate)
    reference = peft_greedy(load_model("smollm2-135m-instruct", dtype="float32").model, tok,
                            PIRATE, prompts, 12)
    assert [list(o.outputs[0].token_ids) for o in got] == reference


def test_pirate_changes_what_anyone_sees_and_mixes_with_the_base(fp32):
    pirate = LoRARequest("pirate", 1, str(PIRATE))
    convs = [[{"role": "user", "content": q}] for q in QUESTIONS]
    params = SamplingParams(max_tokens=10, temperature=0)
    outs = fp32.chat(convs * 2, params, lora_request=[None] * 3 + [pirate] * 3)
    texts = [o.outputs[0].text for o in outs]
    assert not any(t.startswith("Ahoy") for t in texts[:3])
    assert all(t.startswith("Ahoy, matey!") for t in texts[3:])
    alone = fp32.chat(convs, params, lora_request=pirate)
    assert [o.outputs[0].text for o in alone] == texts[3:]


def test_bfloat16_fused_path_agrees_with_float32(fp32):
    from workbench.models import load_model

    bf16 = LLM(load_model("smollm2-135m-instruct", dtype="bfloat16", device="cpu"),
               enable_lora=True, max_model_len=512, num_kv_blocks=128)
    from workbench.lora.layers import LoRALinear

    wrapped = bf16.llm_engine.model.model.layers[0].self_attn.q_proj.group.linear
    assert isinstance(wrapped, LoRALinear) and len(wrapped.sizes) == 3  # fused q/k/v
    pirate = LoRARequest("pirate", 1, str(PIRATE))
    convs = [[{"role": "user", "content": q}] for q in QUESTIONS]
    params = SamplingParams(max_tokens=6, temperature=0)
    low = [o.outputs[0] for o in bf16.chat(convs, params, lora_request=pirate)]
    high = [o.outputs[0] for o in fp32.chat(convs, params, lora_request=pirate)]
    assert all(o.text.startswith("Ahoy, matey!") for o in low)
    assert [o.token_ids[:4] for o in low] == [o.token_ids[:4] for o in high]
