"""`CaptureJob`: every document of a dataset through the engine, its activations (a request's
`capture` spec, TransformerLens's names) and optionally per-token scores written to shards
(`shards.py` has the folder's layout), on this process's engine or on Ray replicas.

>>> job = CaptureJob("smollm2-135m-instruct", "docs.jsonl",              # doctest: +SKIP
...                  {"sites": ["resid_post"], "layers": [6]}, "out/", scores=True)
>>> job.run()                                                             # doctest: +SKIP
>>> job.open().doc(0)["resid_post", 6]                                    # doctest: +SKIP

Each document is one request, `SamplingParams(max_tokens=1, temperature=0, capture=spec,
prompt_logprobs=0, token_stats=True)` on its token ids, so the spec is validated as a
request's and the recorded rows are exactly what that request returns (`positions` default
to the prompt's). Without scores no logits are needed: the request stops after the deepest
layer it captures (`stop_at_layer`), which leaves those rows as they are and the layers after,
the final norm and the LM head uncomputed (a middle layer's rows at about half the cost).
Scores: the logprob of each actual next token, the entropy of the whole distribution, its rank
and the top-2 margin (`token_stats` of the prompt positions, as
`LLM.score_text`). Chat documents are rendered with the model's chat template; the
assistant's tokens are marked (`assistant_mask`) as `score_chat` finds a turn: what rendering
the conversation up to and including the turn adds to rendering it up to the turn with the
generation prompt.

Documents are cut into shards of `docs_per_shard` rows in order; shard k always holds the
same rows, so a rerun (same model, spec and source, or it is refused naming what differs)
computes only the shards that are missing or whose sha256 does not match their manifest.
Jobs run with `batch_invariant=True` by default (where the model refuses it, a local job falls
back and says so in job.json): then a shard's bytes do not depend on how documents were
batched, which replica ran them, or whether the job was resumed.

Refused before any engine starts (`JobError`): an unknown site, layers out of range, attention
patterns (their width varies per document: capture them per request), a missing column. A
document that is empty, longer than the context, or failed in the engine becomes an error row.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any

from workbench.jobs import shards as sh
from workbench.jobs.dataset import Document, JobError, Source
from workbench.version import __version__

_CAPTURE_MB = 4096.0  # the engine's per-request capture limit in a job (a server's is 256)


class DocumentError(Exception):
    """One document cannot be captured: it becomes an error row."""


def normalized_spec(spec: Any) -> dict[str, Any]:
    """The request's `capture` as a dict, positions defaulting to the prompt's (checked by
    `CaptureParams.parse`, a request's own check)."""
    from workbench.inside.spec import CaptureParams  # deferred: the spec's checks

    if isinstance(spec, str):
        spec = json.loads(spec) if spec.lstrip().startswith("{") else {"sites": [spec]}
    if isinstance(spec, list):
        spec = {"sites": spec}
    if not isinstance(spec, dict):
        raise JobError("capture must be a site, a list of sites or a request's capture object")
    spec = {"positions": "prompt", **spec}
    try:
        CaptureParams.parse(spec)
    except Exception as exc:  # ValidationError: the request's own message
        raise JobError(getattr(exc, "message", str(exc))) from exc
    return spec


def resolve_names(spec: dict[str, Any], shape: Any) -> list[str]:
    """The full site names of `spec` on a model of `shape`; refuses what a job cannot store."""
    from workbench.inside.resolve import resolve
    from workbench.inside.spec import CaptureParams

    try:
        capture = resolve(CaptureParams.parse(dict(spec)), None, [], shape, 1).capture
    except Exception as exc:
        raise JobError(getattr(exc, "message", str(exc))) from exc
    assert capture is not None
    patterns = [n for n in capture.names if n.endswith("hook_pattern")]
    if patterns:
        raise JobError(f"capture jobs store token-major rows; attention patterns ({patterns[0]}"
                       ") are as wide as each document: capture them per request")
    return capture.names


def model_config(model: str) -> Any:
    """The model's transformers config, from its files alone (what a driver checks before any
    replica loads the model)."""
    from transformers import AutoConfig  # deferred: heavy

    from workbench.models import resolve_model

    return AutoConfig.from_pretrained(resolve_model(model, prepare=False).path,
                                      local_files_only=True)


def config_shape(model: str, saes: dict[str, str] | None = None) -> Any:
    """A `ModelShape` from the model's config alone (what a driver checks a spec against
    before any replica loads the model), with the SAEs `saes` (name -> folder) loaded and
    checked against it."""
    from workbench.features.sae import SparseAutoencoder
    from workbench.inside.resolve import ModelShape

    cfg = model_config(model)
    heads = cfg.num_attention_heads
    shape = ModelShape(cfg.num_hidden_layers, cfg.hidden_size, heads,
                       getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
                       cfg.vocab_size, max_capture_bytes=1 << 62)
    for name, path in (saes or {}).items():
        try:
            sae = SparseAutoencoder.load(name, path)
            sae.check_model(shape.num_layers, shape.hidden_size, {})
        except Exception as exc:  # ValidationError: the load's own message
            raise JobError(getattr(exc, "message", str(exc))) from exc
        shape.saes[name] = sae
    return shape


class ShardComputer:
    """An engine and a job's request: turns a shard's documents into its tensors and files."""

    def __init__(self, llm: Any, job: dict[str, Any], out: str,
                 where: dict[str, str] | None = None):
        import socket

        import torch

        from workbench.inside.spec import CaptureParams
        from workbench.sampling_params import SamplingParams

        self.llm, self.job, self.out = llm, job, out
        # in each manifest: the machine (and Ray node) that computed the shard
        self.where = {"host": socket.gethostname(), **(where or {})}
        self.names = job["capture"]["names"]
        spec = {k: v for k, v in job["capture"].items() if k != "names"}
        self.scores = bool(job["scores"])
        self.chat = job["columns"]["chat"] is not None
        asks: dict[str, Any] = dict(max_tokens=1, temperature=0, detokenize=False,
                                    capture=CaptureParams.parse(spec),
                                    prompt_logprobs=0 if self.scores else None,
                                    token_stats=self.scores)
        self.params = SamplingParams(**asks)
        if not self.scores:  # no logits wanted: the forward ends after the deepest layer read
            shape = llm.llm_engine.inputs.model_shape
            inside = self.params.resolve_inside(shape, 1)  # its layers (1: sizes aside)
            last = None if inside is None else inside.last_layer
            if last is not None:
                self.params = SamplingParams(**asks, stop_at_layer=last + 1)
        dtype = llm.llm_engine.loaded.dtype
        self.store_dtype = dtype if dtype in (torch.bfloat16, torch.float16) else torch.float32
        self.max_len = llm.llm_engine.max_model_len
        self._renderer: Any = None

    # -- one document's prompt ----------------------------------------------------------------
    def prompt(self, doc: Document) -> tuple[list[int], list[bool] | None]:
        tok = self.llm.get_tokenizer()
        if self.chat:
            ids, mask = self.chat_ids(doc.messages)
        else:
            if not isinstance(doc.text, str):
                raise DocumentError(f"no text: the column holds {type(doc.text).__name__}")
            if not doc.text:
                raise DocumentError("empty document")
            ids, mask = tok(doc.text)["input_ids"], None
        if not ids:
            raise DocumentError("empty document: no tokens")
        if len(ids) + 1 > self.max_len:
            raise DocumentError(f"document of {len(ids)} tokens is longer than the context: "
                                f"max_model_len {self.max_len}, one position kept for the "
                                "sampled token")
        return list(ids), mask

    def chat_ids(self, messages: Any) -> tuple[list[int], list[bool]]:
        from workbench.serving.chat_template import ChatRenderer
        from workbench.serving.protocol.chat import ChatMessageParam

        if not isinstance(messages, list) or not messages:
            raise DocumentError("empty conversation: messages must be a non-empty list")
        tok = self.llm.get_tokenizer()
        if self._renderer is None:
            self._renderer = ChatRenderer(tok, trust_request_chat_template=True)

        def ids(msgs: list[dict], generation_prompt: bool) -> list[int]:
            try:
                rendered = self._renderer.render(
                    [ChatMessageParam.model_validate(m) for m in msgs],
                    add_generation_prompt=generation_prompt, chat_template=None,
                    chat_template_kwargs=None, tools=None)
            except Exception as exc:
                raise DocumentError(f"the chat template refused the conversation: {exc}") \
                    from exc
            return tok(rendered.prompt, add_special_tokens=False)["input_ids"]

        whole = ids(messages, False)
        mask = [False] * len(whole)
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or m.get("role") != "assistant":
                continue
            before, upto = ids(messages[:i], True) if i else [], ids(messages[:i + 1], False)
            if upto[:len(before)] != before or whole[:len(upto)] != upto:
                raise DocumentError(f"message {i}: the chat template renders the conversation "
                                    "before it as something the whole does not start with, so "
                                    "the assistant's tokens cannot be told apart")
            for p in range(len(before), len(upto)):
                mask[p] = True
        return whole, mask

    # -- a shard --------------------------------------------------------------------------------
    def outputs(self, prompts: list[list[int]]) -> list[Any]:
        """One output (or an error string) per prompt; a refusal of one prompt is its own."""
        from workbench.errors import EngineStepError, ValidationError

        try:
            outs: list[Any] = self.llm.generate([{"prompt_token_ids": p} for p in prompts],
                                                self.params)
            return outs
        except EngineStepError as exc:
            return [o if o.error is None else f"engine error: {o.error}" for o in exc.outputs]
        except ValidationError:
            if len(prompts) == 1:
                raise
        result: list[Any] = []
        for p in prompts:  # find the refused one(s)
            try:
                result.extend(self.outputs([p]))
            except ValidationError as exc:
                result.append(f"refused: {exc.message}")
        return result

    def run(self, docs: list[Document]) -> tuple[dict[int, tuple[list[int], Any]],
                                                  dict[int, Any], dict[str, str]]:
        """A shard's documents through the engine: (prompts, outputs, errors) by the
        document's number in the shard; an output may be an error string."""
        errors: dict[str, str] = {}
        prompts: dict[int, tuple[list[int], list[bool] | None]] = {}
        for i, doc in enumerate(docs):
            try:
                prompts[i] = self.prompt(doc)
            except DocumentError as exc:
                errors[str(i)] = str(exc)
        order = sorted(prompts)
        outs = dict(zip(order, self.outputs([prompts[i][0] for i in order]))) if order else {}
        return prompts, outs, errors

    def compute(self, k: int, start: int, docs: list[Document]) -> dict[str, Any]:
        """Shard k (rows start.. of `docs`), written; returns its manifest."""
        import torch

        began = time.perf_counter()
        prompts, outs, errors = self.run(docs)
        token_ids: list[int] = []
        doc_offsets, row_offsets, positions = [0], [0], []
        rows: dict[str, list[Any]] = {n: [] for n in self.names}
        cols: dict[str, list[float]] = {"logprob": [], "entropy": [], "margin": [], "rank": []}
        mask: list[bool] = []
        for i in range(len(docs)):
            out = outs.get(i)
            if isinstance(out, str):
                errors[str(i)] = out
            if str(i) in errors:
                doc_offsets.append(len(token_ids))
                row_offsets.append(row_offsets[-1])
                continue
            ids, doc_mask = prompts[i]
            assert out is not None
            cache = out.activations
            tensors = {n: cache[n] for n in self.names}
            if cache.reduce:
                tensors = {n: t.reshape(1, -1) for n, t in tensors.items()}
                positions.append(-1)
            else:
                positions.extend(cache.positions)
            for n, t in tensors.items():
                rows[n].append(t.to(self.store_dtype))
            row_offsets.append(row_offsets[-1] + next(iter(tensors.values())).shape[0])
            token_ids.extend(ids)
            doc_offsets.append(len(token_ids))
            if doc_mask is not None:
                mask.extend(doc_mask)
            if self.scores:
                self._scores(out, ids, cols)
        tensors = {"token_ids": torch.tensor(token_ids, dtype=torch.int64),
                   "doc_offsets": torch.tensor(doc_offsets, dtype=torch.int64),
                   "row_offsets": torch.tensor(row_offsets, dtype=torch.int64),
                   "positions": torch.tensor(positions, dtype=torch.int64)}
        for n in self.names:
            tensors[n] = torch.cat(rows[n]) if rows[n] else \
                torch.zeros((0, self._width(n)), dtype=self.store_dtype)
        if self.scores:
            for c in ("logprob", "entropy", "margin"):
                tensors[c] = torch.tensor(cols[c], dtype=torch.float32)
            tensors["rank"] = torch.tensor(cols["rank"], dtype=torch.int64)
        if self.chat:
            tensors["assistant_mask"] = torch.tensor(mask, dtype=torch.bool)
        manifest = {"shard": k, "rows": [start, start + len(docs)],
                    "doc_ids": [d.doc_id for d in docs], "documents": len(docs),
                    "tokens": len(token_ids), "doc_offsets": doc_offsets, "errors": errors}
        manifest["seconds"] = round(time.perf_counter() - began, 3)
        manifest.update(self.where)
        return sh.write_shard(self.out, k, {n: t.contiguous() for n, t in tensors.items()},
                              manifest)

    def _width(self, name: str) -> int:
        """A site's row width (an SAE's hook's: its features' or its input's or output's)."""
        from workbench.inside.sites import split_sae_name

        shape = self.llm.llm_engine.inputs.model_shape
        inside = split_sae_name(name)
        if inside is None:
            return int(shape.hidden_size)
        named = self.job["capture"].get("sae")  # `capture.sae`, where several are there
        sae = next(s for s in shape.saes.values() if (s.hook_name_out or s.hook_name) ==
                   inside[0] and named in (None, s.name))
        return int(sae.d_sae if inside[1] in ("acts_pre", "acts_post") else
                   sae.d_in if inside[1] == "input" else sae.d_out)

    def _scores(self, out: Any, ids: list[int], cols: dict[str, list[float]]) -> None:
        stats = out.prompt_token_stats or [None] * len(ids)
        logprobs = out.prompt_logprobs or [None] * len(ids)
        for p, token in enumerate(ids):
            s, lp = stats[p], logprobs[p]
            if s is None or lp is None:
                cols["logprob"].append(math.nan)
                cols["entropy"].append(math.nan)
                cols["margin"].append(math.nan)
                cols["rank"].append(-1)
                continue
            cols["logprob"].append(lp[token].logprob)
            cols["entropy"].append(s.entropy)
            cols["margin"].append(s.margin)
            cols["rank"].append(s.rank)


def batch_invariance_refusal(model: str, dtype: str) -> str | None:
    """Why an engine on `model` would refuse `batch_invariant=True` on this machine, or None:
    the engine's own check (`check_batch_invariant`) on the model's skeleton, built on the meta
    device from its config (no weights read). A Ray job's driver decides with it, so every
    replica runs the same arithmetic and job.json says which before any replica starts."""
    import torch
    from transformers import AutoModelForCausalLM  # deferred: heavy

    from workbench.engine.kernels import projections
    from workbench.engine.step.runner import check_batch_invariant
    from workbench.errors import ValidationError
    from workbench.models.architectures import architecture_of, module_at
    from workbench.models.devices import resolve_dtype

    cfg = model_config(model)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(cfg)
    torch_dtype = torch.float32 if dtype == "gguf" else resolve_dtype(dtype, "cpu")
    try:
        check_batch_invariant(skeleton, projections.choose(torch_dtype, "cpu"),
                              module_at(skeleton, architecture_of(cfg).layers))
    except ValidationError as exc:
        return exc.message
    return None


# a job's engine's KV cache unless its engine_kwargs say (an engine's default takes 90 % of the
# memory available, and a job's prefix-cached documents would fill it in time on every replica)
JOB_KV_CACHE_GB = 1.0


def make_llm(model: Any, dtype: str, kernel: str, batch_invariant: bool | None,
             engine_kwargs: dict[str, Any]) -> tuple[Any, str | None]:
    """(the engine, why batch invariance is off or None); `batch_invariant=None` tries it."""
    from workbench.errors import ValidationError
    from workbench.llm import LLM

    kwargs = {"max_capture_mb": _CAPTURE_MB, **engine_kwargs}
    if "num_kv_blocks" not in kwargs:  # several replicas may share a machine: not 90 % each
        kwargs.setdefault("kv_cache_memory_gb", JOB_KV_CACHE_GB)
    if batch_invariant is not None:
        return LLM(model=model, dtype=dtype, kernel=kernel, batch_invariant=batch_invariant,
                   **kwargs), None if batch_invariant else "asked: batch_invariant=False"
    try:
        return LLM(model=model, dtype=dtype, kernel=kernel, batch_invariant=True, **kwargs), None
    except ValidationError as exc:
        if exc.parameter != "batch_invariant":
            raise
        return LLM(model=model, dtype=dtype, kernel=kernel, batch_invariant=False, **kwargs), \
            exc.message


class CaptureReplica:
    """One engine replica of a Ray job (Ray Data's actor pool builds it once per actor): each
    call gets shards (`shard`, `start`, `documents` as JSON) and writes them itself; only the
    manifests go back."""

    computer_class: Any = ShardComputer

    def __init__(self, job: dict[str, Any], out: str, engine_kwargs: dict[str, Any]):
        check_same_folder(job, out)
        llm, _ = make_llm(job["model"], job["dtype"], job["kernel"], job["batch_invariant"],
                          engine_kwargs)
        import ray  # deferred: a replica runs inside Ray

        self.computer = self.computer_class(
            llm, job, out, where={"ray_node_id": ray.get_runtime_context().get_node_id()})

    def __call__(self, batch: Any) -> Any:
        import pandas as pd

        manifests = []
        for r in batch.to_dict("records"):
            docs = [Document(**d) for d in json.loads(r["documents"])]
            _fault_for_tests(self.computer.out, int(r["shard"]))
            manifests.append(json.dumps(self.computer.compute(int(r["shard"]), int(r["start"]),
                                                              docs)))
        return pd.DataFrame({"manifest": manifests})


def check_same_folder(job: dict[str, Any], out: str) -> None:
    """A replica writes its shards into the driver's output folder itself, so on a cluster that
    folder must be one every node sees (a shared file system): refused, before the model loads,
    where this node does not find the driver's job.json there."""
    import socket

    if sh.job_differences(out, job) != []:
        raise JobError(f"replica on {socket.gethostname()}: {out!r} is not the driver's output "
                       "folder here (no job.json of this job in it). On a cluster, --out must "
                       "be a folder every node sees: a shared file system (NFS, a cluster "
                       "file system) mounted at the same path.")


def _fault_for_tests(out: str, k: int) -> None:
    """The fault tests' replica death: with `WORKBENCH_CAPTURE_TEST_KILL=PATH` in a replica's
    environment (`ray_options={"runtime_env": ...}`), the first replica to start shard 1
    creates PATH, leaves half a shard under a temporary name and dies (`os._exit`), as a
    process killed mid-write would."""
    import os

    path = os.environ.get("WORKBENCH_CAPTURE_TEST_KILL")
    if not path or k != 1:
        return
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return
    shard, _ = sh.shard_paths(out, k)
    with open(shard.with_name(f".{shard.name}.tmp-{os.getpid()}-dead"), "wb") as f:
        f.write(b"half a shard")
    os._exit(1)


class CaptureJob:
    """A dataset's capture (see the module docstring). `model`: a name or path (a Ray job's
    replicas load it), or with `llm=` this process's engine; `data`: a JSONL or Parquet path, a
    list of dicts or strings, or a `datasets.Dataset`; `capture`: a request's capture spec;
    `out`: the folder (rerun: resume). `ray=True` runs on `replicas` Ray actors
    (`num_cpus_per_replica` each; `address`: a cluster, or the notebook's `ray.init`;
    `ray_options`: more `map_batches` arguments, e.g. a `runtime_env`); `saes`: SAEs to load
    (name -> folder in SAELens's format) whose hooks the capture names
    (`blocks.6.hook_resid_post.hook_sae_acts_post`)."""

    computer_class: Any = ShardComputer
    replica_class: Any = CaptureReplica

    def __init__(self, model: Any, data: Any, capture: Any, out: str, *, scores: bool = False,
                 text_column: str = "text", chat_column: str | None = None,
                 id_column: str | None = None, docs_per_shard: int = 64,
                 batch_invariant: bool | None = None, dtype: str = "auto",
                 kernel: str = "auto", llm: Any = None, ray: bool = False,
                 address: str | None = None, replicas: int = 1,
                 num_cpus_per_replica: float = 1, engine_kwargs: dict[str, Any] | None = None,
                 ray_options: dict[str, Any] | None = None, progress: bool = True,
                 saes: dict[str, str] | None = None):
        if docs_per_shard < 1:
            raise JobError("docs_per_shard must be at least 1")
        if ray and (llm is not None or not isinstance(model, str)):
            raise JobError("a Ray job's replicas load the model themselves: give it by name or "
                           "path, not as a loaded model or an LLM")
        self.model, self.data, self.out = model, data, str(out)
        self.spec = normalized_spec(capture)
        self.scores, self.docs_per_shard = scores, docs_per_shard
        self.columns = {"text": None if chat_column else text_column, "chat": chat_column,
                        "id": id_column}
        self.batch_invariant, self.llm = batch_invariant, llm
        engine_kwargs = dict(engine_kwargs or {})
        self.saes = {name: os.path.abspath(path) for name, path in
                     (saes or engine_kwargs.pop("saes", None) or {}).items()}
        if self.saes:
            if llm is not None:
                raise JobError("saes load on the job's own engine: give the model by name or "
                               "path, or load them on your LLM (llm.load_sae) and leave saes out")
            engine_kwargs["saes"] = dict(self.saes)
        self.dtype = engine_kwargs.pop("dtype", dtype)
        self.kernel = engine_kwargs.pop("kernel", kernel)
        self.engine_kwargs = engine_kwargs
        self.ray, self.address, self.replicas = ray, address, replicas
        self.num_cpus_per_replica, self.progress = num_cpus_per_replica, progress
        self.ray_options = ray_options
        self.source: Source | None = None
        self.job: dict[str, Any] | None = None

    # -- planning -----------------------------------------------------------------------------
    def plan(self) -> dict[str, Any]:
        """Checks the spec and the data, then the output folder (its job.json, or a new one);
        loads this process's engine unless the job runs on Ray. Returns the job record."""
        self.source = Source(self.data, self.columns["text"] or "text", self.columns["chat"],
                             self.columns["id"])
        self.columns["id"] = self.source.id_column  # job.json says which: a default's too
        note = None
        if self.ray:
            from workbench.jobs.ray_pool import require_ray

            require_ray()
            shape = config_shape(self.model, self.saes)
            batch_invariant = self.batch_invariant
            if batch_invariant is not False:
                refusal = batch_invariance_refusal(self.model, self.dtype)
                if refusal is not None and batch_invariant:  # asked for: refused here, once
                    raise JobError(refusal)
                note, batch_invariant = refusal, refusal is None
        else:
            if self.llm is None:
                names = resolve_names(self.spec, config_shape(self.model, self.saes)) \
                    if isinstance(self.model, str) else None
                del names  # checked before the engine loads; checked again on the engine below
                self.llm, note = make_llm(self.model, self.dtype, self.kernel,
                                          self.batch_invariant, self.engine_kwargs)
            shape = self.llm.llm_engine.inputs.model_shape
            batch_invariant = bool(self.llm.config.batch_invariant)
        names = resolve_names(self.spec, shape)
        model = self.model if isinstance(self.model, str) else \
            getattr(self.model, "served_name", "in-memory model")
        self.job = {
            "model": model, "dtype": self.dtype, "kernel": self.kernel,
            "capture": {**self.spec, "names": names}, "scores": self.scores,
            "saes": self.saes or None,
            "source": self.source.fingerprint, "source_description": self.source.description,
            "documents": len(self.source), "columns": self.columns,
            "docs_per_shard": self.docs_per_shard, "batch_invariant": batch_invariant,
            "batch_invariant_note": note,
            "max_model_len": self.engine_kwargs.get("max_model_len"),
            "workbench_version": __version__, "layout": "workbench capture shards v1",
            **self.job_extra()}
        sh.prepare_folder(self.out, self.job)
        return self.job

    def job_extra(self) -> dict[str, Any]:
        """More of job.json, for a job built on this one (`dashboards.DashboardJob`)."""
        return {}

    def shard_plan(self) -> list[tuple[int, int, int]]:
        assert self.source is not None
        n = len(self.source)
        return [(k, start, min(start + self.docs_per_shard, n))
                for k, start in enumerate(range(0, n, self.docs_per_shard))]

    # -- running --------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Computes the shards not yet done (a tqdm bar of documents, tokens/s, time left),
        then writes index.parquet. Returns a summary."""
        from tqdm.auto import tqdm

        job = self.plan()
        assert self.source is not None
        sh.clean_temporaries(self.out)
        plan = self.shard_plan()
        done: dict[int, dict[str, Any]] = {}
        for k, start, stop in plan:
            manifest = sh.shard_done(self.out, k, start, stop)
            if manifest is not None:
                done[k] = manifest
        todo = [(k, start, stop) for k, start, stop in plan if k not in done]
        bar = tqdm(total=len(self.source), desc="capture documents", unit="doc",
                   disable=not self.progress, initial=sum(m["documents"] for m in done.values()))
        began, tokens = time.perf_counter(), 0
        first: tuple[float, int] | None = None  # (seconds, tokens) when the first shard came

        def finished(manifest: dict[str, Any]) -> None:
            nonlocal tokens, first
            done[manifest["shard"]] = manifest
            tokens += manifest["tokens"]
            if first is None:
                first = (time.perf_counter() - began, tokens)
            bar.update(manifest["documents"])
            bar.set_postfix(tokens_per_s=f"{tokens / max(time.perf_counter() - began, 1e-9):.0f}")

        try:
            if todo and self.ray:
                self._run_ray(job, todo, finished)
            elif todo:
                computer = self.computer_class(self.llm, job, self.out)
                for k, start, stop in todo:
                    finished(computer.compute(k, start, self.source.documents(start, stop)))
        finally:
            bar.close()
        missing = [k for k, start, stop in plan if sh.shard_done(self.out, k, start, stop) is None]
        if missing:
            raise JobError(f"shards {missing} are not complete after the run")
        index = sh.write_index(self.out, list(done.values()))
        sh.clean_temporaries(self.out)
        seconds = time.perf_counter() - began
        return {"documents": len(self.source), "shards": len(plan), "computed": len(todo),
                "reused": len(plan) - len(todo), "tokens": int(index["tokens"].sum()),
                "errors": int(index["error"].notna().sum()), "seconds": round(seconds, 2),
                "tokens_per_s": round(tokens / seconds, 1) if todo and seconds else None,
                # until the first shard: one shard, and on Ray the replicas' start-up
                "first_shard_s": round(first[0], 2) if first else None,
                # after it: the steady rate, start-up aside
                "steady_tokens_per_s": round((tokens - first[1]) / (seconds - first[0]), 1)
                if first and len(todo) > 1 and seconds > first[0] else None}

    def _run_ray(self, job: dict[str, Any], todo: list[tuple[int, int, int]],
                 finished: Any) -> None:
        from dataclasses import asdict

        from workbench.jobs.ray_pool import run_pool

        assert self.source is not None
        items = [{"shard": k, "start": start, "documents": json.dumps(
            [asdict(d) for d in self.source.documents(start, stop)])} for k, start, stop in todo]
        for row in run_pool(items, self.replica_class,
                            {"job": job, "out": self.out, "engine_kwargs": self.engine_kwargs},
                            replicas=self.replicas, num_cpus=self.num_cpus_per_replica,
                            batch_size=1, address=self.address, options=self.ray_options):
            finished(json.loads(row["manifest"]))

    def open(self) -> Any:
        """The finished job's folder, read back (`CaptureReader`)."""
        from workbench.jobs.reader import CaptureReader

        tokenizer = self.llm.get_tokenizer() if self.llm is not None else None
        return CaptureReader(self.out, tokenizer=tokenizer)
