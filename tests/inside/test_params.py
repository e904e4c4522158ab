"""`workbench/inside/params.py`: what a request may ask to see or change inside the model,
parsed and checked against a model's shape, each refusal naming the field."""

from __future__ import annotations

import base64

import numpy as np
import pytest
import torch

from workbench.errors import ValidationError
from workbench.inside.params import (
    CaptureParams,
    InsideParams,
    Intervention,
    LogitLensParams,
    ModelShape,
    Positions,
    interventions_key,
    load_vector,
    parse_site,
)

SHAPE = ModelShape(num_layers=4, hidden_size=8, num_heads=2, head_dim=4, vocab_size=100,
                   missing_sites={"resid_mid": "parallel"}, max_capture_bytes=1 << 20)


@pytest.mark.parametrize("name, expected", [
    ("blocks.3.hook_resid_post", ("resid_post", 3)),
    ("blocks.0.attn.hook_pattern", ("pattern", 0)),
    ("blocks.2.attn.hook_z", ("z", 2)),
    ("hook_attn_out", ("attn_out", None)),
    ("mlp_out", ("mlp_out", None)),
    ("ln_final.hook_normalized", ("normalized", None)),
])
def test_sites_parse_by_transformerlens_names_and_short_forms(name, expected):
    assert parse_site(name, "capture") == expected


@pytest.mark.parametrize("name", ["blocks.x.hook_resid_post", "blocks.1.hook_pattern",
                                  "blocks.1.attn.hook_resid_post", "resid", 3])
def test_unknown_sites_are_refused(name):
    with pytest.raises(ValidationError) as err:
        parse_site(name, "capture")
    assert err.value.parameter == "capture"


def test_short_sites_expand_over_layers_with_negative_indices():
    capture = CaptureParams.parse({"sites": ["resid_post", "blocks.1.attn.hook_pattern",
                                             "normalized"], "layers": [0, -1]})
    capture.resolve(SHAPE, 10)
    assert capture.names == ["blocks.0.hook_resid_post", "blocks.3.hook_resid_post",
                             "blocks.1.attn.hook_pattern", "ln_final.hook_normalized"]


def test_a_site_the_model_lacks_and_layers_out_of_range_are_refused():
    with pytest.raises(ValidationError, match="parallel"):
        CaptureParams.parse(["resid_mid"]).resolve(SHAPE, 10)
    with pytest.raises(ValidationError, match="4 layers"):
        CaptureParams.parse({"sites": ["resid_post"], "layers": [4]}).resolve(SHAPE, 10)


def test_the_size_bound_counts_positions_sites_and_patterns():
    inside = InsideParams.parse(capture={"sites": ["resid_post", "pattern"]})
    assert inside is not None
    inside.resolve(SHAPE, 100)  # 4 layers x (100 x 8 + 2 x 100 x 100) floats: ~0.3 MiB
    big = InsideParams.parse(capture={"sites": ["resid_post", "pattern"]})
    with pytest.raises(ValidationError, match="max-capture-mb") as err:
        big.resolve(SHAPE, 300)
    assert err.value.parameter == "capture"
    reduced = InsideParams.parse(capture={"sites": ["resid_post"], "reduce": "mean"})
    reduced.resolve(SHAPE, 10 ** 6)  # one row per site whatever the length


@pytest.mark.parametrize("value, position, prompt, selected", [
    ("all", 7, 3, True), ("prompt", 2, 3, True), ("prompt", 3, 3, False),
    ("generated", 3, 3, True), ([2, 5], 4, 0, True), ([2, 5], 5, 0, False),
    ({"start": 4}, 100, 0, True)])
def test_positions_select(value, position, prompt, selected):
    assert Positions.parse(value, "capture").selects(position, prompt) is selected


def test_logit_lens_defaults_and_bounds():
    lens = LogitLensParams.parse(True)
    lens.resolve(SHAPE, 10)
    assert (lens.layers, lens.top_k) == ([0, 1, 2, 3], 5)
    with pytest.raises(ValidationError):
        LogitLensParams.parse({"top_k": 21})
    with pytest.raises(ValidationError, match="vocabulary"):
        LogitLensParams.parse({"token_ids": [100]}).resolve(SHAPE, 10)


def test_intervention_vectors_come_as_lists_or_wire_tensors_and_are_checked():
    vector = np.arange(8, dtype="<f4")
    wire = {"dtype": "float32", "shape": [8], "data": base64.b64encode(vector.tobytes()).decode()}
    for given in (vector.tolist(), wire):
        i = Intervention.parse({"site": "resid_pre", "layer": -1, "op": "add", "vector": given}, 0)
        i.resolve(SHAPE, 0)
        assert i.layer == 3 and torch.equal(i.vector, torch.from_numpy(vector))
    z = Intervention.parse({"site": "blocks.1.attn.hook_z", "op": "add", "heads": [1],
                            "vector": [1.0] * 4}, 2)
    z.resolve(SHAPE, 2)  # a head's width
    for bad, field in [({"vector": [1.0] * 7}, "interventions[0].vector"),
                       ({"vector": [float("inf")] * 8}, "interventions[0].vector"),
                       ({"heads": [0]}, "interventions[0].heads"),
                       ({"op": "zero", "vector": [1.0] * 8}, "interventions[0].vector"),
                       ({"layer": 9}, "interventions[0].layer")]:
        spec = {"site": "resid_pre", "layer": 0, "op": "add", "vector": [1.0] * 8, **bad}
        with pytest.raises(ValidationError) as err:
            Intervention.parse(spec, 0).resolve(SHAPE, 0)
        assert err.value.parameter == field


def test_patching_takes_one_row_per_listed_position():
    rows = [[float(i)] * 8 for i in range(3)]
    i = Intervention.parse({"site": "resid_post", "layer": 0, "op": "set", "vector": rows,
                            "positions": [1, 4, 6]}, 0)
    i.resolve(SHAPE, 0)
    assert i.vector.shape == (3, 8)
    with pytest.raises(ValidationError, match=r"\[3, 8\]"):
        Intervention.parse({"site": "resid_post", "layer": 0, "op": "set", "vector": rows[:2],
                            "positions": [1, 4, 6]}, 0).resolve(SHAPE, 0)


def test_equal_interventions_share_a_key_and_different_vectors_do_not():
    def make(x):
        i = Intervention.parse({"site": "resid_post", "layer": 0, "op": "add",
                                "vector": [x] * 8}, 0)
        i.resolve(SHAPE, 0)
        return [i]

    assert interventions_key(make(1.0)) == interventions_key(make(1.0))
    assert interventions_key(make(1.0)) != interventions_key(make(2.0))


def test_steering_vector_files_load_and_bad_ones_are_refused(tmp_path):
    np.save(tmp_path / "v.npy", np.ones(8, dtype=np.float32))
    torch.save(torch.ones(8), tmp_path / "v.pt")
    (tmp_path / "v.json").write_text("[1, 1, 1, 1, 1, 1, 1, 1]")
    for name in ("v.npy", "v.pt", "v.json"):
        assert torch.equal(load_vector(str(tmp_path / name), 8), torch.ones(8))
    with pytest.raises(ValidationError, match="9 finite numbers"):
        load_vector(str(tmp_path / "v.npy"), 9)
    with pytest.raises(ValidationError, match="cannot read"):
        load_vector(str(tmp_path / "absent.npy"), 8)
