"""How the OpenAI-compatible layer behaves: `ServerConfig`, frozen, built once per server.

It holds what the serving layer decides on its own, apart from the engine: the names the
model is served under, the chat template and its trust rule, logging, the API key. The CLI
(`workbench serve`) and `serve_in_kernel` build one; the serving objects only read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from workbench.errors import ValidationError
from workbench.serving.reasoning import get_reasoning_parser
from workbench.serving.tool_parsers import get_tool_parser


@dataclass(frozen=True)
class ServerConfig:
    """Settings of one OpenAI-compatible server.

    >>> ServerConfig(served_model_names=("smollm2",)).response_role
    'assistant'
    """

    served_model_names: tuple[str, ...] = ()  # empty: the engine's served name
    api_keys: tuple[str, ...] = ()  # empty: no authentication
    chat_template: str | None = None  # jinja text (a path is read by the CLI)
    trust_request_chat_template: bool = False
    default_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    response_role: str = "assistant"
    return_tokens_as_token_ids: bool = False
    enable_log_requests: bool = False
    max_log_len: int | None = None
    log_error_stack: bool = False
    enable_force_include_usage: bool = False
    responses_store_size: int = 1000  # stored /v1/responses per app (LRU); 0: no store
    enable_auto_tool_choice: bool = False  # tool_choice "auto" (needs tool_call_parser)
    tool_call_parser: str | None = None  # a name of workbench.serving.tool_parsers
    reasoning_parser: str | None = None  # a name of workbench.serving.reasoning
    enable_prompt_embeds: bool = False  # accept `prompt_embeds` on /v1/completions
    # limits and security (docs/limits-and-security.md)
    api_key_exempt: tuple[str, ...] = ("health", "metrics")  # first path segments left open
    max_request_body_bytes: int = 8 * 2**20  # larger bodies: 413
    max_waiting_requests: int | None = None  # a full waiting queue: 503 + Retry-After
    request_timeout: float | None = None  # seconds; a request running longer is aborted (504)
    shutdown_timeout: float = 10.0  # seconds in-flight requests get to finish on shutdown
    otlp_traces_endpoint: str | None = None  # OpenTelemetry spans over OTLP (serving/tracing.py)
    # LoRA adapters served by name (workbench.serving.lora; the engine needs enable_lora)
    lora_modules: tuple[Any, ...] = ()  # "name=path", JSON text, dicts or LoRAModulePath
    default_mm_loras: dict[str, str] = field(default_factory=dict)  # content type -> path
    lora_resolver_dirs: tuple[str, ...] = ()  # directories resolved adapters may come from
    lora_load_dirs: tuple[str, ...] = ()  # /v1/load_lora_adapter paths must lie in these (or the above)
    allow_runtime_lora_updating: bool | None = None  # None: VLLM_ALLOW_RUNTIME_LORA_UPDATING
    # vLLM's optional routes and fields (`workbench/http/routes/extras.py`)
    root_path: str = ""  # behind a path-prefix proxy: routes answer with and without it
    enable_tokenizer_info_endpoint: bool = False  # GET /tokenizer_info
    enable_server_load_tracking: bool = False  # GET /load counts requests in flight
    enable_prompt_tokens_details: bool = False  # usage.prompt_tokens_details.cached_tokens

    def __post_init__(self) -> None:
        if isinstance(self.api_key_exempt, str):
            object.__setattr__(self, "api_key_exempt", (self.api_key_exempt,))
        for name in ("max_request_body_bytes", "max_waiting_requests", "request_timeout"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValidationError(f"{name} must be positive, got {value}.", parameter=name,
                                      value=value)
        if not self.shutdown_timeout >= 0:
            raise ValidationError(f"shutdown_timeout must be non-negative, got "
                                  f"{self.shutdown_timeout}.", parameter="shutdown_timeout",
                                  value=self.shutdown_timeout)
        if isinstance(self.served_model_names, str):
            object.__setattr__(self, "served_model_names", (self.served_model_names,))
        if isinstance(self.api_keys, str):
            object.__setattr__(self, "api_keys", (self.api_keys,))
        if any(not name for name in self.served_model_names):
            raise ValidationError("served model names must be non-empty strings.",
                                  parameter="served_model_names", value=self.served_model_names)
        _check_parsers(self)
        if self.responses_store_size < 0:
            raise ValidationError("responses_store_size must be non-negative, got "
                                  f"{self.responses_store_size}.", parameter="responses_store_size",
                                  value=self.responses_store_size)
        if self.max_log_len is not None and self.max_log_len < 0:
            raise ValidationError(f"max_log_len must be non-negative, got {self.max_log_len}.",
                                  parameter="max_log_len", value=self.max_log_len)


def _check_parsers(config: ServerConfig) -> None:
    """Parser names exist (the reference's messages, listing the valid ones)."""
    if config.enable_auto_tool_choice and not config.tool_call_parser:
        raise ValidationError("--enable-auto-tool-choice requires --tool-call-parser",
                              parameter="tool_call_parser")
    for name, get in (("tool_call_parser", get_tool_parser),
                      ("reasoning_parser", get_reasoning_parser)):
        value = getattr(config, name)
        if value is None:
            continue
        try:
            get(value)
        except KeyError as exc:
            raise ValidationError(exc.args[0], parameter=name, value=value) from None
