"""What a notebook shows for the offline API's objects: concise cards, no addresses or clocks."""

from __future__ import annotations

import re

import pytest

from workbench import LLM, SamplingParams
from workbench.models import tiny_model


@pytest.fixture(scope="module")
def llm():
    return LLM(tiny_model("llama", seed=0, dtype="float32"), max_model_len=128, seed=3)


@pytest.fixture(scope="module")
def encoder():
    return LLM(tiny_model("bert", seed=0, dtype="float32"))


def test_llm_repr_names_model_dtype_device_and_seed(llm):
    assert re.fullmatch(r"LLM\('[\w.-]+', generate, float32 on cpu, max_model_len=128, seed=3\)",
                        repr(llm))
    html = llm._repr_html_()
    assert "float32" in html and "methods: generate, chat, beam_search" in html
    assert "0x" not in html


def test_request_and_completion_outputs_show_text_tokens_and_finish(llm):
    out = llm.generate(["Once upon a time"], SamplingParams(max_tokens=3, temperature=0))[0]
    html = out._repr_html_()
    assert html.startswith('<div class="wb-output"') and "RequestOutput" in html
    assert "finished" in html and ">3<" in html and ">length<" in html  # tokens, finish
    assert str(out.metrics.arrival_time) not in html  # no raw timestamps
    one = out.outputs[0]._repr_html_()
    assert "CompletionOutput" in one and ">length<" in one
    assert out._repr_html_() == out._repr_html_()


def test_a_failed_request_s_card_says_why(llm, monkeypatch):
    from workbench.errors import EngineStepError

    def execute(out):
        raise RuntimeError("simulated <kernel> failure")

    monkeypatch.setattr(llm.llm_engine.runner, "execute", execute)
    with pytest.raises(EngineStepError) as info:
        llm.generate(["Once upon a time"], SamplingParams(max_tokens=3))
    html = info.value.outputs[0]._repr_html_()
    assert "failed (RuntimeError: simulated &lt;kernel&gt; failure)" in html


def test_pooling_outputs_show_their_value(encoder):
    emb = encoder.embed(["a short text"])[0]
    html = emb._repr_html_()
    size = len(emb.outputs.embedding)
    assert "EmbeddingRequestOutput" in html and f"embedding of {size} floats" in html
    score = encoder.score("a", ["b"])[0]._repr_html_()
    assert "ScoringRequestOutput" in score and "score " in score
    assert "methods: embed, score, encode" in encoder._repr_html_()


@pytest.mark.slow
def test_notebook_setup_loads_the_default_model_with_a_progress_bar(capsys):
    import workbench

    llm = workbench.notebook_setup(max_model_len=256)
    assert repr(llm) == "LLM('smollm2-135m-instruct', generate, float32 on cpu, max_model_len=256, seed=0)"
    err = capsys.readouterr().err
    assert "Loading smollm2-135m-instruct" in err and "3/3" in err  # weights, tokenizer, device


def test_notebook_setup_clears_its_loading_bars_in_a_kernel(monkeypatch):
    """Run by a kernel, the loading bars are cleared once the model is there: a saved notebook
    keeps no `0%| 0/3` bar (outside a kernel nothing is cleared)."""
    import IPython
    import IPython.display

    import workbench.notebook as nb

    cleared = []
    monkeypatch.setattr(nb, "LLM", lambda **kwargs: kwargs)
    monkeypatch.setattr(IPython.display, "clear_output", lambda wait=False: cleared.append(wait))
    monkeypatch.setattr(IPython, "get_ipython", lambda: None)
    nb.notebook_setup()
    assert cleared == []
    monkeypatch.setattr(IPython, "get_ipython", lambda: type("Shell", (), {"kernel": object()})())
    assert nb.notebook_setup(seed=3)["seed"] == 3
    assert cleared == [False]
