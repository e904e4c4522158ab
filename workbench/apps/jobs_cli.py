"""`workbench run-batch`, `workbench capture`, `workbench feature-dashboards` and `workbench
train-sae`: research at scale from the command line.

`run-batch -i requests.jsonl -o results.jsonl` takes `serve`'s flags (the same engine and
server, `cli.add_server_flags`) and answers an OpenAI Batch file (`workbench/jobs/batch_file.py`);
`capture --model M --data FILE --capture SPEC --out DIR` runs a capture job
(`workbench/jobs/capture.py`); `feature-dashboards --sae DIR --data FILE --out DIR` an SAE's
dashboards (`workbench/jobs/dashboards.py`). Each: `--ray [ADDRESS] --replicas N` run on Ray
replicas. `train-sae --shards DIR --site HOOK --out DIR` trains an SAE with SAELens on a
capture job's rows and prints what it measured (`workbench/jobs/sae_training.py`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any


def _ray_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                   help="run on Ray engine replicas: a local Ray (no ADDRESS), or a cluster "
                   "('auto', 'ray://host:10001'); needs pip install 'workbench[ray]'")
    p.add_argument("--replicas", type=int, default=1, help="engine replicas with --ray "
                   "(default 1)")
    p.add_argument("--num-cpus-per-replica", type=float, default=1.0, metavar="N",
                   help="CPUs Ray reserves for each replica (default 1)")


def run_batch_parser(add_server_flags: Callable) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="workbench run-batch",
        description="Answer an OpenAI Batch file (custom_id, method, url, body per line) through "
        "the server's own routes; one output line per input line, in order.")
    p.add_argument("-i", "--input-file", required=True, help="the requests, JSONL")
    p.add_argument("-o", "--output-file", required=True, help="the results, JSONL")
    _ray_flags(p)
    p.add_argument("--lines-per-call", type=int, default=16,
                   help="lines a Ray replica takes at a time (default 16)")
    add_server_flags(p)
    return p


def capture_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="workbench capture",
        description="Run every document of a dataset through the model and write its "
        "activations (and per-token scores) to safetensors shards; rerun to resume.")
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--data", required=True, help="JSONL or Parquet file")
    p.add_argument("--capture", required=True, type=json.loads, metavar="SPEC",
                   help='a request\'s capture, e.g. \'{"sites": ["resid_post"], "layers": [0]}\'')
    p.add_argument("--out", required=True, help="output folder (reused: resume)")
    p.add_argument("--scores", action="store_true",
                   help="also each token's logprob, entropy, rank and margin")
    p.add_argument("--sae", action="append", default=[], metavar="NAME=PATH",
                   help="an SAE whose hooks the capture names (repeatable)")
    _job_flags(p)
    return p


def dashboards_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="workbench feature-dashboards",
        description="For every feature of an SAE over a dataset: its top activating contexts, "
        "samples across its activations, a histogram, its density and the tokens its decoder "
        "row raises and lowers, as Parquet; rerun to resume.")
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--sae", required=True, metavar="DIR", help="the SAE's folder (SAELens's "
                   "format)")
    p.add_argument("--data", required=True, help="JSONL or Parquet file")
    p.add_argument("--out", required=True, help="output folder (reused: resume)")
    p.add_argument("--skip-positions", type=int, default=1, metavar="N",
                   help="each document's first N positions left out (default 1: the attention "
                   "sink)")
    _job_flags(p)
    return p


def _job_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--text-column", default="text")
    p.add_argument("--chat-column", default=None, metavar="COLUMN",
                   help="conversations (messages) rendered with the chat template instead")
    p.add_argument("--id-column", default=None, help="document ids (default: a column id or "
                   "custom_id where every row has its own, else row numbers)")
    p.add_argument("--docs-per-shard", type=int, default=64)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--kernel", default="auto")
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--no-batch-invariant", action="store_true",
                   help="faster, but shards then depend on how documents were batched")
    _ray_flags(p)

def train_sae_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="workbench train-sae",
        description="Train a sparse autoencoder with SAELens on a capture job's rows of one "
        "hook, save it in SAELens's format and report L0, the fraction of variance "
        "unexplained, dead features and the next-token loss with it spliced in (needs pip "
        "install 'workbench[train]').")
    p.add_argument("--shards", required=True, metavar="DIR", help="a capture job's folder")
    p.add_argument("--site", required=True, metavar="HOOK",
                   help="a captured hook, e.g. blocks.15.hook_resid_post")
    p.add_argument("--out", required=True, metavar="DIR", help="a new or empty folder")
    p.add_argument("--architecture", default="topk",
                   help="topk (default), batchtopk (saved as jumprelu), standard, jumprelu")
    p.add_argument("--d-sae", type=int, default=None, metavar="N",
                   help="features (default 8 x the hook's width)")
    p.add_argument("--k", type=float, default=None,
                   help="topk / batchtopk: active features per token (default 32)")
    p.add_argument("--sparsity-coefficient", type=float, default=None, metavar="C",
                   help="standard: the L1 coefficient; jumprelu: the L0 coefficient "
                   "(default 1.0)")
    p.add_argument("--tokens", type=int, default=None, metavar="N",
                   help="training tokens (default: one epoch of the training rows)")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--lr-decay-steps", type=int, default=0, metavar="STEPS",
                   help="SAELens's linear decay of the rate to zero over the last STEPS")
    p.add_argument("--b-dec-init", default="mean", choices=["mean", "zeros"],
                   help="the decoder bias's start: the training rows' mean (default) or zeros")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dead-feature-window", type=int, default=None, metavar="STEPS",
                   help="steps without firing after which a feature counts as dead (default "
                   "SAELens's 1000, or a tenth of the run where shorter)")
    p.add_argument("--skip-positions", type=int, default=1, metavar="N",
                   help="leave each document's first N positions out (default 1: the attention "
                   "sink, as SAELens leaves BOS tokens out)")
    p.add_argument("--eval-documents", type=int, default=None, metavar="N",
                   help="the last N documents are held out (default 5 %%, at least one)")
    p.add_argument("--loss-documents", type=int, default=32, metavar="N",
                   help="held-out documents the next-token loss is measured on (default 32)")
    p.add_argument("--model", default=None,
                   help="the model of the loss evaluation (default: the capture job's)")
    p.add_argument("--no-eval-loss", action="store_true",
                   help="skip the next-token loss through the engine")
    return p


def main(argv: list[str], add_server_flags: Callable, configs_from_args: Callable) -> int:
    command, rest = argv[0], argv[1:]
    if command == "run-batch":
        return _run_batch(rest, add_server_flags, configs_from_args)
    if command == "train-sae":
        return _train_sae(rest)
    return _job(command, rest)


def _run_batch(argv: list[str], add_server_flags: Callable, configs_from_args: Callable) -> int:
    parser = run_batch_parser(add_server_flags)
    args = parser.parse_args(argv)
    try:
        engine_config, server_config = configs_from_args(args)
    except (ValueError, OSError) as exc:
        parser.exit(2, f"workbench run-batch: error: {exc}\n")
    from workbench.errors import ValidationError
    from workbench.jobs.batch_file import run_batch_file  # deferred: the engine imports torch

    try:
        summary = run_batch_file(args.input_file, args.output_file, engine_config,
                                 server_config, ray=args.ray is not None, address=args.ray,
                                 replicas=args.replicas,
                                 num_cpus_per_replica=args.num_cpus_per_replica,
                                 lines_per_call=args.lines_per_call)
    except ImportError as exc:
        parser.exit(2, f"workbench run-batch: error: {exc}\n")
    except ValidationError as exc:
        parser.exit(2, f"workbench run-batch: error: {exc.message}\n")
    print(json.dumps(summary), file=sys.stderr)
    return 0


def _job(command: str, argv: list[str]) -> int:
    """`capture` or `feature-dashboards`."""
    parser = capture_parser() if command == "capture" else dashboards_parser()
    args = parser.parse_args(argv)
    from workbench.errors import ValidationError
    from workbench.jobs.capture import CaptureJob, JobError  # deferred: torch
    from workbench.jobs.dashboards import DashboardJob

    kwargs: dict[str, Any] = {"dtype": args.dtype, "kernel": args.kernel}
    if args.max_model_len:
        kwargs["max_model_len"] = args.max_model_len
    common = {"text_column": args.text_column, "chat_column": args.chat_column,
              "id_column": args.id_column, "docs_per_shard": args.docs_per_shard,
              "batch_invariant": False if args.no_batch_invariant else None,
              "ray": args.ray is not None, "address": args.ray, "replicas": args.replicas,
              "num_cpus_per_replica": args.num_cpus_per_replica, "engine_kwargs": kwargs}
    try:
        if command == "capture":
            saes = dict(s.split("=", 1) for s in args.sae if "=" in s)
            if len(saes) != len(args.sae):
                raise ValueError("--sae takes NAME=PATH")
            job = CaptureJob(args.model, args.data, args.capture, args.out, scores=args.scores,
                             saes=saes, **common)
        else:
            job = DashboardJob(args.model, args.data, args.sae, args.out,
                               skip_positions=args.skip_positions, **common)
        summary = job.run()
    except (ImportError, JobError, OSError, ValueError) as exc:
        parser.exit(2, f"workbench {command}: error: {exc}\n")
    except ValidationError as exc:
        parser.exit(2, f"workbench {command}: error: {exc.message}\n")
    print(json.dumps(summary), file=sys.stderr)
    return 0


# train_sae's parameters whose flags are not their names
_TRAIN_FLAGS = {"training_tokens": "--tokens", "eval_loss": "--no-eval-loss"}


def _train_sae(argv: list[str]) -> int:
    parser = train_sae_parser()
    args = parser.parse_args(argv)
    from workbench.errors import ValidationError
    from workbench.jobs.sae_training import train_sae  # deferred: torch, SAELens

    k = args.k
    if k is not None and k.is_integer() and args.architecture == "topk":
        k = int(k)  # TopK's k is an integer; BatchTopK's a mean
    try:
        result = train_sae(args.shards, args.site, args.architecture, args.d_sae, k, args.out,
                           sparsity_coefficient=args.sparsity_coefficient,
                           training_tokens=args.tokens, batch_size=args.batch_size,
                           lr=args.lr, seed=args.seed,
                           dead_feature_window=args.dead_feature_window,
                           b_dec_init=args.b_dec_init, lr_decay_steps=args.lr_decay_steps,
                           skip_positions=args.skip_positions,
                           eval_documents=args.eval_documents,
                           eval_loss=not args.no_eval_loss,
                           loss_documents=args.loss_documents, model=args.model)
    except ImportError as exc:
        parser.exit(2, f"workbench train-sae: error: {exc}\n")
    except ValidationError as exc:
        name = exc.parameter or ""
        flag = _TRAIN_FLAGS.get(name, "--" + name.replace("_", "-"))
        parser.exit(2, f"workbench train-sae: error: {exc.message} ({flag})\n")
    print(repr(result))
    print(json.dumps(result.metrics(), indent=2))
    return 0
