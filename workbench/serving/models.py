"""`/v1/models`: one card per served name (`root` the --model argument), then one per served LoRA adapter (`root` its path,
`parent` its base model, no `max_model_len`), as the reference; the base model's card adds its
`arithmetic` (dtype, `gguf_activations`, `batch_invariant`) and the SAEs loaded (`saes`)."""

from __future__ import annotations

import uuid

from workbench.serving.base import EngineServing
from workbench.serving.protocol.common import ModelCard, ModelList, ModelPermission


class ModelsServing(EngineServing):
    def list_models(self) -> ModelList:
        # as vLLM, `root` echoes the --model argument; never the cache directory it resolved
        # to (paths of the server's disk do not belong in an answer)
        model = self.engine.config.model
        root = model if isinstance(model, str) else self.model_name
        shape = getattr(self.engine, "model_shape", None)
        saes = [sae.describe() for sae in shape.saes.values()] if shape and shape.saes else None
        cards = [
            ModelCard(id=name, root=root, max_model_len=self.max_model_len,
                      arithmetic=self.engine.arithmetic, saes=saes,
                      permission=[ModelPermission(id=f"modelperm-{uuid.uuid4().hex}")])
            for name in self.served_model_names
        ]
        if self.adapters is not None:
            cards += [ModelCard(id=name, root=path, parent=parent,
                                permission=[ModelPermission(id=f"modelperm-{uuid.uuid4().hex}")])
                      for name, path, parent in self.adapters.cards()]
        return ModelList(data=cards)
