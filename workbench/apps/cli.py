"""`workbench`: the command line. `serve` runs the OpenAI-compatible server, `bench` the benchmark.

Flags follow `vllm serve` (docs/serving.md lists them). Unknown tool or reasoning
parser names stop the command at start-up, listing the valid ones, and LoRA flags without
`--enable-lora` stop it as well.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from dataclasses import replace
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from workbench.apps import bench
from workbench.config import EngineConfig
from workbench.errors import ValidationError
from workbench.models import DEFAULT_MODEL, resolve_model


def _json_dict(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return value


def _serve_parser(sub: Any) -> argparse.ArgumentParser:
    return add_server_flags(sub.add_parser("serve", help="serve a model over the "
                                           "OpenAI-compatible API"))


def add_server_flags(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """`serve`'s flags (also `run-batch`'s: the same engine and server)."""
    p.add_argument("model_tag", nargs="?", default=None, help="model (same as --model)")
    p.add_argument("--model", default=None, help="alias or local model directory "
                   "(default: smollm2-135m-instruct)")
    p.add_argument("--served-model-name", nargs="+", default=None,
                   help="names the API accepts; the first is reported (default: the alias or "
                   "directory name)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--dtype", default="auto",
                   choices=["auto", "float32", "bfloat16", "float16", "gguf"],
                   help="gguf: a GGUF model's quantized blocks as the file holds them (CPU)")
    p.add_argument("--gguf-activations", default="float32", choices=["float32", "q8"],
                   help="with --dtype gguf, the activations the blocks meet: float32 (exact to "
                   "the dequantized model) or q8 (llama.cpp's CPU arithmetic: activations "
                   "quantized per block to Q8_0 / Q8_1 / Q8_K as llama.cpp does, integer dot "
                   "products; faster)")
    p.add_argument("--kernel", default="auto",
                   choices=["auto", "avx2", "amx", "avx512bf16", "onednn", "torch"],
                   help="projection kernel (default: the fastest this CPU and dtype can run)")
    p.add_argument("--batch-invariant", action="store_true",
                   help="a request's tokens and logprobs the same bits whatever shares its "
                   "batch, however its prompt is chunked, with or without prefix-cache hits "
                   "(slower: `workbench bench` says by how much)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--kv-cache-memory", type=float, default=None, metavar="GB",
                   help="the KV cache's memory (default: what the machine has available after "
                   "the weights, times 0.9, at most what --max-num-seqs sequences of "
                   "--max-model-len take)")
    p.add_argument("--max-logprobs", type=int, default=20)
    p.add_argument("--max-capture-mb", type=float, default=None, metavar="N",
                   help="the most a request's `capture` and `logit_lens` may record, in MiB of "
                   "float32 (default 256); a request that could record more is refused (400)")
    p.add_argument("--steering-vectors", nargs="+", action="extend", default=None,
                   metavar="NAME=PATH",
                   help="steering vectors requests name in `interventions` "
                   '({"op": "add", "name": NAME}): each PATH a .pt, .npy, .safetensors or '
                   ".json file of one vector of the model's hidden size, read at start "
                   "(repeatable)")
    p.add_argument("--sae", action="append", default=None, metavar="NAME=PATH",
                   help="a sparse autoencoder requests read (`features`) and steer by "
                   '(`interventions`: {"feature": {"sae": NAME, "index": i}}): PATH a folder in '
                   "SAELens's format (cfg.json, sae_weights.safetensors), checked against the "
                   "model at start (repeatable)")
    p.add_argument("--classifier-labels", nargs="+", default=None, metavar="WORD",
                   help="label words a generative model classifies and scores with (one token "
                   "each; the last is the positive one for /score and /rerank; default: no yes)")
    p.add_argument("--api-key", nargs="+", default=None,
                   help="require `Authorization: Bearer KEY` on every route except the "
                   "--api-key-exempt ones")
    p.add_argument("--api-key-exempt", nargs="*", default=["health", "metrics"],
                   metavar="SEGMENT", help="first path segments left open with --api-key "
                   "(default: health metrics; give none to guard everything)")
    p.add_argument("--max-request-body-bytes", type=int, default=8 * 2**20,
                   help="larger request bodies are refused with 413 (default 8 MiB)")
    p.add_argument("--max-waiting-requests", type=int, default=None,
                   help="when this many requests wait, new ones get 503 + Retry-After")
    p.add_argument("--request-timeout", type=float, default=None, metavar="SECONDS",
                   help="abort a request running longer than this (504)")
    p.add_argument("--shutdown-timeout", type=float, default=10.0, metavar="SECONDS",
                   help="on SIGTERM, in-flight requests get this long to finish (default 10)")
    p.add_argument("--otlp-traces-endpoint", default=None, metavar="URL",
                   help="export one OpenTelemetry span per request over OTLP (gRPC) to URL "
                        "(needs the tracing extra)")
    p.add_argument("--chat-template", default=None, help="jinja file path or inline template")
    p.add_argument("--default-chat-template-kwargs", type=_json_dict, default=None)
    p.add_argument("--trust-request-chat-template", action="store_true")
    p.add_argument("--response-role", default="assistant")
    p.add_argument("--return-tokens-as-token-ids", action="store_true")
    p.add_argument("--enable-force-include-usage", action="store_true")
    p.add_argument("--enable-prompt-embeds", action="store_true",
                   help="accept `prompt_embeds` (base64 torch.save tensors) on /v1/completions")
    p.add_argument("--enable-log-requests", action="store_true")
    p.add_argument("--max-log-len", type=int, default=None)
    p.add_argument("--log-error-stack", action="store_true")
    p.add_argument("--enable-auto-tool-choice", action="store_true")
    p.add_argument("--tool-call-parser", default=None)
    p.add_argument("--reasoning-parser", default=None)
    p.add_argument("--responses-store-size", type=int, default=1000, metavar="N",
                   help="stored /v1/responses (LRU) for previous_response_id and retrieval; "
                   "0 disables storing (default 1000)")
    # vLLM's optional routes and fields (workbench/http/routes/extras.py)
    p.add_argument("--root-path", default="",
                   help="path prefix of a proxy in front: routes answer with and without it")
    p.add_argument("--enable-tokenizer-info-endpoint", action="store_true",
                   help="serve GET /tokenizer_info (init kwargs, class, chat template)")
    p.add_argument("--enable-server-load-tracking", action="store_true",
                   help="GET /load counts the inference requests in flight")
    p.add_argument("--enable-prompt-tokens-details", action="store_true",
                   help="usage.prompt_tokens_details.cached_tokens (prefix-cache hits)")
    p.add_argument("--enable-lora", action="store_true", help="serve LoRA adapters")
    p.add_argument("--lora-modules", nargs="+", default=None, metavar="NAME=PATH",
                   help='adapters served as models: NAME=PATH or JSON {"name": ..., "path": ..., '
                   '"base_model_name": ...}')
    p.add_argument("--max-loras", type=int, default=None,
                   help="distinct adapters in one batch (default 1)")
    p.add_argument("--max-lora-rank", type=int, default=None, help="default 16")
    p.add_argument("--max-cpu-loras", type=int, default=None,
                   help="adapters kept loaded in memory (default: --max-loras)")
    p.add_argument("--default-mm-loras", type=_json_dict, default=None,
                   help='JSON {CONTENT_TYPE: PATH}: a chat request whose content parts match '
                   'exactly one runs with it')
    p.add_argument("--lora-resolver-dir", nargs="+", default=None, metavar="DIR",
                   help="a request naming an unknown model NAME loads DIR/NAME (needs "
                   "VLLM_ALLOW_RUNTIME_LORA_UPDATING=1)")
    p.add_argument("--lora-load-dir", nargs="+", default=None, metavar="DIR",
                   help="directories /v1/load_lora_adapter may load from (with the resolver "
                   "directories); any other lora_path is refused")
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="workbench", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    sub.add_parser("bench", help="engine vs transformers (see `workbench bench --help`)",
                   add_help=False)
    sub.add_parser("run-batch", help="an OpenAI Batch file through the server's routes "
                   "(see `workbench run-batch --help`)", add_help=False)
    sub.add_parser("capture", help="a dataset's activations and scores into shards "
                   "(see `workbench capture --help`)", add_help=False)
    sub.add_parser("feature-dashboards", help="an SAE's feature dashboards over a dataset "
                   "(see `workbench feature-dashboards --help`)", add_help=False)
    sub.add_parser("train-sae", help="an SAE trained with SAELens on a capture's rows "
                   "(see `workbench train-sae --help`)", add_help=False)
    return parser


def read_chat_template(value: str | None) -> str | None:
    """A path is read; text with jinja markup is the template; anything else is an error."""
    if value is None:
        return None
    if os.path.isfile(value):
        with open(value, encoding="utf-8") as f:
            template = f.read()
    elif any(mark in value for mark in ("{{", "{%")):
        template = value
    else:
        raise ValueError(f"The supplied chat template ({value}) looks like a file path, but it "
                         "failed to be opened.")
    try:
        ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"]).parse(template)
    except TemplateError as exc:
        raise ValueError(f"The chat template is not valid jinja: {exc}") from exc
    return template


def configs_from_args(args: argparse.Namespace):
    """(EngineConfig, ServerConfig) from parsed `serve` flags; raises ValueError on bad ones."""
    # deferred: workbench.serving imports torch; `workbench --help` and `bench` stay light
    from workbench.serving.config import ServerConfig

    model = args.model or args.model_tag or DEFAULT_MODEL
    names = tuple(args.served_model_name or (resolve_model(model, prepare=False).served_name,))
    engine_kwargs = {"max_num_seqs": args.max_num_seqs} if args.max_num_seqs else {}
    engine_kwargs.update(lora_engine_kwargs(args))
    if args.classifier_labels:
        engine_kwargs["classifier_labels"] = tuple(args.classifier_labels)
    if args.max_capture_mb is not None:
        engine_kwargs["max_capture_mb"] = args.max_capture_mb
    if args.kv_cache_memory is not None:
        engine_kwargs["kv_cache_memory_gb"] = args.kv_cache_memory
    if args.steering_vectors:
        engine_kwargs["steering_vectors"] = parse_named_paths(args.steering_vectors,
                                                              "--steering-vectors")
    if args.sae:
        engine_kwargs["saes"] = parse_named_paths(args.sae, "--sae", folders=True)
    engine = EngineConfig(model=model, dtype=args.dtype, gguf_activations=args.gguf_activations,
                          kernel=args.kernel, device=args.device,
                          seed=args.seed, batch_invariant=args.batch_invariant,
                          max_model_len=args.max_model_len, max_logprobs=args.max_logprobs,
                          served_model_name=names[0], **engine_kwargs)
    server = ServerConfig(
        served_model_names=names,
        api_keys=tuple(args.api_key or filter(None, [os.environ.get("VLLM_API_KEY")])),
        api_key_exempt=tuple(args.api_key_exempt),
        max_request_body_bytes=args.max_request_body_bytes,
        max_waiting_requests=args.max_waiting_requests, request_timeout=args.request_timeout,
        shutdown_timeout=args.shutdown_timeout, otlp_traces_endpoint=args.otlp_traces_endpoint,
        chat_template=read_chat_template(args.chat_template),
        trust_request_chat_template=args.trust_request_chat_template,
        default_chat_template_kwargs=args.default_chat_template_kwargs or {},
        response_role=args.response_role,
        return_tokens_as_token_ids=args.return_tokens_as_token_ids,
        enable_log_requests=args.enable_log_requests, max_log_len=args.max_log_len,
        log_error_stack=args.log_error_stack,
        enable_auto_tool_choice=args.enable_auto_tool_choice,
        tool_call_parser=args.tool_call_parser, reasoning_parser=args.reasoning_parser,
        enable_force_include_usage=args.enable_force_include_usage,
        enable_prompt_embeds=args.enable_prompt_embeds,
        responses_store_size=args.responses_store_size, root_path=args.root_path,
        enable_tokenizer_info_endpoint=args.enable_tokenizer_info_endpoint,
        enable_server_load_tracking=args.enable_server_load_tracking,
        enable_prompt_tokens_details=args.enable_prompt_tokens_details)
    return engine, _with_loras(server, args)


def parse_named_paths(entries: list[str], flag: str, folders: bool = False
                      ) -> tuple[tuple[str, str], ...]:
    """`--steering-vectors NAME=PATH ...` / `--sae NAME=PATH` -> ((name, path), ...); a missing
    file (`folders`: folder) or a repeated name is an error here, a wrong-size vector or an SAE
    that does not fit the model when the engine loads the model."""
    found: dict[str, str] = {}
    exists, what = (os.path.isdir, "folder") if folders else (os.path.isfile, "file")
    for entry in entries:
        name, sep, path = entry.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"{flag} {entry!r}: expected NAME=PATH")
        if name in found:
            raise ValueError(f"{flag}: {name!r} given twice")
        if not exists(path):
            raise ValueError(f"{flag} {entry}: no such {what} {path!r}")
        found[name] = path
    return tuple(found.items())


LORA_FLAGS = ("lora_modules", "max_loras", "max_lora_rank", "max_cpu_loras", "default_mm_loras",
              "lora_resolver_dir", "lora_load_dir")


def lora_engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """EngineConfig fields of the LoRA flags; LoRA flags without --enable-lora are an error."""
    if not args.enable_lora:
        given = [f"--{n.replace('_', '-')}" for n in LORA_FLAGS if getattr(args, n) is not None]
        if given:
            raise ValueError(f"{', '.join(given)} need(s) --enable-lora")
        return {}
    kwargs: dict[str, Any] = {"enable_lora": True, "max_cpu_loras": args.max_cpu_loras}
    if args.max_loras is not None:
        kwargs["max_loras"] = args.max_loras
    if args.max_lora_rank is not None:
        kwargs["max_lora_rank"] = args.max_lora_rank
    return kwargs


def _with_loras(server: Any, args: argparse.Namespace) -> Any:
    """The ServerConfig with the served adapters of the LoRA flags (checked here)."""
    # deferred: workbench.serving imports torch; `workbench --help` and `bench` stay light
    from workbench.serving.lora import parse_lora_module, runtime_updating_allowed

    if not args.enable_lora:
        return server
    dirs = tuple(args.lora_resolver_dir or ())
    load_dirs = tuple(args.lora_load_dir or ())
    for flag, d in [*(("--lora-resolver-dir", d) for d in dirs),
                    *(("--lora-load-dir", d) for d in load_dirs)]:
        if not os.path.isdir(d):
            raise ValueError(f"{flag} {d}: not a directory")
    if dirs and not runtime_updating_allowed():
        raise ValueError("--lora-resolver-dir resolves adapters at run time: set "
                         "VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 to allow it")
    modules = tuple(parse_lora_module(m) for m in args.lora_modules or ())
    return replace(server, lora_modules=modules,
                   default_mm_loras=dict(args.default_mm_loras or {}), lora_resolver_dirs=dirs,
                   lora_load_dirs=load_dirs)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:  # its own flags belong to workbench.apps.bench
        return bench.main(argv[1:]) or 0
    if argv[:1] in (["run-batch"], ["capture"], ["feature-dashboards"], ["train-sae"]):
        # research at scale: workbench/apps/jobs_cli.py
        from workbench.apps import jobs_cli

        return jobs_cli.main(argv, add_server_flags, configs_from_args)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        engine_config, server_config = configs_from_args(args)
    except (ValueError, OSError) as exc:
        parser.exit(2, f"workbench serve: error: {exc}\n")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from workbench.http.server import run_server  # deferred: the server imports torch

    # non-zero when the engine loop died, so a supervisor restarts the server
    try:
        return run_server(engine_config, server_config, host=args.host, port=args.port) or 0
    except ValidationError as exc:  # the model or the engine's limits refused at load
        parser.exit(2, f"workbench serve: error: {exc.message}\n")


if __name__ == "__main__":
    sys.exit(main())
