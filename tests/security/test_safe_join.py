"""`workbench.lora.security`: client-supplied paths stay inside their configured root."""

from __future__ import annotations

import os

import pytest

from workbench.errors import ValidationError
from workbench.lora.security import is_within, redact, safe_join


def test_a_relative_name_resolves_inside_the_root(tmp_path):
    (tmp_path / "style").mkdir()
    assert safe_join(tmp_path, "style") == (tmp_path / "style").resolve()
    assert safe_join(tmp_path, "style/../style") == (tmp_path / "style").resolve()


@pytest.mark.parametrize("name", ["../outside", "a/../../outside", "/etc/passwd", "..", "",
                                  "a\x00b"])
def test_traversal_is_refused_by_parameter(tmp_path, name):
    with pytest.raises(ValidationError) as info:
        safe_join(tmp_path / "root", name, parameter="lora_path")
    assert info.value.parameter == "lora_path"


def test_an_absolute_path_inside_the_root_is_allowed(tmp_path):
    assert safe_join(tmp_path, str(tmp_path / "a" / "b")) == (tmp_path / "a" / "b").resolve()


def test_a_symlink_leaving_the_root_is_refused(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    os.symlink(tmp_path, root / "escape")
    with pytest.raises(ValidationError, match="outside the allowed directory"):
        safe_join(root, "escape/secret")
    assert not is_within([root], root / "escape" / "secret")
    assert is_within([root], root / "inside")


def test_redact_masks_every_secret():
    assert redact("Bearer sk-123 and sk-123", ["sk-123", ""]) == "Bearer *** and ***"
