"""`/v1/completions`: prompts (text, ids, or lists of either) -> text completions.

The pipeline comes from `OpenAIServing` and `GenerationServing`; this module supplies the
request's hooks and stage 6. One
function, `completion_choice`, builds a choice from a `ChoiceDelta`: the non-streaming path
calls it once per choice with the merged deltas, the streaming path once per delta.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from workbench.sampling_params import SamplingParams
from workbench.serving import unsupported
from workbench.serving.base import RequestMeta
from workbench.serving.context import ServeContext
from workbench.serving.errors import error_response
from workbench.serving.generation import GenerationServing
from workbench.serving.logprobs import (
    completion_logprobs,
    positions_or_blank,
    prompt_logprobs_json,
    token_stats_json,
)
from workbench.serving.prompt_embeds import embeds_prompts
from workbench.serving.prompts import EnginePrompt
from workbench.serving.protocol.common import UsageInfo
from workbench.serving.protocol.completion import (
    CompletionRequest,
    CompletionResponse,
    CompletionResponseChoice,
    CompletionResponseStreamChoice,
    CompletionStreamResponse,
)
from workbench.serving.sampling import build_sampling_params, resolve_max_tokens
from workbench.serving.streaming import (
    ChoiceDelta,
    chunk_json,
    error_json,
    inside_fields,
    usage_chunk_json,
    usage_info,
    usage_options,
)


@dataclass
class ChoiceCursor:
    """Where a choice stands in a stream: opened yet (prompt echoed / its ids sent), text
    offset, tokens so far."""

    opened: bool = False
    text_offset: int = 0
    num_tokens: int = 0


class CompletionServing(GenerationServing):
    id_prefix = "cmpl"
    supports_lora = True

    def validate(self, ctx: ServeContext[CompletionRequest]) -> None:
        unsupported.check_completion(ctx.request,
                                     enable_prompt_embeds=self.config.enable_prompt_embeds)

    def preprocess(self, ctx: ServeContext[CompletionRequest]) -> None:
        ctx.engine_prompts = self.prompts_of(ctx.request)

    def prompts_of(self, request: CompletionRequest) -> list[EnginePrompt]:
        """Embedding prompts first, then text / token prompts (as the reference orders them)."""
        prompts = []
        if request.prompt_embeds is not None:
            prompts = embeds_prompts(self.engine, self.prompts, request.prompt_embeds,
                                     request.truncate_prompt_tokens)
        if prompts and request.prompt in (None, "", []):
            return prompts
        return prompts + self.prompts.completion_prompts(
            request.prompt, add_special_tokens=request.add_special_tokens,
            truncate=request.truncate_prompt_tokens, side=request.truncation_side)

    def sampling_params(self, request: CompletionRequest, prompt: EnginePrompt) -> SamplingParams:
        max_tokens = resolve_max_tokens(request.max_tokens, "max_tokens", len(prompt.token_ids),
                                        self.max_model_len, self.defaults)
        if request.echo and request.max_tokens == 0:
            max_tokens = 1  # echo only: generate one token, then drop it (as vLLM)
        prompt_logprobs = request.prompt_logprobs
        if prompt_logprobs is None and request.echo:
            prompt_logprobs = request.logprobs
        logprobs = None if request.logprob_token_ids else request.logprobs  # as vLLM's chat
        return build_sampling_params(request, max_tokens=max_tokens, logprobs=logprobs,
                                     prompt_logprobs=prompt_logprobs, defaults=self.defaults)

    # stage 6 -------------------------------------------------------------------------------

    async def build_response(self, ctx: ServeContext[CompletionRequest]) -> CompletionResponse:
        choices = ctx.require_results()
        built = [self.completion_choice(ctx, c, ChoiceCursor(), final=True) for c in choices]
        return CompletionResponse(
            id=ctx.request_id, created=ctx.created, model=ctx.model_name,
            choices=[CompletionResponseChoice(**fields) for fields in built],
            usage=self.usage(ctx, choices), system_fingerprint=self.system_fingerprint)

    async def create_stream(self, request: CompletionRequest, meta: RequestMeta
                            ) -> AsyncIterator[str]:
        ctx = await self.prepare_off_loop(request, meta)
        await self.prime(ctx)
        return self._stream(ctx)

    async def _stream(self, ctx: ServeContext) -> AsyncIterator[str]:
        request: CompletionRequest = ctx.request
        include_usage, continuous = usage_options(request.stream_options,
                                                  self.config.enable_force_include_usage)
        prompts = ctx.require_prompts()
        cursors = {i: ChoiceCursor() for i in range(len(prompts) * ctx.n)}
        merged = {i: ChoiceDelta(index=i) for i in cursors}
        try:
            async with aclosing(self.streamed_deltas(ctx)) as deltas:
                async for delta in deltas:
                    cursor = cursors[delta.index]
                    merged[delta.index].extend(delta)
                    if not (delta.text or delta.token_ids or delta.finish_reason
                            or cursor.num_tokens or request.echo):
                        continue  # nothing generated yet (a prefill step)
                    chunk = CompletionStreamResponse(
                        id=ctx.request_id, object="text_completion", created=ctx.created,
                        model=ctx.model_name, choices=[CompletionResponseStreamChoice(
                            **self.completion_choice(ctx, delta, cursor, final=False))])
                    if continuous:
                        prompt_len = len(prompts[delta.index // ctx.n].token_ids)
                        chunk.usage = usage_info(prompt_len, cursor.num_tokens)
                    if delta.finish_reason is not None and not include_usage:
                        chunk.system_fingerprint = self.system_fingerprint  # the last word
                    yield chunk_json(chunk)
        except Exception as exc:  # noqa: BLE001 - the 200 is out: report in-band
            yield error_json(error_response(exc, log_stack=self.config.log_error_stack))
            return
        choices = ctx.final_res_batch = list(merged.values())
        self.finished(ctx, None)
        if include_usage:
            yield usage_chunk_json(CompletionStreamResponse(
                id=ctx.request_id, created=ctx.created, model=ctx.model_name, choices=[],
                usage=self.usage(ctx, choices), system_fingerprint=self.system_fingerprint))

    def completion_choice(self, ctx: ServeContext, delta: ChoiceDelta, cursor: ChoiceCursor, *,
                          final: bool) -> dict[str, Any]:
        """The fields of one choice (or one streamed piece of it) from a delta."""
        request: CompletionRequest = ctx.request
        prompt_index = delta.index // ctx.n
        prompt = ctx.require_prompts()[prompt_index]
        echo_only = request.echo and request.max_tokens == 0
        text, token_ids, logprobs = delta.text, delta.token_ids, delta.logprobs
        stats = delta.token_stats
        if echo_only:  # the one token generated for the engine's sake is dropped
            text, token_ids, logprobs = "", [], []
            stats = [] if stats is not None else None
        generated = token_ids
        prompt_ids = None
        if not cursor.opened:  # the first piece of a choice carries the prompt (echo, ids)
            cursor.opened = True
            prompt_ids = prompt.token_ids if prompt.embeds is None else None  # no ids to show
            if request.echo:
                prompt_lps = ctx.prompt_logprobs.get(prompt_index)
                text = self.prompts.prompt_text(prompt) + text
                token_ids = prompt.token_ids + token_ids
                if request.logprobs is not None:
                    logprobs = (prompt_lps or [None] * len(prompt.token_ids)) + (logprobs or [])
                    if request.token_stats:
                        prompt_stats = ctx.prompt_token_stats.get(prompt_index)
                        stats = ((prompt_stats or [None] * len(prompt.token_ids))
                                 + (stats or [None] * len(generated)))
        lp_object = None
        if request.logprobs is not None:
            num_top = self.engine.vocab_size if request.logprobs == -1 else request.logprobs
            if request.logprob_token_ids:  # the position holds the sampled token and those ids
                num_top = len(request.logprob_token_ids)
            lp_object, cursor.text_offset = completion_logprobs(
                token_ids, positions_or_blank(logprobs, len(token_ids)), num_top, self.tokenizer,
                initial_offset=cursor.text_offset, as_token_ids=self.as_token_ids(request),
                stats=stats)
        cursor.num_tokens += len(generated)
        fields = {"index": delta.index, "text": text, "logprobs": lp_object,
                  "finish_reason": delta.finish_reason, "stop_reason": delta.stop_reason,
                  "token_ids": generated if request.return_token_ids else None,
                  "prompt_token_ids": ((None if prompt.embeds is not None else prompt.token_ids)
                                       if final else prompt_ids)
                  if request.return_token_ids else None,
                  **inside_fields(delta)}
        if final:
            fields["prompt_logprobs"] = prompt_logprobs_json(ctx.prompt_logprobs.get(prompt_index))
            prompt_stats = token_stats_json(ctx.prompt_token_stats.get(prompt_index))
            if prompt_stats is not None:
                fields["prompt_token_stats"] = prompt_stats
        return fields

    def usage(self, ctx: ServeContext, choices: list[ChoiceDelta]) -> UsageInfo:
        echo_only = ctx.request.echo and ctx.request.max_tokens == 0
        generated = 0 if echo_only else sum(len(c.token_ids) for c in choices)
        return self.add_prompt_tokens_details(usage_info(ctx.num_prompt_tokens, generated), ctx)

