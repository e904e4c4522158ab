"""`/v1/load_lora_adapter` and `/v1/unload_lora_adapter`: adapters loaded at run time.

Registered only when runtime LoRA updating is on (`VLLM_ALLOW_RUNTIME_LORA_UPDATING=1`, or the
`WORKBENCH_` alias, or `ServerConfig(allow_runtime_lora_updating=True)`), as the reference:
success is a plain-text 200 ("Success: LoRA adapter 'X' added successfully."), failures the
error envelope with the reference's messages (`workbench.serving.lora.ServedAdapters`).
"""

from __future__ import annotations

import asyncio
import logging

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from pydantic import Field

from workbench.errors import ValidationError
from workbench.http.errors import error_json, validate_json_request
from workbench.serving.protocol.common import OpenAIBaseModel
from workbench.serving.unsupported import refuse_unknown_fields

router = APIRouter()
logger = logging.getLogger("workbench.lora")


class LoadLoRAAdapterRequest(OpenAIBaseModel):
    lora_name: str | None = None
    lora_path: str | None = None
    load_inplace: bool = False
    is_3d_lora_weight: bool = Field(default=False, description="not supported: must be false")


class UnloadLoRAAdapterRequest(OpenAIBaseModel):
    lora_name: str | None = None
    lora_int_id: int | None = Field(default=None)


@router.post("/v1/load_lora_adapter", dependencies=[Depends(validate_json_request)])
async def load_lora_adapter(request: LoadLoRAAdapterRequest, raw: Request) -> Response:
    """Loads a PEFT LoRA adapter and serves it as model `lora_name`."""
    adapters = raw.app.state.servings.adapters
    try:
        refuse_unknown_fields(request)
        if request.is_3d_lora_weight:
            raise ValidationError("is_3d_lora_weight (3D MoE LoRA weights) is not supported.",
                                  parameter="is_3d_lora_weight", value=True)
        message = await asyncio.to_thread(adapters.load, request.lora_name, request.lora_path,
                                          request.load_inplace)
    except Exception as exc:  # noqa: BLE001 - every failure becomes the error envelope
        return error_json(exc)
    return Response(content=message, status_code=200)


@router.post("/v1/unload_lora_adapter", dependencies=[Depends(validate_json_request)])
async def unload_lora_adapter(request: UnloadLoRAAdapterRequest, raw: Request) -> Response:
    """Stops serving an adapter; requests already running with it finish with it."""
    adapters = raw.app.state.servings.adapters
    try:
        refuse_unknown_fields(request)
        message = await asyncio.to_thread(adapters.unload, request.lora_name,
                                          request.lora_int_id)
    except Exception as exc:  # noqa: BLE001
        return error_json(exc)
    return Response(content=message, status_code=200)
