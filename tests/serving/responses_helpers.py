"""A scripted fake engine for Responses tests: the i-th engine request answers `scripts[i]`.

It tokenizes each script with the real SmolLM2 tokenizer and yields it a few tokens per step
in DELTA mode, recording every request (id, priority, prompt, params), so the tool loop's
rounds can be checked without a model. A script may hold the exact text a model writes when
it asks for a tool (`<tool_call>{...}</tool_call>`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from workbench.config import EngineConfig
from workbench.engine.requests.outputs import CompletionOutput, RequestOutput


@dataclass
class ScriptedEngine:
    tokenizer: object
    scripts: list = field(default_factory=list)
    max_model_len: int = 2048
    served_model_name: str = "fake"
    model_path: str = "/models/fake"
    generation_defaults: dict = field(default_factory=dict)
    config: EngineConfig = field(default_factory=lambda: EngineConfig(model="fake"))
    submitted: list = field(default_factory=list)
    aborted: list = field(default_factory=list)
    step_delay: float = 0.0  # seconds per engine step
    fail: bool = False  # end every request with finish_reason "error"

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    def check_health(self) -> None:
        pass

    def check_inputs(self, request_id, prompt, params) -> None:
        """The dry run accepts what `generate` accepts (it checks nothing more)."""

    async def generate(self, prompt, params, request_id, priority=0):
        params.verify(self.vocab_size, self.config.max_logprobs)
        self.submitted.append({"id": request_id, "priority": priority, "prompt": prompt,
                               "params": params})
        script = self.scripts[min(len(self.submitted), len(self.scripts)) - 1]
        ids = self.tokenizer(script, add_special_tokens=False).input_ids[: params.max_tokens]
        prompt_ids = prompt["prompt_token_ids"]
        yield RequestOutput(request_id, None, prompt_ids, None, [], False)
        for start in range(0, len(ids), 3):
            await asyncio.sleep(self.step_delay)
            chunk = ids[start:start + 3]
            last = start + 3 >= len(ids)
            reason = "error" if self.fail else None
            if last and not self.fail:
                reason = "length" if len(ids) == params.max_tokens and len(
                    self.tokenizer(script, add_special_tokens=False).input_ids) > len(ids) \
                    else "stop"
            yield RequestOutput(request_id, None, prompt_ids, None, [CompletionOutput(
                0, self.tokenizer.decode(chunk), chunk, None, None, reason)], last)

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)
