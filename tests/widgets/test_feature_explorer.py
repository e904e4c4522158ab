"""FeatureExplorer headless, on the tiny llama with a small SAE and its dashboards job: a
feature's dashboard, a text's most active features (equal to the request's own `features`),
a steer beside the default (equal to the requests run by hand); the same on a
`Workbench(url=...)`; errors shown in the widget and raised by the methods."""

from __future__ import annotations

import html

import pytest
import torch

from workbench import LLM, SamplingParams
from workbench.errors import ValidationError
from workbench.features.sae import save_sae
from workbench.widgets import FeatureExplorer
from workbench.widgets.feature_explorer import _most_active

HOOK = "blocks.1.hook_resid_post"
TEXT = "The quick brown fox jumps over the lazy dog"


@pytest.fixture(scope="module")
def sae_dir(tmp_path_factory):
    g = torch.Generator().manual_seed(1)
    return save_sae(str(tmp_path_factory.mktemp("sae") / "s"), {
        "W_enc": torch.randn(64, 32, generator=g) / 8, "b_enc": torch.full((32,), -0.2),
        "W_dec": torch.randn(32, 64, generator=g) / 2, "b_dec": torch.zeros(64)}, HOOK)


@pytest.fixture(scope="module")
def llm(tiny_llama_dir, sae_dir):
    return LLM(model=str(tiny_llama_dir), dtype="float32", batch_invariant=True,
               saes={"s": sae_dir})


@pytest.fixture(scope="module")
def dashboards(llm, sae_dir, tmp_path_factory):
    from workbench.jobs.dashboards import DashboardJob

    out = tmp_path_factory.mktemp("dash")
    docs = [f"Document {i}: " + "alpha beta gamma delta " * (i + 2) for i in range(6)]
    DashboardJob("tiny", docs, sae_dir, str(out), llm=llm, progress=False).run()
    return str(out)


def test_show_read_and_steer_on_a_local_llm(llm, dashboards):
    explorer = FeatureExplorer(llm, "s", dashboards, max_tokens=5)
    dashboard = explorer.show(3)
    assert dashboard.feature == 3 and "feature 3" in explorer.view.value
    features = explorer.read(TEXT)
    direct = llm.generate(TEXT, SamplingParams(max_tokens=1, temperature=0, features={
        "sae": "s", "top_k": 10, "positions": "prompt"}))[0].features
    assert features.top_ids.equal(direct.top_ids) and features.top_values.equal(direct.top_values)
    ranked = _most_active(direct, 10)
    assert [v for _, v in explorer.active.options] == [f for f, _ in ranked]
    assert explorer.feature.value == ranked[0][0]  # the first shown
    assert "wb-features" in explorer.view.value and "wb-dash" in explorer.view.value
    explorer.active.value = ranked[1][0]  # picking another shows its dashboard
    assert explorer.feature.value == ranked[1][0]
    steered, default = explorer.steer("Once upon a time", 5, 12.0)
    by_hand = [llm.generate("Once upon a time", SamplingParams(
        max_tokens=5, temperature=0, interventions=i))[0].outputs[0].text for i in (
        [{"feature": {"sae": "s", "index": 5}, "scale": 12.0}], None)]
    assert (steered, default) == tuple(by_hand) and steered != default
    assert "wb-steer" in explorer.view.value and explorer.to_html() == explorer.view.value


def test_errors_show_in_the_widget_and_raise_from_the_methods(llm, dashboards):
    explorer = FeatureExplorer(llm, "s", dashboards)
    with pytest.raises(ValidationError) as error:
        explorer.show(32)
    assert error.value.parameter == "feature"
    explorer.text.value = ""
    explorer.read_button.click()
    assert "type a text" in explorer.status.value
    with pytest.raises(ValidationError, match="no SAE 'nope'"):
        FeatureExplorer(llm, "nope")
    explorer.steer_button.click()  # no prompt
    assert "type a prompt" in explorer.status.value and not explorer.steer_button.disabled


def test_a_workbench_drives_it_the_same(llm, dashboards):
    from workbench import Workbench, serve_in_kernel

    handle = serve_in_kernel(llm, port=0)
    try:
        wb = Workbench(url=handle.base_url)
        remote = FeatureExplorer(wb, "s", max_tokens=5)  # d_sae from the model's card
        local = FeatureExplorer(llm, "s", dashboards, max_tokens=5)
        assert remote.d_sae == 32
        assert remote.read(TEXT).top_ids.equal(local.read(TEXT).top_ids)
        assert remote.steer("Once upon a time", 5, 12.0) == local.steer(
            "Once upon a time", 5, 12.0)
        assert "no dashboards" in remote.view.value
        remote.sae = "unloaded"  # since unloaded on the server, say
        remote.steer_button.click()  # the server's 400, in its words
        shown = html.unescape(remote.status.value)
        assert "no SAE 'unloaded'" in shown and shown.count("(parameter=") == 1
    finally:
        handle.stop(timeout=5)
