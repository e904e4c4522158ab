"""The `>>>` examples of the tools, the Responses store and the tool-loop trace run as written."""

import doctest
import importlib

import pytest


@pytest.mark.parametrize("module", ["workbench.tools.base", "workbench.tools.calculator",
                                    "workbench.serving.responses.store",
                                    "workbench.inspect.tool_loop"])
def test_docstring_examples_run(module):
    result = doctest.testmod(importlib.import_module(module), verbose=False)
    assert result.failed == 0 and result.attempted > 0
