"""`/v1/load_sae` and `/v1/unload_sae`: sparse autoencoders loaded at run time.

Behind the same opt-in as runtime LoRA loading (`VLLM_ALLOW_RUNTIME_LORA_UPDATING=1`, or
`ServerConfig(allow_runtime_lora_updating=True)`), with the same confinement: `sae_path` must lie
inside a directory the server allows adapters from (`--lora-load-dir`, `--lora-resolver-dir`).
Success is a plain-text 200 as the adapters' routes answer; failures the error envelope, a 400
naming what is wrong (`workbench.features.sae`: a missing file, another model's width, a hook
the model lacks, a name taken or unknown).
"""

from __future__ import annotations

import asyncio
import logging

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from workbench.errors import refuse
from workbench.http.errors import error_json, validate_json_request
from workbench.lora.security import is_within
from workbench.serving.protocol.common import OpenAIBaseModel
from workbench.serving.unsupported import refuse_unknown_fields

router = APIRouter()
logger = logging.getLogger("workbench.features")


class LoadSaeRequest(OpenAIBaseModel):
    sae_name: str | None = None
    sae_path: str | None = None


class UnloadSaeRequest(OpenAIBaseModel):
    sae_name: str | None = None


@router.post("/v1/load_sae", dependencies=[Depends(validate_json_request)])
async def load_sae(request: LoadSaeRequest, raw: Request) -> Response:
    """Loads the SAE folder `sae_path` (SAELens's format) as `sae_name`."""
    servings = raw.app.state.servings
    try:
        refuse_unknown_fields(request)
        name, path = request.sae_name, request.sae_path
        if not name or not path:
            refuse("Both 'sae_name' and 'sae_path' must be provided.", "sae_name", name)
        load_dirs = servings.adapters.load_dirs
        if "\x00" in path or not is_within(load_dirs, path):  # no arbitrary paths
            refuse("'sae_path' must lie inside a directory the server allows adapters from "
                   "(--lora-load-dir or --lora-resolver-dir); "
                   + ("none is configured." if not load_dirs else "this path does not."),
                   "sae_path", path)
        await asyncio.to_thread(servings.completions.engine.load_sae, name, path)
    except Exception as exc:  # noqa: BLE001 - every failure becomes the error envelope
        return error_json(exc)
    logger.info("Loaded SAE %r from %r", name, path)
    return Response(content=f"Success: SAE '{name}' added successfully.", status_code=200)


@router.post("/v1/unload_sae", dependencies=[Depends(validate_json_request)])
async def unload_sae(request: UnloadSaeRequest, raw: Request) -> Response:
    """Stops serving an SAE; requests already resolved against it finish with it."""
    servings = raw.app.state.servings
    try:
        refuse_unknown_fields(request)
        if not request.sae_name:
            refuse("'sae_name' must be provided.", "sae_name", None)
        await asyncio.to_thread(servings.completions.engine.unload_sae, request.sae_name)
    except Exception as exc:  # noqa: BLE001
        return error_json(exc)
    return Response(content=f"Success: SAE '{request.sae_name}' removed successfully.",
                    status_code=200)
