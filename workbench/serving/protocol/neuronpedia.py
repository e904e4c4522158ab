"""The request bodies of Neuronpedia's inference API (`neuronpedia-inference-client` 1.10's
`models/`), as its server reads them: the fields it defines, each with its type; any other
name is refused (422, FastAPI's `{"detail": [...]}` naming it, as that server answers a body
its schema rejects). What each route does with them: `workbench.serving.neuronpedia`."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

SteerType = Literal["STEERED", "DEFAULT"]
SteerMethod = Literal["SIMPLE_ADDITIVE", "ORTHOGONAL_DECOMP", "PROJECTION_CAP"]


class NPRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Activations(NPRequest):
    model: str


class ActivationAllRequest(_Activations):
    prompt: str
    source_set: str
    selected_sources: list[str]
    sort_by_token_indexes: list[int]
    ignore_bos: bool
    num_results: int | None = None


class ActivationAllBatchRequest(_Activations):
    prompts: list[str]
    source_set: str
    selected_sources: list[str]
    sort_by_token_indexes: list[int]
    ignore_bos: bool
    num_results: int | None = None


class ActivationSingleRequest(_Activations):
    prompt: str
    source: str | None = None
    index: str | None = None  # a string on the wire, as Neuronpedia's schema has it
    vector: list[float] | None = None
    hook: str | None = None


class ActivationSingleBatchRequest(_Activations):
    prompts: list[str]
    source: str | None = None
    index: str | None = None
    vector: list[float] | None = None
    hook: str | None = None


class ActivationTopkByTokenRequest(_Activations):
    prompt: str
    source: str
    top_k: int | None = None
    ignore_bos: bool


class ActivationTopkByTokenBatchRequest(_Activations):
    prompts: list[str]
    source: str
    top_k: int | None = None
    ignore_bos: bool


class NPFeature(NPRequest):
    model: str
    source: str
    index: int


class NPSteerFeature(NPFeature):
    strength: float
    steering_vector: list[float] | None = None  # ignored by Neuronpedia too: W_dec[index] is


class NPSteerVector(NPRequest):
    steering_vector: list[float]
    strength: float
    hook: str


class NPSteerChatMessage(NPRequest):
    content: str
    role: str


class _Steer(NPRequest):
    model: str
    steer_method: SteerMethod
    normalize_steering: bool
    types: list[SteerType]
    features: list[NPSteerFeature] | None = None
    vectors: list[NPSteerVector] | None = None
    n_completion_tokens: int
    temperature: float = Field(ge=0)
    strength_multiplier: float
    freq_penalty: float
    seed: float
    stream: bool | None = None
    n_logprobs: int | None = Field(default=None, ge=0, le=10)


class SteerCompletionRequest(_Steer):
    prompt: str


class SteerCompletionChatRequest(_Steer):
    prompt: list[NPSteerChatMessage]
    steer_special_tokens: bool
    is_assistant_axis: bool | None = None


class NPTokenizeRequest(NPRequest):
    model: str
    text: str
    prepend_bos: bool | None = None


class UtilSaeVectorRequest(NPRequest):
    model: str
    source: str
    index: int


class UtilSaeTopkByDecoderCossimRequest(NPRequest):
    model: str
    source: str
    num_results: int
    feature: NPFeature | None = None
    vector: list[float] | None = None
