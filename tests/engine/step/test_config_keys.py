"""Config keys a family never uses, as converted or merged configs carry them (transformers
keeps any unknown key as an attribute): `num_key_value_heads`, `head_dim`, `sliding_window`.

The KV cache is laid out from what each family's attention computes (the runner's probe step
records every layer's key shape and window), so every family with each key either serves
token-identically to transformers' own `generate` on an untouched copy of the same weights, or
is refused when it loads with an `UnsupportedModelError` naming the key: a `sliding_window`
that transformers' KV cache applies to layers whose attention does not (a forward and a
`generate` would disagree), and StableLM's `head_dim`, which its rotary embedding reads and its
attention does not (transformers' own forward fails). Before, the cache was laid out from the
config's attributes, and GPT-2, GPT-NeoX, OPT, BLOOM and GPT-J failed with an `index_copy_`
shape error.
"""

from __future__ import annotations

import copy

import pytest

from tests.engine.helpers import make_llm
from tests.engine.step.test_architectures import LONG, assert_exact, greedy, pristine, reference
from workbench.engine.step.runner import kv_shape
from workbench.models.architectures import ARCHITECTURES, UnsupportedModelError
from workbench.models.tiny import tiny_model

FAMILIES = sorted(ARCHITECTURES)
# each key at a value its family would not compute with (the tiny models have 4 heads of 16,
# 2 KV heads where the family reads the key), the window shorter than the prompts
KEYS = {"num_key_value_heads": 1, "head_dim": 32, "sliding_window": 4}
# the families whose attention applies `sliding_window` (qwen2's and qwen3's only with
# use_sliding_window, which their configs then leave unset: nothing to disagree with)
WINDOWED = {"gemma2", "gemma3_text", "mistral", "mixtral", "phi3", "qwen2", "qwen2_moe", "qwen3",
            "starcoder2"}
REFUSED = {(family, "sliding_window") for family in FAMILIES if family not in WINDOWED} | {
    ("stablelm", "head_dim")}  # its rotary reads head_dim, its attention does not
CASES = [(family, key) for family in FAMILIES for key in KEYS
         if (family, key) != ("falcon", "head_dim")]  # FalconConfig's head_dim is read-only


@pytest.mark.parametrize("family, key", CASES)
def test_a_config_key_serves_exactly_or_is_refused_naming_it(family, key):
    loaded, ref = pristine(family, **{key: KEYS[key]})
    if (family, key) in REFUSED:
        with pytest.raises(UnsupportedModelError, match=rf"model_type '{family}'.*{key}="):
            make_llm(loaded)
        return
    expected = reference(ref, LONG[:2], 8)
    llm = make_llm(loaded, block_size=4, max_num_batched_tokens=7, enable_chunked_prefill=True)
    runner = llm.llm_engine.runner
    # the cache's layout is what the layers' keys are
    assert {runner.kv_caches[0][0].shape[1:]} == {a.kv_shape for a in
                                                  runner.layer_attention.values()}
    assert_exact(llm.generate(LONG[:2], greedy(8)), expected)


@pytest.mark.parametrize("family", ["gpt2", "gpt_neox", "opt", "bloom", "gptj"])
def test_a_stray_kv_head_count_neither_changes_the_cache_nor_its_memory(family):
    """The issue's configs: 2 KV heads in a family of one per query head (4 of 16 here)."""
    plain, stray = tiny_model(family).config, tiny_model(family, num_key_value_heads=2).config
    assert stray.num_key_value_heads == 2
    assert kv_shape(stray) == kv_shape(plain) == (4, 16)  # what sizes the cache's memory


def test_a_config_that_disagrees_with_its_layers_is_refused_naming_the_key():
    """Llama reads num_key_value_heads when it builds its projections: a config changed after
    (2 KV heads computed, 1 said) is refused at load rather than failing every request."""
    loaded = tiny_model("llama")
    loaded.model.config = config = copy.deepcopy(loaded.model.config)
    config.num_key_value_heads = 1
    with pytest.raises(UnsupportedModelError, match=r"2 of size 16 KV heads.*"
                                                    r"num_key_value_heads=1.*says 1 of size 16"):
        make_llm(loaded)
