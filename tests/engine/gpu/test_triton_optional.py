"""triton stays optional: the engine imports without it and never loads it on its own, and
`workbench.engine.gpu.triton.available` says no where it cannot import (these run with or without
triton installed; the kernels' own tests are `test_triton_kernels.py`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from workbench.engine.gpu import triton as wb_triton


def test_the_engine_imports_without_loading_triton():
    """In a fresh interpreter where `import triton` fails, the engine and the LLM import, and
    nothing they import loads triton."""
    code = ("import sys; sys.modules['triton'] = None\n"  # None in sys.modules: ImportError
            "import workbench.llm, workbench.engine.step.runner, workbench.engine.engine\n"
            "from workbench.engine.gpu import triton\n"
            "assert not triton.available('cuda')\n"
            "assert sys.modules['triton'] is None\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, cwd=Path(__file__).resolve().parents[3])
    assert result.returncode == 0, result.stderr


def test_available_is_false_where_triton_does_not_import(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    wb_triton.imports.cache_clear()
    try:
        assert not wb_triton.available("cuda")
        assert not wb_triton.available("cpu")
    finally:
        wb_triton.imports.cache_clear()
