"""API docs without a CDN: one self-contained HTML page rendered from the OpenAPI schema.

FastAPI's Swagger/ReDoc pages load scripts from a CDN and fail offline; this page is plain
HTML with inline CSS, one section per route (method, path, summary, request and response
schema names), linking to `/openapi.json` for the full machine-readable schema.
"""

from __future__ import annotations

import html
from typing import Any

_CSS = ("body{font-family:sans-serif;max-width:60rem;margin:2rem auto;color:#222}"
        "code{background:#f3f3f3;padding:0 .3em}.m{font-weight:bold;display:inline-block;"
        "width:4.5em}section{border-top:1px solid #ddd;padding:.4rem 0}")


def _schema_name(content: dict[str, Any] | None) -> str:
    schema = ((content or {}).get("application/json") or {}).get("schema") or {}
    ref = schema.get("$ref") or ""
    return ref.rsplit("/", 1)[-1] if ref else ""


def docs_page(openapi: dict[str, Any]) -> str:
    info = openapi.get("info", {})
    title = html.escape(f"{info.get('title', 'API')} {info.get('version', '')}".strip())
    sections = []
    for path, operations in sorted(openapi.get("paths", {}).items()):
        for method, op in operations.items():
            body = _schema_name((op.get("requestBody") or {}).get("content"))
            reply = _schema_name(((op.get("responses") or {}).get("200") or {}).get("content"))
            lines = [f"<span class='m'>{method.upper()}</span> <code>{html.escape(path)}</code>"]
            summary = op.get("description") or op.get("summary") or ""
            if summary:
                lines.append(f"<p>{html.escape(summary)}</p>")
            if body:
                lines.append(f"<p>request: <code>{html.escape(body)}</code></p>")
            if reply:
                lines.append(f"<p>response: <code>{html.escape(reply)}</code></p>")
            sections.append("<section>" + "".join(lines) + "</section>")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title>"
            f"<style>{_CSS}</style></head><body><h1>{title}</h1>"
            "<p>Full schema: <a href='/openapi.json'>/openapi.json</a></p>"
            + "".join(sections) + "</body></html>")
