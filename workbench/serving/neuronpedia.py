"""Neuronpedia's inference API on the engine: the routes `neuronpedia-inference-client` calls,
with its request and response shapes, computed in the engine's batch (no lock: concurrent
clients share its steps).

Sources are the loaded SAEs (`--sae`, `/v1/load_sae`, `LLM(saes=...)`), by name; a name of
Neuronpedia's form `LAYER-SET` (`6-res-jb`) puts it in the source set `SET`. What each route
reads, as Neuronpedia's server does:

- The activation routes prepend the tokenizer's BOS text to a prompt that does not start with
  it, tokenize without further special tokens, record the SAEs' hooks over the prompt through
  the engine (a capture, float32) and encode them with SAELens's arithmetic
  (`SparseAutoencoder.encode`, on the batch-invariant products: the same bits as a request's
  `features`). `activation/all` ranks features over every selected source by their largest
  activation (by their sum at `sort_by_token_indexes` when given), stably: ties in source
  then feature order; `ignore_bos` zeroes position 0. `activation/single` zeroes BOS positions
  and drops the first when the prompt has one (Neuronpedia's values and tokens). With `vector`
  and `hook` instead: the hook's activations (no BOS added) dotted with the vector.
- `steer/completion` and `steer/completion-chat` run each asked type (STEERED, DEFAULT) as
  its own request, side by side in the batch: STEERED adds
  `strength_multiplier * strength * v` at the hook at every position (`v` a feature's decoder
  row, or the given vector; normalised to length 1 with `normalize_steering`). In the chat
  form the prompt's special tokens are left alone unless `steer_special_tokens`. Only
  SIMPLE_ADDITIVE is computed; ORTHOGONAL_DECOMP and PROJECTION_CAP are refused (400).
  `stream`: server-sent events, each carrying every output so far.
- `tokenize`, `util/sae-vector` (the feature's encoder column `W_enc[:, index]`, as
  Neuronpedia's server answers), `util/sae-topk-by-decoder-cossim`.

Errors answer as Neuronpedia's server does: `{"error": message}` with a 400 (404 for a model
this server does not serve, 500 where the engine failed).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from workbench.engine.kernels import c_products
from workbench.errors import NotFoundError
from workbench.errors import ValidationError as Refused
from workbench.inside.positions import Positions
from workbench.inside.spec import CaptureParams, Intervention
from workbench.sampling_params import SamplingParams
from workbench.serving.base import EngineServing
from workbench.serving.chat_template import ChatRenderer
from workbench.serving.protocol.chat import ChatMessageParam
from workbench.serving.protocol.neuronpedia import (
    ActivationAllBatchRequest,
    ActivationAllRequest,
    ActivationSingleBatchRequest,
    ActivationSingleRequest,
    ActivationTopkByTokenBatchRequest,
    ActivationTopkByTokenRequest,
    NPTokenizeRequest,
    SteerCompletionChatRequest,
    SteerCompletionRequest,
    UtilSaeTopkByDecoderCossimRequest,
    UtilSaeVectorRequest,
)

logger = logging.getLogger("workbench.neuronpedia")

SOURCE = re.compile(r"^(\d+)-(.+)$")  # LAYER-SET
DEFAULT_NUM_RESULTS = 25  # activation/all, as Neuronpedia's
MAX_NUM_RESULTS = 1000
DEFAULT_TOP_K = 5  # activation/topk-by-token
MAX_COSSIM_RESULTS = 128
MAX_BATCH_PROMPTS = 64  # a batch route's prompts (Neuronpedia's takes 4)


Reader = Callable[[str, Any], Awaitable[dict[str, Any]]]  # (prompt, request) -> its answer


class NeuronpediaError(Exception):
    """A request Neuronpedia's server would refuse: `{"error": message}` with `status`."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass
class Prompt:
    """A prompt as the activation routes read it: ids, each token's text, which are special."""

    ids: list[int]
    tokens: list[str]
    special: list[bool]


