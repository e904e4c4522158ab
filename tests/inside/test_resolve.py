"""`workbench/inside/`: what a request may ask to see or change inside the model (`sites`,
`spec`), resolved against a model's shape once (`resolve`), vectors inline or from files
(`vectors`), each refusal naming the field. Positions: `test_positions.py`."""

from __future__ import annotations

import base64

import numpy as np
import pytest
import torch

from workbench.errors import ValidationError
from workbench.inside.resolve import ModelShape, interventions_key, resolve
from workbench.inside.sites import parse_site
from workbench.inside.spec import CaptureParams, Intervention, LogitLensParams
from workbench.inside.vectors import load_vector
from workbench.sampling_params import SamplingParams

SHAPE = ModelShape(num_layers=4, hidden_size=8, num_heads=2, head_dim=4, vocab_size=100,
                   missing_sites={"resid_mid": "parallel"}, max_capture_bytes=1 << 20)


def capture_of(value, num_positions: int = 10):
    return resolve(CaptureParams.parse(value), None, [], SHAPE, num_positions).capture


def lens_of(value, num_positions: int = 10):
    return resolve(None, LogitLensParams.parse(value), [], SHAPE, num_positions).logit_lens


def intervention_of(value, index: int = 0):
    return resolve(None, None, [Intervention.parse(value, index)], SHAPE, 0).interventions[0]


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
    capture = capture_of({"sites": ["resid_post", "blocks.1.attn.hook_pattern", "normalized"],
                          "layers": [0, -1]})
    assert capture.names == ["blocks.0.hook_resid_post", "blocks.3.hook_resid_post",
                             "blocks.1.attn.hook_pattern", "ln_final.hook_normalized"]


def test_a_site_the_model_lacks_and_layers_out_of_range_are_refused():
    with pytest.raises(ValidationError, match="parallel") as err:
        capture_of(["resid_mid"])
    assert err.value.parameter == "capture.sites"
    with pytest.raises(ValidationError, match="4 layers") as err:
        capture_of({"sites": ["resid_post"], "layers": [4]})
    assert err.value.parameter == "capture.layers"


def test_the_size_bound_counts_positions_sites_and_patterns():
    capture = CaptureParams.parse({"sites": ["resid_post", "pattern"]})
    inside = resolve(capture, None, [], SHAPE, 100)  # 4 x (100 x 8 + 2 x 100 x 100) floats
    assert inside.nbytes == 4 * 4 * (100 * 8 + 2 * 100 * 100)
    with pytest.raises(ValidationError, match="max-capture-mb") as err:
        resolve(capture, None, [], SHAPE, 300)
    assert err.value.parameter == "capture"
    listed = CaptureParams.parse({"sites": ["resid_post"], "positions": [0, 5, 9]})
    assert resolve(listed, None, [], SHAPE, 10 ** 6).nbytes == 4 * 4 * 3 * 8  # 3 rows
    reduced = CaptureParams.parse({"sites": ["resid_post"], "reduce": "mean"})
    resolve(reduced, None, [], SHAPE, 10 ** 6)  # one row per site whatever the length


def test_logit_lens_defaults_and_bounds():
    lens = lens_of(True)
    assert (lens.layers, lens.top_k) == ([0, 1, 2, 3], 5)
    with pytest.raises(ValidationError) as err:
        LogitLensParams.parse({"top_k": 21})
    assert err.value.parameter == "logit_lens.top_k"
    with pytest.raises(ValidationError, match="vocabulary") as err:
        lens_of({"token_ids": [100]})
    assert err.value.parameter == "logit_lens.token_ids"


def test_intervention_vectors_come_as_lists_or_wire_tensors_and_are_checked():
    vector = np.arange(8, dtype="<f4")
    wire = {"dtype": "float32", "shape": [8], "data": base64.b64encode(vector.tobytes()).decode()}
    for given in (vector.tolist(), wire):
        i = intervention_of({"site": "resid_pre", "layer": -1, "op": "add", "vector": given})
        assert i.layer == 3 and torch.equal(i.vector, torch.from_numpy(vector))
    intervention_of({"site": "blocks.1.attn.hook_z", "op": "add", "heads": [1],
                     "vector": [1.0] * 4})  # a head's width
    for bad, field in [({"vector": [1.0] * 7}, "interventions[0].vector"),
                       ({"vector": [float("inf")] * 8}, "interventions[0].vector"),
                       ({"heads": [0]}, "interventions[0].heads"),
                       ({"op": "zero", "vector": [1.0] * 8}, "interventions[0].vector"),
                       ({"layer": 9}, "interventions[0].layer")]:
        spec = {"site": "resid_pre", "layer": 0, "op": "add", "vector": [1.0] * 8, **bad}
        with pytest.raises(ValidationError) as err:
            intervention_of(spec)
        assert err.value.parameter == field


def test_patching_takes_one_row_per_listed_position():
    rows = [[float(i)] * 8 for i in range(3)]
    i = intervention_of({"site": "resid_post", "layer": 0, "op": "set", "vector": rows,
                         "positions": [1, 4, 6]})
    assert i.vector.shape == (3, 8)
    with pytest.raises(ValidationError, match=r"\[3, 8\]"):
        intervention_of({"site": "resid_post", "layer": 0, "op": "set", "vector": rows[:2],
                         "positions": [1, 4, 6]})


def test_equal_interventions_share_a_key_and_different_vectors_do_not():
    def make(x):
        return [intervention_of({"site": "resid_post", "layer": 0, "op": "add",
                                 "vector": [x] * 8})]

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


def test_resolution_leaves_the_asks_as_given_and_is_kept_on_the_params():
    """The parsed asks are not changed by resolving (layers stay as given, vectors as lists);
    `SamplingParams.resolve_inside` resolves once per model and length, clones share it."""
    params = SamplingParams(capture={"sites": ["resid_post"], "layers": [-1]}, interventions=[
        {"site": "resid_post", "layer": -1, "op": "add", "vector": [1.0] * 8}])
    inside = params.resolve_inside(SHAPE, 10)
    assert inside is not None and inside.capture is not None
    assert inside.capture.names == ["blocks.3.hook_resid_post"]
    assert params.capture is not None and params.capture.layers == [-1]
    assert params.interventions is not None and params.interventions[0].vector == [1.0] * 8
    assert params.resolve_inside(SHAPE, 10) is inside
    assert params.clone().resolve_inside(SHAPE, 10) is inside
    assert params.resolve_inside(SHAPE, 11) is not inside  # another length: sized again
    assert inside.key is not None and inside.key == interventions_key(inside.interventions)
    assert SamplingParams().resolve_inside(SHAPE, 10) is None
