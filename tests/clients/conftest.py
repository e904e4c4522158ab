"""One in-process server on the real SmolLM2 (fp32) for the real-client tests, as a user would
run it for tools: the shipped Hermes-style template, `--enable-auto-tool-choice
--tool-call-parser hermes`; and one on the embedding model for the embedding calls.

The clients are used unmodified, with their own defaults: whatever fields they send (OpenAI's
`store`, `metadata`, `service_tier`, ...) must be accepted (issue 16).
"""

from __future__ import annotations

import os

import pytest

MODEL = "smollm2-135m-instruct"
EMBED_MODEL = "all-minilm-l6-v2"
# LiteLLM reads its model price map from the network at import unless told not to
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


@pytest.fixture(scope="package")
def server(default_model):
    from workbench import LLM, serve_in_kernel
    from workbench.serving.chat_tools import TOOLS_TEMPLATE

    llm = LLM(model=default_model, max_model_len=1024, seed=0)
    handle = serve_in_kernel(llm, port=0, served_model_names=(MODEL,),
                             chat_template=TOOLS_TEMPLATE.read_text(),
                             enable_auto_tool_choice=True, tool_call_parser="hermes")
    yield handle
    handle.stop()


@pytest.fixture(scope="package")
def embed_server():
    from workbench import LLM, serve_in_kernel

    handle = serve_in_kernel(LLM(model=EMBED_MODEL, dtype="float32"), port=0)
    yield handle
    handle.stop()