class NeuronpediaServing(EngineServing):
    """The routes' semantics (module docstring); each method takes the parsed body and returns
    the response's JSON (or, streaming, its server-sent events)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.special_ids = set(self.tokenizer.all_special_ids)
        self.chat = ChatRenderer.for_server(self.tokenizer, self.config)

    # -- sources and prompts ----------------------------------------------------------------
    def check_model(self, model: str | None) -> None:
        try:
            super().check_model(model)
        except NotFoundError as exc:
            raise NeuronpediaError(str(exc), 404) from None

    @property
    def saes(self) -> dict[str, Any]:
        """The loaded SAEs by name (none where the engine does not load them)."""
        shape = getattr(self.engine, "model_shape", None)
        return dict(shape.saes) if shape is not None else {}

    def sae(self, source: str, field: str = "source") -> Any:
        saes = self.saes
        if source not in saes:
            raise NeuronpediaError(f"{field}: no SAE {source!r} is loaded; loaded: "
                                   f"{', '.join(sorted(saes)) or 'none'}.")
        return saes[source]

    def source_set(self, name: str) -> list[str]:
        """The loaded SAEs named `LAYER-name`, by layer."""
        found = [(int(m[1]), source) for source in self.saes
                 if (m := SOURCE.match(source)) and m[2] == name]
        return [source for _, source in sorted(found)]

    def feature_index(self, sae: Any, index: Any, field: str) -> int:
        try:
            value = int(index)
        except (TypeError, ValueError):
            raise NeuronpediaError(f"{field}: {index!r} is not a feature index.") from None
        if not 0 <= value < sae.d_sae:
            raise NeuronpediaError(f"{field}: feature {value} is out of range: {sae.name!r} has "
                                   f"{sae.d_sae} features.")
        return value

    def prompt(self, text: str, *, bos_text: bool = True) -> Prompt:
        """`text` tokenized as the activation routes read it: the BOS text prepended (where the
        tokenizer has one and `bos_text`), no other special tokens added; else the tokenizer's
        own defaults."""
        bos = self.tokenizer.bos_token
        if bos_text and bos and not text.startswith(bos):
            text = bos + text
        ids = list(self.tokenizer(text, add_special_tokens=not bos_text).input_ids)
        self.check_length(len(ids))
        return Prompt(ids, [self.tokenizer.decode([i]) for i in ids],
                      [i in self.special_ids for i in ids])

    def check_length(self, n: int, *, room: int = 1) -> None:
        if n == 0:
            raise NeuronpediaError("The prompt is empty.")
        if n + room > self.max_model_len:
            raise NeuronpediaError(f"Text too long: {n} tokens, max is "
                                   f"{self.max_model_len - room}")

    # -- the engine -------------------------------------------------------------------------
    async def run(self, ids: list[int], params: SamplingParams) -> AsyncIterator[Any]:
        """One engine request's outputs as they come (aborted if its consumer leaves)."""
        request_id = f"np-{secrets.token_hex(8)}"
        async for out in self.engine.generate({"prompt_token_ids": ids}, params, request_id):
            if out.finished and out.error:
                raise RuntimeError(out.error)
            yield out

    async def record(self, ids: list[int], hooks: list[str]) -> dict[str, torch.Tensor]:
        """The prompt's activations at `hooks` (full names), float32 [tokens, width] each."""
        params = SamplingParams(max_tokens=1, temperature=0, capture=CaptureParams(
            sites=list(dict.fromkeys(hooks)), positions=Positions("prompt")))
        out = await self._last(self.run(ids, params))
        assert out is not None and out.activations is not None
        tensors = out.activations.tensors
        return {hook: tensors[hook].to(torch.float32) for hook in hooks}

    async def encode(self, sae: Any, x: torch.Tensor) -> torch.Tensor:
        """SAELens's `encode` of rows x [tokens, d_in] -> [tokens, d_sae], off the loop."""
        return await asyncio.to_thread(sae.encode, x, c_products.invariant_linear())

    async def feature_acts(self, prompt: Prompt, sources: list[str]) -> dict[str, torch.Tensor]:
        saes = {source: self.sae(source) for source in sources}
        rows = await self.record(prompt.ids, [sae.hook_name for sae in saes.values()])
        return {source: await self.encode(sae, rows[sae.hook_name])
                for source, sae in saes.items()}

    # -- activation/all ---------------------------------------------------------------------
    async def activation_all(self, request: ActivationAllRequest) -> dict[str, Any]:
        return await self.one(request, self._all)

    async def activation_all_batch(self, request: ActivationAllBatchRequest) -> dict[str, Any]:
        return await self.each(request, self._all)

    async def _all(self, text: str, request: Any) -> dict[str, Any]:
        sources = self.selected(request.source_set, request.selected_sources)
        num = DEFAULT_NUM_RESULTS if request.num_results is None else request.num_results
        if num < 1:
            raise NeuronpediaError(f"num_results must be at least 1, got {num}.")
        num = min(num, MAX_NUM_RESULTS)
        prompt = self.prompt(text)
        bad = [i for i in request.sort_by_token_indexes if not 0 <= i < len(prompt.ids)]
        if bad:
            raise NeuronpediaError(f"Sort by token index {bad[0]} is out of range for the given "
                                   f"prompt, which only has {len(prompt.ids)} tokens.")
        acts = await self.feature_acts(prompt, sources)
        return {"activations": top_features(acts, request.sort_by_token_indexes,
                                            request.ignore_bos, num),
                "tokens": prompt.tokens}

    def selected(self, source_set: str, selected: list[str]) -> list[str]:
        in_set = self.source_set(source_set)
        if not in_set:
            raise NeuronpediaError("Invalid source set")
        outside = [s for s in selected if s not in in_set]
        if outside:
            raise NeuronpediaError(f"selected_sources: {outside[0]!r} is not a loaded source of "
                                   f"the set {source_set!r} ({', '.join(in_set)}).")
        return list(dict.fromkeys(selected)) or in_set

    async def one(self, request: Any, read: Reader) -> dict[str, Any]:
        """An activation route's answer for its `prompt`."""
        self.check_model(request.model)
        return await read(request.prompt, request)

    async def each(self, request: Any, read: Reader) -> dict[str, Any]:
        """A batch route's: `results`, one per prompt, read side by side in the engine."""
        self.check_model(request.model)
        if not request.prompts:
            raise NeuronpediaError("At least one prompt is required")
        if len(request.prompts) > MAX_BATCH_PROMPTS:
            raise NeuronpediaError(f"Batch size {len(request.prompts)} exceeds maximum of "
                                   f"{MAX_BATCH_PROMPTS}")
        return {"results": await together(read(p, request) for p in request.prompts)}

    # -- activation/single ------------------------------------------------------------------
    async def activation_single(self, request: ActivationSingleRequest) -> dict[str, Any]:
        return await self.one(request, self._single)

    async def activation_single_batch(self, request: ActivationSingleBatchRequest
                                      ) -> dict[str, Any]:
        return await self.each(request, self._single)

    async def _single(self, text: str, request: Any) -> dict[str, Any]:
        by_feature = request.source is not None and request.index is not None
        if by_feature == (request.vector is not None and request.hook is not None):
            raise NeuronpediaError("Invalid request data: exactly one of layer/index or vector "
                                   "must be provided")
        if by_feature:
            sae = self.sae(request.source)
            index = self.feature_index(sae, request.index, "index")
            prompt = self.prompt(text)
            acts = (await self.feature_acts(prompt, [request.source]))[request.source]
            values = acts[:, index].tolist()
            bos = [i for i, t in enumerate(prompt.ids) if t == self.tokenizer.bos_token_id]
            for i in bos:  # Neuronpedia's: BOS positions read 0, a leading one is dropped
                values[i] = 0.0
            if bos:
                values = values[1:]
        else:
            prompt = self.prompt(text, bos_text=False)
            vector = torch.tensor(request.vector, dtype=torch.float32)
            self.check_finite(vector, "vector")
            rows = await self.recorded_hook(prompt.ids, request.hook)
            if rows.shape[-1] != vector.numel():
                raise NeuronpediaError(f"vector: {vector.numel()} numbers, but {request.hook} "
                                       f"is {rows.shape[-1]} wide.")
            values = (rows @ vector).tolist()
        if not values:
            raise NeuronpediaError("The prompt has no tokens beyond BOS.")
        skip = len(prompt.tokens) - len(values)
        best = max(values)
        return {"activation": {"values": values, "max_value": best,
                               "max_value_index": values.index(best)},
                "tokens": prompt.tokens[skip:], "tokens_is_special": prompt.special[skip:]}

    async def recorded_hook(self, ids: list[int], hook: str) -> torch.Tensor:
        try:
            CaptureParams.parse([hook])
            if not re.match(r"^blocks\.\d+\.", hook):
                raise Refused(f"hook: {hook!r} names no layer (blocks.L.hook_...).")
            return (await self.record(ids, [hook]))[hook]
        except Refused as exc:
            raise NeuronpediaError(f"hook: {exc}") from None
        except KeyError:
            raise NeuronpediaError(f"hook: {hook!r} is not a hook of this model.") from None

    # -- activation/topk-by-token -----------------------------------------------------------
    async def topk_by_token(self, request: ActivationTopkByTokenRequest) -> dict[str, Any]:
        return await self.one(request, self._topk)

    async def topk_by_token_batch(self, request: ActivationTopkByTokenBatchRequest
                                  ) -> dict[str, Any]:
        return await self.each(request, self._topk)

    async def _topk(self, text: str, request: Any) -> dict[str, Any]:
        sae = self.sae(request.source)
        top_k = DEFAULT_TOP_K if request.top_k is None else request.top_k
        if top_k < 1:
            raise NeuronpediaError(f"top_k must be at least 1, got {top_k}.")
        k = min(top_k, sae.d_sae)  # Neuronpedia's: clamped to the SAE's features
        prompt = self.prompt(text)
        acts = (await self.feature_acts(prompt, [request.source]))[request.source]
        values, indices = torch.sort(acts, dim=-1, descending=True, stable=True)
        first = 1 if request.ignore_bos else 0
        results = [{"token_position": p, "token": prompt.tokens[p],
                    "is_special": prompt.special[p],
                    "top_features": [{"feature_index": i, "activation_value": v} for i, v in
                                     zip(indices[p, :k].tolist(), values[p, :k].tolist())]}
                   for p in range(first, len(prompt.ids))]
        return {"results": results, "tokens": prompt.tokens[first:]}

    # -- steering ---------------------------------------------------------------------------
    async def steer_completion(self, request: SteerCompletionRequest
                               ) -> dict[str, Any] | AsyncIterator[str]:
        self.check_model(request.model)
        vectors = self.steering(request)
        prompt = self.prompt(request.prompt)
        runs = self.runs(request, prompt.ids, vectors, steered=None)
        build = lambda outputs: {"outputs": [  # noqa: E731
            {"type": t, "output": o.text, **o.logprobs()} for t, o in outputs]}
        return await self.answer(request, runs, build)

    async def steer_completion_chat(self, request: SteerCompletionChatRequest
                                    ) -> dict[str, Any] | AsyncIterator[str]:
        self.check_model(request.model)
        if request.is_assistant_axis:
            raise NeuronpediaError("is_assistant_axis: persona monitoring is not computed here.")
        vectors = self.steering(request)
        messages = [{"role": m.role, "content": m.content} for m in request.prompt]
        try:
            text = self.chat.render([ChatMessageParam(role=m.role, content=m.content)
                                     for m in request.prompt]).prompt
        except Refused as exc:
            raise NeuronpediaError(str(exc)) from None
        ids = list(self.tokenizer(text, add_special_tokens=False).input_ids)
        self.check_length(len(ids))
        steered = None if request.steer_special_tokens else [
            p for p, i in enumerate(ids) if i not in self.special_ids]
        runs = self.runs(request, ids, vectors, steered)
        raw = self.tokenizer.decode(ids)
        build = lambda outputs: {  # noqa: E731
            "outputs": [{"type": t, "raw": text + o.text, "chat_template": [
                *messages, {"role": "assistant", "content": o.text}], **o.logprobs()}
                for t, o in outputs],
            "input": {"raw": raw, "chat_template": messages}}
        return await self.answer(request, runs, build)

    def steering(self, request: Any) -> list[tuple[str, str, torch.Tensor]]:
        """What STEERED adds, checked: (the item's field, its hook, vector * strength)."""
        if (request.features is not None) == (request.vectors is not None):
            raise NeuronpediaError("Invalid request data: exactly one of features or vectors "
                                   "must be provided")
        if not request.types or len(set(request.types)) != len(request.types):
            raise NeuronpediaError("types: name STEERED and/or DEFAULT, each once.")
        for name in ("temperature", "strength_multiplier", "freq_penalty", "seed"):
            if not math.isfinite(getattr(request, name)):
                raise NeuronpediaError(f"{name} must be a finite number.")
        if "STEERED" not in request.types:
            return []
        if request.steer_method != "SIMPLE_ADDITIVE":
            raise NeuronpediaError(f"steer_method: {request.steer_method} is not computed here; "
                                   "SIMPLE_ADDITIVE is.")
        out = []
        for i, item in enumerate(request.features or request.vectors):
            where = f"{'features' if request.features is not None else 'vectors'}[{i}]"
            if request.features is not None:
                self.check_model(item.model)
                sae = self.sae(item.source, f"{where}.source")
                index = self.feature_index(sae, item.index, f"{where}.index")
                # at the hook its decoder writes (a transcoder's output hook)
                hook = sae.hook_name_out or sae.hook_name
                vector = sae.weights["W_dec"][index].to(torch.float32)
                if item.steering_vector is not None and not torch.allclose(
                        torch.tensor(item.steering_vector), vector, rtol=1e-5, atol=1e-6):
                    raise NeuronpediaError(f"{where}.steering_vector differs from the feature's "
                                           "decoder row, which is what steers: leave it out, "
                                           "or steer by `vectors`.")
            else:
                hook, vector = item.hook, torch.tensor(item.steering_vector, dtype=torch.float32)
            self.check_finite(vector, f"{where}.steering_vector")
            if not math.isfinite(item.strength):
                raise NeuronpediaError(f"{where}.strength must be a finite number.")
            if request.normalize_steering:
                norm = vector.norm()
                if norm == 0:
                    raise NeuronpediaError(f"{where}: a zero vector cannot be normalised.")
                vector = vector / norm
            out.append((where, hook, vector * (request.strength_multiplier * item.strength)))
        return out

    @staticmethod
    def check_finite(vector: torch.Tensor, field: str) -> None:
        if vector.numel() == 0 or not torch.isfinite(vector).all():
            raise NeuronpediaError(f"{field} must be a non-empty list of finite numbers.")

    def runs(self, request: Any, ids: list[int], vectors: list[tuple[str, str, torch.Tensor]],
             steered: list[int] | None) -> dict[str, AsyncIterator[Any]]:
        """Each asked type's engine request (STEERED with the vectors added at `steered`
        prompt positions and every generated one; None: every position)."""
        room = self.max_model_len - len(ids)
        if room < 1:
            raise NeuronpediaError(f"No room to generate: the prompt is {len(ids)} tokens and "
                                   f"the per-request budget (prompt + completion) is "
                                   f"{self.max_model_len}. Shorten the prompt.")
        if request.n_completion_tokens < 1:
            raise NeuronpediaError("n_completion_tokens must be at least 1.")
        interventions, fields = [], []
        for where, hook, vector in vectors:
            for positions in ([None] if steered is None else
                              ([steered] if steered else []) + ["generated"]):
                try:
                    interventions.append(Intervention.parse({
                        "site": hook, "op": "add", "vector": vector, "positions": positions}, 0))
                except Refused as exc:
                    raise NeuronpediaError(f"{where}.hook: {exc.message}") from None
                fields.append(where)
        runs = {}
        for kind in request.types:
            params = SamplingParams(
                max_tokens=min(request.n_completion_tokens, room),
                temperature=request.temperature, seed=int(request.seed),
                frequency_penalty=request.freq_penalty, logprobs=request.n_logprobs or None,
                interventions=interventions if kind == "STEERED" and interventions else None)
            try:
                self.engine.check_inputs("np-check", {"prompt_token_ids": ids}, params)
            except Refused as exc:  # a vector the hook cannot take: say which item it is
                at = re.match(r"interventions\[(\d+)\]", exc.parameter or "")
                if at is None:
                    raise
                raise NeuronpediaError(f"{fields[int(at[1])]}: its vector does not fit its "
                                       f"hook ({exc.message})") from None
            runs[kind] = self.run(ids, params)
        return runs

    async def answer(self, request: Any, runs: dict[str, AsyncIterator[Any]],
                     build: Any) -> dict[str, Any] | AsyncIterator[str]:
        """The last frame, or (streaming) every frame as server-sent events."""
        n_logprobs = request.n_logprobs or 0
        if request.stream:
            return self._frames(runs, build, n_logprobs)
        finals = await together(self._last(run) for run in runs.values())
        return build([(kind, Generated(self, out, n_logprobs))
                      for kind, out in zip(runs, finals)])

    @staticmethod
    async def _last(run: AsyncIterator[Any]) -> Any:
        out = None
        async for out in run:  # noqa: B007 - the last one is the answer
            pass
        return out

    async def _frames(self, runs: dict[str, AsyncIterator[Any]], build: Any,
                      n_logprobs: int) -> AsyncIterator[str]:
        latest: dict[str, Any] = dict.fromkeys(runs)
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

        async def pump(kind: str, run: AsyncIterator[Any]) -> None:
            try:
                async for out in run:
                    await queue.put((kind, out))
            except Exception as exc:  # noqa: BLE001 - ends the stream with the error
                await queue.put((kind, exc))
            await queue.put((kind, None))

        tasks = [asyncio.create_task(pump(kind, run)) for kind, run in runs.items()]
        try:
            open_runs = len(tasks)
            while open_runs:
                kind, out = await queue.get()
                if out is None:
                    open_runs -= 1
                    continue
                if isinstance(out, Exception):
                    raise out
                latest[kind] = out
                yield "data: " + json.dumps(build([
                    (k, Generated(self, o, n_logprobs)) for k, o in latest.items()])) + "\n\n"
        finally:
            for task in tasks:
                task.cancel()

    # -- tokenize and the SAE utilities -----------------------------------------------------
    def tokenize(self, request: NPTokenizeRequest) -> dict[str, Any]:
        self.check_model(request.model)
        bos = self.tokenizer.bos_token_id
        prepend = bos is not None if request.prepend_bos is None else request.prepend_bos
        if prepend and bos is None:
            raise NeuronpediaError("prepend_bos: this model's tokenizer has no BOS token.")
        ids = ([bos] if prepend else []) + list(
            self.tokenizer(request.text, add_special_tokens=False).input_ids)
        if len(ids) > self.max_model_len:
            raise NeuronpediaError(f"Text too long: {len(ids)} tokens, max is "
                                   f"{self.max_model_len}")
        return {"tokens": ids, "token_strings": [self.tokenizer.decode([i]) for i in ids],
                "prepend_bos": prepend}

    def sae_vector(self, request: UtilSaeVectorRequest) -> dict[str, Any]:
        self.check_model(request.model)
        sae = self.sae(request.source)
        index = self.feature_index(sae, request.index, "index")
        return {"vector": sae.weights["W_enc"][:, index].tolist(), "hookName": sae.hook_name}

    def topk_by_decoder_cossim(self, request: UtilSaeTopkByDecoderCossimRequest
                               ) -> dict[str, Any]:
        self.check_model(request.model)
        if (request.feature is None) == (request.vector is None):
            raise NeuronpediaError("Invalid request data: exactly one of feature or vector must "
                                   "be provided")
        sae = self.sae(request.source)
        w_dec = sae.weights["W_dec"]
        if request.feature is not None:
            query = w_dec[self.feature_index(sae, request.feature.index, "feature.index")]
        else:
            query = torch.tensor(request.vector, dtype=torch.float32)
            self.check_finite(query, "vector")
            if query.numel() != sae.d_in:
                raise NeuronpediaError(f"vector: {query.numel()} numbers, but {sae.name!r} "
                                       f"reads {sae.d_in}.")
        if request.num_results < 1:
            raise NeuronpediaError(f"num_results must be at least 1, got {request.num_results}.")
        cosines = (w_dec @ query) / (w_dec.norm(dim=1) * query.norm()).clamp_min(1e-8)
        cosines = torch.nan_to_num(cosines, nan=float("-inf"))
        k = min(request.num_results, MAX_COSSIM_RESULTS, sae.d_sae)
        values, indices = torch.sort(cosines, descending=True, stable=True)
        return {**({"feature": request.feature.model_dump()} if request.feature else {}),
                "topk_decoder_cossim_features": [
                    {"feature": {"model": request.model, "source": request.source, "index": i},
                     "cosine_similarity": v if math.isfinite(v) else 0.0}
                    for i, v in zip(indices[:k].tolist(), values[:k].tolist())]}


