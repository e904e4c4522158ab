"""The `>>>` examples in the models package (and the package root) run as written."""

import doctest
import importlib

import pytest


@pytest.mark.parametrize("module", ["workbench", "workbench.models", "workbench.models.registry",
                                    "workbench.models.devices", "workbench.models.tiny"])
def test_docstring_examples_run(module):
    result = doctest.testmod(importlib.import_module(module), verbose=False)
    assert result.failed == 0
    assert result.attempted > 0


def test_import_workbench_stays_light():
    import subprocess
    import sys

    code = "import sys, workbench; workbench.SamplingParams; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
