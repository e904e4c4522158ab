"""`workbench serve --classifier-labels`: the label words reach the engine configuration."""

from __future__ import annotations

import pytest

from workbench.apps.cli import build_parser, configs_from_args


def test_classifier_labels_flag():
    args = build_parser().parse_args(["serve", "--classifier-labels", "negative", "positive"])
    engine, _ = configs_from_args(args)
    assert engine.classifier_labels == ("negative", "positive")


def test_classifier_labels_default_and_refusal():
    engine, _ = configs_from_args(build_parser().parse_args(["serve"]))
    assert engine.classifier_labels == ("no", "yes")
    with pytest.raises(ValueError, match="classifier_labels"):
        configs_from_args(build_parser().parse_args(["serve", "--classifier-labels", "yes"]))