async def together(coroutines: Iterable[Awaitable[Any]]) -> list[Any]:
    """Every result in order; the first failure cancels (so aborts) the others and is raised."""
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(c) for c in coroutines]  # type: ignore[var-annotated,arg-type]
    except BaseExceptionGroup as failed:
        raise failed.exceptions[0] from None
    return [task.result() for task in tasks]


class Generated:
    """One type's output so far: its text, and its logprobs in Neuronpedia's form."""

    def __init__(self, serving: NeuronpediaServing, out: Any, n_logprobs: int):
        self.completion = out.outputs[0] if out is not None else None
        self.text = self.completion.text if self.completion is not None else ""
        self.serving, self.n = serving, n_logprobs

    def logprobs(self) -> dict[str, Any]:
        if not self.n or self.completion is None or self.completion.logprobs is None:
            return {}
        decode = self.serving.tokenizer.decode
        rows = []
        for token, position in zip(self.completion.token_ids, self.completion.logprobs):
            top = sorted((lp.rank or 0, i, lp.logprob) for i, lp in position.items()
                         if lp.rank is not None and lp.rank <= self.n)
            rows.append({"token": decode([token]), "logprob": position[token].logprob,
                         "top_logprobs": [{"token": decode([i]), "logprob": v}
                                          for _, i, v in top]})
        return {"logprobs": rows}


def top_features(acts: dict[str, torch.Tensor], sort_by: list[int], ignore_bos: bool,
                 num: int) -> list[dict[str, Any]]:
    """`activation/all`'s ranking: over every source's features [tokens, d_sae], the `num`
    with the largest activation anywhere (the largest sum at `sort_by` where given), stably
    (ties in source order, then feature order)."""
    candidates: list[tuple[float, int, int, str, torch.Tensor, float, int, float]] = []
    for order, (source, a) in enumerate(acts.items()):
        if ignore_bos:
            a = a.clone()
            a[0] = 0
        maxima, where = a.max(dim=0)
        sums = a[sort_by].sum(dim=0) if sort_by else torch.zeros_like(maxima)
        keys, best = torch.sort(sums if sort_by else maxima, descending=True, stable=True)
        for key, i in zip(keys[:num].tolist(), best[:num].tolist()):
            candidates.append((key, order, i, source, a, float(maxima[i]), int(where[i]),
                               float(sums[i])))
    candidates.sort(key=lambda c: (-c[0], c[1], c[2]))
    return [{"source": source, "index": i, "values": a[:, i].tolist(), "sum_values": total,
             "max_value": top, "max_value_index": at}
            for _, _, i, source, a, top, at, total in candidates[:num]]
