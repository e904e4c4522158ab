"""Always-on utility routes: `/health`, `/version`, `/metrics`, and the offline API docs."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from workbench.errors import EngineDeadError
from workbench.http.docs import docs_page
from workbench.version import __version__

router = APIRouter()


@router.get("/health")
async def health(raw: Request) -> Response:
    """200 with an empty body while the engine runs; 503 once its loop has died."""
    try:
        raw.app.state.engine.check_health()
    except EngineDeadError:
        return Response(status_code=503)
    return Response(status_code=200)


@router.get("/version")
async def version() -> dict[str, str]:
    return {"version": __version__}


@router.get("/metrics")
async def metrics(raw: Request) -> Response:
    """Prometheus text exposition of this server's own registry."""
    return Response(generate_latest(raw.app.state.registry), media_type=CONTENT_TYPE_LATEST)


@router.get("/docs", response_class=HTMLResponse, include_in_schema=False)
async def docs(raw: Request) -> HTMLResponse:
    return HTMLResponse(docs_page(raw.app.openapi()))
