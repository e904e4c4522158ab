"""The OpenAI-compatible server over HTTP: FastAPI app, SSE framing, runners.

`build_app(engine, config)` (app.py) wires the transport-free serving objects of
`workbench.serving` to routes (routes/), with the error handlers (errors.py), API-key and
request-counting middleware (middleware.py), SSE framing (sse.py), disconnect handling
(cancellation.py) and CDN-free docs (docs.py). `server.run_server` runs it with uvicorn for
`workbench serve`; `kernel_server.serve_in_kernel` runs it in a background thread of a
notebook kernel.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from workbench.http.app import build_app
    from workbench.http.kernel_server import serve_in_kernel

# loaded on first use: both import fastapi and the serving layer (torch), which modules such as
# shutdown.py and json_guard.py do not need
_LAZY = {"build_app": "workbench.http.app", "serve_in_kernel": "workbench.http.kernel_server"}

__all__ = ["build_app", "serve_in_kernel"]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'workbench.http' has no attribute {name!r}")
