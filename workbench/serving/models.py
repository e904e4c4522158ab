"""`/v1/models`: one card per served name (LoRA adapters will add theirs)."""

from __future__ import annotations

import uuid

from workbench.serving.base import OpenAIServing
from workbench.serving.protocol.common import ModelCard, ModelList, ModelPermission


class ModelsServing(OpenAIServing):
    def list_models(self) -> ModelList:
        root = str(getattr(self.engine, "model_path", None) or self.model_name)
        return ModelList(data=[
            ModelCard(id=name, root=root, max_model_len=self.max_model_len,
                      permission=[ModelPermission(id=f"modelperm-{uuid.uuid4().hex}")])
            for name in self.served_model_names
        ])
