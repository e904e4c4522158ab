"""Fixtures for serving tests: the real SmolLM2 tokenizer and a scripted fake engine.

`FakeEngine` speaks the part of `EngineClient` (`workbench/engine/protocol.py`) the serving
layer's generation paths use and produces a
fixed token script, one delta per step (DELTA) or one cumulative output at the end
(FINAL_ONLY, what non-streaming requests ask for), with the engine's first-token time, so
pipeline tests run in milliseconds without a model.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import pytest

from workbench.config import EngineConfig
from workbench.engine.requests.outputs import (
    CompletionOutput,
    Logprob,
    RequestMetrics,
    RequestOutput,
)
from workbench.sampling_params import RequestOutputKind

SCRIPT = [19556, 905, 28, 1980, 253, 1012, 30, 216]  # "Hello world, ..." token ids


@pytest.fixture(scope="session")
def tokenizer():
    from transformers import AutoTokenizer

    from workbench.models import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model("smollm2-135m-instruct").path)


@dataclass
class FakeStats:
    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0


@dataclass
class FakeEngine:
    """Yields `SCRIPT` one token per step; `fail_at` ends every sequence with 'error' there."""

    tokenizer: object
    max_model_len: int = 64
    served_model_name: str = "fake"
    model_path: str = "/models/fake"
    generation_defaults: dict = field(default_factory=dict)
    fail_at: int | None = None
    step_delay: float = 0.0
    config: EngineConfig = field(default_factory=lambda: EngineConfig(model="fake"))
    aborted: list = field(default_factory=list)
    submitted: list = field(default_factory=list)
    running: set = field(default_factory=set)
    is_pooling_model: bool = False
    pooling_tasks: tuple = ()  # a generative fake serves no pooling route
    classifier_labels: tuple = ()

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    def stats(self) -> FakeStats:
        return FakeStats(num_running=len(self.running))

    def check_health(self) -> None:
        pass

    def check_inputs(self, request_id, prompt, params) -> None:
        """The dry run accepts what `generate` accepts (it checks nothing more)."""

    def _logprobs(self, token: int, k: int | None):
        if k is None:
            return None
        position = {token: Logprob(-0.5, 2, self.tokenizer.decode([token]))}
        for rank, alt in enumerate([7, 8, 9][:k], start=1):
            position.setdefault(alt, Logprob(-1.0 - rank, rank, self.tokenizer.decode([alt])))
        return position

    async def generate(self, prompt, params, request_id, priority=0):
        params.verify(self.vocab_size, self.config.max_logprobs)
        self.submitted.append((request_id, prompt, params))
        self.running.add(request_id)
        ids = prompt["prompt_token_ids"]
        finished, arrived = False, time.time()
        so_far: list[CompletionOutput] = []
        try:
            if params.output_kind is not RequestOutputKind.FINAL_ONLY:
                yield RequestOutput(request_id, None, ids, None, [], False)  # a prefill step
            prompt_lps = None
            if params.prompt_logprobs is not None:
                prompt_lps = [None] + [self._logprobs(t, params.prompt_logprobs) for t in ids[1:]]
            for step, token in enumerate(SCRIPT[: params.max_tokens]):
                await asyncio.sleep(self.step_delay)
                last = step + 1 == min(len(SCRIPT), params.max_tokens)
                reason = "error" if self.fail_at == step else ("length" if last else None)
                outs = [CompletionOutput(i, self.tokenizer.decode([token]), [token], None,
                                         None if params.logprobs is None else
                                         [self._logprobs(token, params.logprobs)], reason)
                        for i in range(params.n)]
                finished = reason is not None
                if step == 0:
                    metrics = RequestMetrics(arrival_time=arrived, first_token_time=time.time())
                if params.output_kind is not RequestOutputKind.FINAL_ONLY:
                    yield RequestOutput(request_id, None, ids, prompt_lps if step == 0 else None,
                                        outs, finished, metrics=metrics)
                else:
                    so_far = [_joined(a, b) for a, b in zip(so_far, outs)] if so_far else outs
                    if finished:
                        yield RequestOutput(request_id, None, ids, prompt_lps, so_far, True,
                                            metrics=metrics)
                if finished:
                    return
        finally:
            self.running.discard(request_id)

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)


def _joined(before: CompletionOutput, step: CompletionOutput) -> CompletionOutput:
    """A choice's output so far, cumulative (FINAL_ONLY), with this step's appended."""
    logprobs = None if before.logprobs is None else before.logprobs + step.logprobs
    return CompletionOutput(before.index, before.text + step.text,
                            before.token_ids + step.token_ids, None, logprobs,
                            step.finish_reason)


@pytest.fixture
def fake_engine(tokenizer):
    return FakeEngine(tokenizer)
