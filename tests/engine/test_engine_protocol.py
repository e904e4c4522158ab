"""`EngineClient`: `AsyncLLMEngine` implements it, and the serving layer reaches the engine
only through it (no reaching into the `LLMEngine` behind an `AsyncLLMEngine`)."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.engine.protocol import EngineClient

ROOT = Path(__file__).resolve().parents[2] / "workbench"
REACH_THROUGH = re.compile(r"\.engine\.engine\b|getattr\([^)]*[\"']engine[\"']|engine_attr")


def protocol_members() -> list[str]:
    return [name for name in vars(EngineClient) if not name.startswith("_")
            and (callable(vars(EngineClient)[name]) or isinstance(vars(EngineClient)[name],
                                                                  property))]


def test_the_protocol_lists_what_serving_needs():
    members = set(protocol_members())
    assert {"generate", "encode", "beam_search", "abort", "tokenizer", "max_model_len",
            "vocab_size", "pooling_tasks", "classifier_labels", "add_lora", "remove_lora",
            "list_loras", "check_inputs", "stats", "check_health", "errored"} <= members


def test_importing_the_protocol_loads_no_torch():
    code = "import sys, workbench.engine.protocol; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


@pytest.fixture()
def engine(tiny_llama):
    from workbench.engine.async_engine import AsyncLLMEngine
    from workbench.llm import LLM

    engine = AsyncLLMEngine.from_llm(LLM(model=tiny_llama, max_model_len=64))
    yield engine
    engine.shutdown()


def test_the_async_engine_satisfies_the_protocol(engine):
    assert isinstance(engine, EngineClient)
    for name in protocol_members():
        declared = vars(EngineClient)[name]
        implemented = inspect.getattr_static(type(engine), name)
        assert isinstance(implemented, property) == isinstance(declared, property), name
        if not isinstance(declared, property):
            assert callable(implemented), name
            wanted = set(inspect.signature(declared).parameters) - {"kwargs"}
            assert wanted <= set(inspect.signature(implemented).parameters), name


def test_the_delegations_answer(engine):
    assert engine.errored is False
    assert engine.get_num_unfinished_requests() == 0 and engine.num_held_blocks() == 0
    assert engine.list_loras() == set() and engine.remove_lora(1) is False
    assert engine.hidden_size > 0
    from workbench.sampling_params import SamplingParams

    engine.check_inputs("dry", {"prompt_token_ids": [1, 2, 3]}, SamplingParams(max_tokens=2))
    assert engine.get_num_unfinished_requests() == 0  # nothing was queued
    with pytest.raises(Exception, match="vocab|token id|out of"):
        engine.check_inputs("dry", {"prompt_token_ids": [10**9]}, SamplingParams(max_tokens=2))


@pytest.mark.parametrize("path", sorted(
    [*ROOT.glob("serving/**/*.py"), ROOT / "apps" / "soak.py"]),
    ids=lambda p: str(p.relative_to(ROOT)))
def test_serving_never_reaches_through_the_protocol(path):
    hits = [line for line in path.read_text().splitlines() if REACH_THROUGH.search(line)]
    assert hits == []
