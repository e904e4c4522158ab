"""`workbench/inside/positions.py`: one form of positions and one parser for capture, logit
lens and interventions; a range spelled as a range, a list always a list, every refusal naming
the exact field (`capture.positions`, `interventions[1].positions`, `logit_lens.positions`)."""

from __future__ import annotations

import pytest

from workbench.errors import ValidationError
from workbench.inside.positions import Positions, parse_positions
from workbench.inside.spec import CaptureParams, Intervention, LogitLensParams
from workbench.sampling_params import SamplingParams


@pytest.mark.parametrize("value, expected", [
    (None, Positions("all")),
    ("all", Positions("all")),
    ("prompt", Positions("prompt")),
    ("generated", Positions("generated")),
    ({"start": 2, "stop": 5}, Positions("range", 2, 5)),
    ({"start": 3}, Positions("range", 3, None)),
    ({"stop": 4}, Positions("range", 0, 4)),
    ({"start": 2, "stop": None}, Positions("range", 2, None)),
    (range(2, 5), Positions("range", 2, 5)),
    (range(0, 7, 3), Positions("list", items=(0, 3, 6))),
    (slice(2, 5), Positions("range", 2, 5)),
    (slice(None, 5), Positions("range", 0, 5)),
    (slice(3, None), Positions("range", 3, None)),
    (slice(2, 5, 1), Positions("range", 2, 5)),
    ([0, 2, 5], Positions("list", items=(0, 2, 5))),
    ([2, 5], Positions("list", items=(2, 5))),  # two positions, never a range
    ((7,), Positions("list", items=(7,))),
    ([5, 1], Positions("list", items=(5, 1))),  # the order given (patching rows follow it)
])
def test_every_form_parses(value, expected):
    assert parse_positions(value, "capture.positions") == expected
    assert parse_positions(expected, "capture.positions") is expected


@pytest.mark.parametrize("value, position, prompt, selected", [
    ("all", 7, 3, True), ("prompt", 2, 3, True), ("prompt", 3, 3, False),
    ("generated", 3, 3, True), ("generated", 2, 3, False),
    ({"start": 2, "stop": 5}, 4, 0, True), ({"start": 2, "stop": 5}, 5, 0, False),
    ({"start": 2, "stop": 5}, 1, 0, False), ({"start": 4}, 100, 0, True),
    ([2, 5], 5, 0, True), ([2, 5], 4, 0, False), (range(2, 5), 3, 0, True)])
def test_positions_select(value, position, prompt, selected):
    assert parse_positions(value, "capture.positions").selects(position, prompt) is selected


@pytest.mark.parametrize("value, most", [
    ("all", 10), ({"start": 2, "stop": 5}, 3), ({"start": 8}, 2), ({"start": 2, "stop": 50}, 8),
    ([0, 2, 5], 3)])
def test_the_most_positions_it_can_select(value, most):
    assert parse_positions(value, "p").most(10) == most


@pytest.mark.parametrize("value", ["all", "prompt", {"start": 2, "stop": 5}, {"start": 2,
                                                                              "stop": None},
                                   [0, 2, 5]])
def test_the_json_form_parses_back_to_itself(value):
    parsed = parse_positions(value, "p")
    assert parse_positions(parsed.to_json(), "p") == parsed
    assert parsed.to_json() == value


@pytest.mark.parametrize("value, path, match", [
    ("everything", "capture.positions", "unknown word"),
    ({"start": 2, "end": 5}, "capture.positions", r"unknown key\(s\) \['end'\]"),
    ({"start": "2"}, "capture.positions.start", "must be an integer"),
    ({"start": 1.5, "stop": 3}, "capture.positions.start", "must be an integer"),
    ({"stop": True}, "capture.positions.stop", "must be an integer"),
    ({"start": 5, "stop": 2}, "capture.positions", "0 <= start < stop"),
    ({"start": 2, "stop": 2}, "capture.positions", "0 <= start < stop"),
    ({"start": -1}, "capture.positions", "0 <= start < stop"),
    (range(5, 2), "capture.positions", "0 <= start < stop"),
    (range(5, 0, -1), "capture.positions", "step must be positive"),
    (slice(2, 5, 2), "capture.positions", "takes no step"),
    (slice("a", 5), "capture.positions", "integers"),
    (slice(-3, None), "capture.positions", "0 <= start < stop"),
    ([], "capture.positions", "empty list"),
    ([0, -1], "capture.positions", "integers >= 0"),
    ([0, 1.0], "capture.positions", "integers >= 0"),
    ([True], "capture.positions", "integers >= 0"),
    ([1, None], "capture.positions", "integers >= 0"),
    ([2, 2], "capture.positions", "each once"),
    (3, "capture.positions", "must be 'all'"),
    (2.5, "capture.positions", "must be 'all'"),
])
def test_every_refusal_names_the_exact_path(value, path, match):
    with pytest.raises(ValidationError, match=match) as err:
        parse_positions(value, "capture.positions")
    assert err.value.parameter == path
    assert str(err.value).startswith(path)


def test_the_three_fields_share_the_parser_and_name_their_own_path():
    """capture, logit_lens and each intervention take every form; a refusal names the field
    as the request spells it."""
    for value in ([0, 2, 5], {"start": 2, "stop": 5}, "prompt"):
        expected = parse_positions(value, "p")
        params = SamplingParams(
            capture={"sites": ["resid_post"], "positions": value},
            logit_lens={"positions": value},
            interventions=[{"site": "resid_post", "layer": 0, "op": "zero"},
                           {"site": "resid_post", "layer": 0, "op": "zero",
                            "positions": value}])
        assert params.capture is not None and params.capture.positions == expected
        assert params.logit_lens is not None and params.logit_lens.positions == expected
        assert params.interventions is not None
        assert params.interventions[1].positions == expected
    bad = {"start": 3, "stop": 1}
    for kwargs, path in [
            ({"capture": {"sites": ["resid_post"], "positions": bad}}, "capture.positions"),
            ({"logit_lens": {"positions": bad}}, "logit_lens.positions"),
            ({"interventions": [{"site": "resid_post", "layer": 0, "op": "zero"},
                                {"site": "resid_post", "layer": 0, "op": "zero",
                                 "positions": bad}]}, "interventions[1].positions")]:
        with pytest.raises(ValidationError) as err:
            SamplingParams(**kwargs)
        assert err.value.parameter == path


def test_python_ranges_and_slices_work_in_hand_built_params():
    assert CaptureParams(["resid_post"], positions=range(2, 5)).positions == \
        Positions("range", 2, 5)
    assert LogitLensParams(positions=slice(1, None)).positions == Positions("range", 1, None)
    assert Intervention("resid_post", 0, "zero", positions=[3, 1]).positions == \
        Positions("list", items=(3, 1))
    with pytest.raises(ValidationError) as err:
        CaptureParams(["resid_post"], positions=[-1])
    assert err.value.parameter == "capture.positions"
    params = SamplingParams(capture={"sites": ["resid_post"], "positions": range(0, 3)})
    assert params.capture is not None and params.capture.positions.to_json() == {
        "start": 0, "stop": 3}
