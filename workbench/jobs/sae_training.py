"""`train_sae`: an SAE trained with SAELens on a capture job's rows of one hook, then measured
as the field measures one (`workbench train-sae`).

>>> result = train_sae("cap/", "blocks.15.hook_resid_post", d_sae=4608, k=32,    # doctest: +SKIP
...                    out="sae/")
>>> result.reconstruction.fvu, result.loss.spliced - result.loss.clean          # doctest: +SKIP

Data flow: the capture folder (`CaptureReader`) -> the site's rows, in document order, split by
documents: the last `eval_documents` documents (by the index) are held out, the rows before
them train; each document's first `skip_positions` rows are left out of both ->
`workbench.features.train.train` (SAELens's trainer, the folder saved in its format) -> the
saved folder loaded as workbench serves it (`SparseAutoencoder.load`) -> `reconstruction` on
the held-out rows (L0, fraction of variance unexplained, dead features) -> with `eval_loss`,
the next-token loss of the first `loss_documents` held-out documents through the engine
(`next_token_loss`): clean, with the SAE's reconstruction spliced in at its hook (the
`{"sae": name, "op": "splice"}` intervention, from position `skip_positions` on), and with the
hook zero-ablated (every position, as SAELens's evals do) -> everything written to
`out/training.json` and returned as a `TrainedSAE`.

`skip_positions` (default 1) is SAELens's `exclude_special_tokens` for documents without a BOS
token: a document's first position is the attention sink, whose residual stream in SmolLM2 is
about 130 times as long as the others' (their median 171, its 23,000 at layer 15), so it
would hold 98 % of the variance of the rows it is among and most of the squared error an SAE
is trained on. SAELens leaves BOS rows out of training, out of its variance figures and out
of its splice (there the model's own activation stays); so does this, by position.

The loss runs on an `LLM` of the capture's model, dtype, kernel and batch invariance (job.json;
`model` names another), so where the job recorded scores the clean losses are the capture's
own: the largest difference between the two is reported (`capture_max_abs_diff`, 0 for the
same engine). A job run on an `LLM` handed to `CaptureJob(llm=...)` records the dtype it was
asked for, not that engine's: pass the same `llm` here.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from workbench.errors import refuse
from workbench.features.train import (
    Reconstruction,
    TrainingConfig,
    TrainingRun,
    check_out,
    reconstruction,
    train,
)
from workbench.jobs import shards as sh

SAE_NAME = "trained"  # the name the loss evaluation loads the SAE under
DEFAULT_EVAL_SHARE = 0.05  # documents held out by default: this share, at least one
METRICS_FILE = "training.json"


@dataclass(frozen=True)
class NextTokenLoss:
    """Mean next-token loss (nats per predicted token) over `documents` documents of `tokens`
    predicted tokens: `clean`, with the SAE's reconstruction `spliced` in at its hook, and with
    the hook `zero`-ablated; `capture_max_abs_diff`: the largest difference between the clean
    logprobs and the capture's scores (None where the job has none)."""

    documents: int
    tokens: int
    clean: float
    spliced: float
    zero: float
    capture_max_abs_diff: float | None

    @property
    def delta(self) -> float:
        """What splicing the SAE in costs: spliced - clean."""
        return self.spliced - self.clean

    @property
    def recovered(self) -> float:
        """The share of the zero-ablation's loss the SAE recovers, (zero - spliced) /
        (zero - clean)."""
        return (self.zero - self.spliced) / (self.zero - self.clean)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "delta": self.delta, "recovered": self.recovered}


@dataclass(frozen=True)
class TrainedSAE:
    """A trained SAE's folder and what was measured (see the module docstring): `config` (the
    training's, defaults filled), `training` (`TrainingRun`), `reconstruction` on the held-out
    rows, `loss` (None without `eval_loss`)."""

    path: str
    site: str
    config: TrainingConfig
    training: TrainingRun
    reconstruction: Reconstruction
    loss: NextTokenLoss | None
    split: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        run = self.training
        return {"path": self.path, "site": self.site, "config": asdict(self.config),
                "split": self.split,
                "training": {**asdict(run), "tokens_per_s": run.tokens_per_s},
                "reconstruction": self.reconstruction.to_dict(),
                "loss": None if self.loss is None else self.loss.to_dict()}

    def metrics(self) -> dict[str, Any]:
        """The figures the field reports, by name."""
        r, loss = self.reconstruction, self.loss
        figures = {"l0": r.l0, "fvu": r.fvu, "explained_variance": r.explained_variance,
                   "dead_features": r.dead_features, "dead_share": r.dead_share,
                   "training_tokens": self.training.tokens,
                   "training_seconds": self.training.seconds,
                   "tokens_per_s": self.training.tokens_per_s}
        if loss is not None:
            figures.update(loss_clean=loss.clean, loss_spliced=loss.spliced,
                           loss_delta=loss.delta, loss_zero=loss.zero,
                           loss_recovered=loss.recovered)
        return figures

    def __repr__(self) -> str:
        c, r = self.config, self.reconstruction
        sparsity = f"k={c.k:g}" if c.k is not None else f"coefficient={c.sparsity_coefficient:g}"
        text = (f"TrainedSAE({self.path!r}: {c.architecture} {c.d_sae} features {sparsity} at "
                f"{self.site}, {self.training.tokens} tokens in {self.training.seconds:.1f} s; "
                f"held out {r.rows} rows: L0 {r.l0:.2f}, FVU {r.fvu:.4f}, dead "
                f"{r.dead_share:.1%}")
        if self.loss is not None:
            text += (f"; loss clean {self.loss.clean:.4f}, spliced {self.loss.spliced:.4f} "
                     f"({self.loss.delta:+.4f}), zero-ablated {self.loss.zero:.4f}")
        return text + ")"

    def _repr_html_(self) -> str:
        from workbench.display import html as h

        rows = [(name, h.fmt(value) if isinstance(value, float) else str(value))
                for name, value in self.metrics().items() if name != "training_seconds"]
        rows.append(("training time", h.duration(self.training.seconds)))
        return (f'<div id="{h.content_id("wb-trained-sae", self.path, self.site)}">'
                f'<div style="font-size:12px">{h.escape(self.path)}: '
                f"{h.escape(self.config.architecture)} SAE, {self.config.d_sae} features at "
                f"{h.escape(self.site)}</div>"
                + h.table(["metric", "value"], rows, escape_cells=False) + "</div>")


def train_sae(shards: str, site: str, architecture: str = "topk", d_sae: int | None = None,
              k: float | None = None, out: str | None = None, *,
              sparsity_coefficient: float | None = None, training_tokens: int | None = None,
              batch_size: int = 1024, lr: float = 3e-3, seed: int = 0,
              dead_feature_window: int | None = None, b_dec_init: str = "mean",
              lr_decay_steps: int = 0, skip_positions: int = 1,
              eval_documents: int | None = None, eval_loss: bool = True,
              loss_documents: int = 32, model: str | None = None, llm: Any = None
              ) -> TrainedSAE:
    """Trains an SAE on the capture folder `shards`' rows of `site` (a full hook name such as
    `blocks.15.hook_resid_post`), saves it into `out` and measures it (module docstring).
    `d_sae`: default 8 x the hook's width; `k`, `sparsity_coefficient`, `training_tokens`
    (default: one epoch of the training rows), `batch_size`, `lr`, `seed`,
    `dead_feature_window`, `b_dec_init`, `lr_decay_steps`: `TrainingConfig`;
    `skip_positions`: each document's first rows left out (module docstring).
    `eval_documents`: documents held out (default 5 %, at least one); `eval_loss`: the
    next-token loss through the engine on `loss_documents` of them, on `llm` (default: an
    `LLM` of `model`, default the job's model). Refused, naming the parameter, before any
    training where something cannot be done as asked."""
    from workbench.jobs.reader import CaptureReader

    if out is None:
        refuse("out: name the folder to save the trained SAE in.", "out", None)
    try:
        reader = CaptureReader(shards)
    except (FileNotFoundError, OSError) as exc:
        refuse(f"shards: {exc}", "shards", shards)
    check_site(reader, site)
    if isinstance(skip_positions, bool) or not isinstance(skip_positions, int) or \
            skip_positions < 0:
        refuse(f"skip_positions must be an integer >= 0, got {skip_positions!r}.",
               "skip_positions", skip_positions)
    documents = document_rows(reader, site)
    held = _held_out(eval_documents, len(documents))
    train_rows, eval_rows, skipped = split_rows(reader, site, documents[-held][1],
                                                skip_positions)
    for name, part in (("training", train_rows), ("held-out", eval_rows)):
        if len(part) == 0:
            refuse(f"eval_documents: holding out {held} of {len(documents)} documents and "
                   f"skipping each one's first {skip_positions} positions leaves no {name} "
                   "rows.", "eval_documents", eval_documents)
    width = int(train_rows.shape[1])
    config = TrainingConfig(architecture, 8 * width if d_sae is None else d_sae, k,
                            sparsity_coefficient, training_tokens, batch_size, lr, seed,
                            dead_feature_window=dead_feature_window, b_dec_init=b_dec_init,
                            lr_decay_steps=lr_decay_steps).check(len(train_rows))
    check_out(out)
    if eval_loss:
        _positive(loss_documents, "loss_documents")
    job = reader.job
    run = train(train_rows, site, out, config,
                metadata={"model_name": model or job["model"],
                          "dataset_path": os.path.abspath(shards)})
    del train_rows
    from workbench.features.sae import SparseAutoencoder

    sae = SparseAutoencoder.load(SAE_NAME, out, parameter="out")
    measured = reconstruction(sae, eval_rows, config.batch_size)
    loss = None
    if eval_loss:
        ids = reader.index["doc_id"]
        scored = [str(ids.iloc[row]) for row, _, _ in documents[-held:][:loss_documents]]
        llm = llm if llm is not None else loss_llm(job, model)
        llm.load_sae(SAE_NAME, out)
        try:
            loss = next_token_loss(llm, SAE_NAME, site, [reader.token_ids(d) for d in scored],
                                   [_capture_logprobs(reader, d) for d in scored],
                                   skip_positions)
        finally:
            llm.unload_sae(SAE_NAME)
    result = TrainedSAE(out, site, config, run, measured, loss,
                        {"documents": len(documents), "held_out_documents": held,
                         "skip_positions": skip_positions, "skipped_rows": skipped,
                         "training_rows": run.rows, "held_out_rows": measured.rows})
    with open(os.path.join(out, METRICS_FILE), "w") as f:
        json.dump(result.to_dict(), f, indent=2)
    return result


def check_site(reader: Any, site: str) -> None:
    """`site` must be a captured full hook name where workbench serves SAEs, one row a token."""
    from workbench.features.sae import HOOK_SITES
    from workbench.inside.sites import parse_site

    if site not in reader.names:
        refuse(f"site {site!r} was not captured in {str(reader.out)!r}; it holds "
               f"{reader.names}.", "site", site)
    short, layer = parse_site(site, "site")
    if short not in HOOK_SITES or layer is None:
        refuse(f"site {site!r}: SAEs are trained and served on {', '.join(HOOK_SITES)} of a "
               "layer.", "site", site)
    if reader.job["capture"].get("reduce"):
        refuse(f"shards: this job reduced each document to one row "
               f"({reader.job['capture']['reduce']!r}); an SAE trains on every token's row.",
               "shards", str(reader.out))


def document_rows(reader: Any, site: str) -> list[tuple[int, int, int]]:
    """(document row number, first row, end) of each document with rows, in `site`'s rows as
    `CaptureReader.site` concatenates them (shard by shard, documents in order)."""
    result: list[tuple[int, int, int]] = []
    base = 0
    per_shard = int(reader.job["docs_per_shard"])
    for k in reader.shards:
        f = reader.shard(k)
        offsets = f.get_tensor("row_offsets").tolist()
        for i in range(len(offsets) - 1):
            if offsets[i + 1] > offsets[i]:
                result.append((k * per_shard + i, base + offsets[i], base + offsets[i + 1]))
        base += f.get_slice(site).get_shape()[0]
    return result


def split_rows(reader: Any, site: str, split: int, skip_positions: int
               ) -> tuple[Any, Any, int]:
    """`site`'s rows before row `split` and from it on, each without the rows at positions
    below `skip_positions` in their document (copies, in the shards' dtype); and how many
    rows were skipped. Filled a shard at a time, each shard's file mapped only while it is
    read: the rows are held once, not beside a second copy or every shard's mapping."""
    import torch
    from safetensors import safe_open

    keeps = [reader.shard(k).get_tensor("positions") >= skip_positions for k in reader.shards]
    keep = torch.cat(keeps)
    first = reader.shard(reader.shards[0]).get_slice(site)
    sample = first[0:1]
    width, dtype = int(first.get_shape()[1]), sample.dtype
    parts = (torch.empty((int(keep[:split].sum()), width), dtype=dtype),
             torch.empty((int(keep[split:].sum()), width), dtype=dtype))
    base, filled = 0, [0, 0]
    for k, mask in zip(reader.shards, keeps):
        with safe_open(str(sh.shard_paths(reader.out, k)[0]), framework="pt") as f:
            rows = f.get_tensor(site)
        cut = min(max(split - base, 0), len(rows))
        for i, (chunk, kept) in enumerate(((rows[:cut], mask[:cut]), (rows[cut:], mask[cut:]))):
            chunk = chunk[kept]
            parts[i][filled[i]:filled[i] + len(chunk)] = chunk
            filled[i] += len(chunk)
        base += len(rows)
    return parts[0], parts[1], int((~keep).sum())


def _held_out(eval_documents: int | None, documents: int) -> int:
    if documents < 2:
        refuse(f"shards: {documents} document(s) with rows; training and a held-out "
               "evaluation need at least two.", "shards", documents)
    if eval_documents is None:
        return max(1, round(DEFAULT_EVAL_SHARE * documents))
    _positive(eval_documents, "eval_documents")
    if eval_documents >= documents:
        refuse(f"eval_documents {eval_documents} leaves none of the {documents} documents to "
               "train on.", "eval_documents", eval_documents)
    return eval_documents


def _positive(value: Any, parameter: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        refuse(f"{parameter} must be a positive integer, got {value!r}.", parameter, value)


def loss_llm(job: dict[str, Any], model: str | None) -> Any:
    """An `LLM` as the capture's engine was: its model (or `model`), dtype, kernel, batch
    invariance and context length."""
    from workbench.jobs.capture import JOB_KV_CACHE_GB
    from workbench.llm import LLM

    kwargs: dict[str, Any] = {"kv_cache_memory_gb": JOB_KV_CACHE_GB}
    if job.get("max_model_len"):
        kwargs["max_model_len"] = job["max_model_len"]
    return LLM(model=model or job["model"], dtype=job["dtype"], kernel=job["kernel"],
               batch_invariant=bool(job["batch_invariant"]), **kwargs)


def next_token_loss(llm: Any, sae_name: str, site: str, documents: list[list[int]],
                    capture_logprobs: list[list[float] | None] | None = None,
                    skip_positions: int = 0) -> NextTokenLoss:
    """Each document's tokens (ids) through `llm` three times in one batch: as they are, with
    the SAE `sae_name` spliced in (`{"sae": sae_name, "op": "splice"}`, from position
    `skip_positions` on), and with `site` zeroed at every position; the mean of -logprob of
    every token after the first. `capture_logprobs`: each document's recorded logprobs (NaN at
    its first token), compared with the clean ones."""
    from workbench.sampling_params import SamplingParams

    # as a request gives them: SamplingParams parses each into an `Intervention`
    splice: dict[str, Any] = {"sae": sae_name, "op": "splice"}
    if skip_positions:
        splice["positions"] = {"start": skip_positions}
    variants: list[Any] = [None, [splice], [{"site": site, "op": "zero"}]]
    params = [SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0, detokenize=False,
                             interventions=v) for v in variants for _ in documents]
    prompts = [{"prompt_token_ids": ids} for _ in variants for ids in documents]
    outs = llm.generate(prompts, params)
    sums = [0.0, 0.0, 0.0]
    tokens = 0
    worst: float | None = None
    for v in range(len(variants)):
        for d, ids in enumerate(documents):
            out = outs[v * len(documents) + d]
            logprobs = [out.prompt_logprobs[p][ids[p]].logprob for p in range(1, len(ids))]
            sums[v] -= sum(logprobs)
            tokens += len(logprobs) if v == 0 else 0
            recorded = capture_logprobs[d] if capture_logprobs else None
            if v == 0 and recorded is not None:
                gap = max((abs(a - b) for a, b in zip(logprobs, recorded[1:])), default=0.0)
                worst = gap if worst is None else max(worst, gap)
    if tokens == 0:
        refuse("loss_documents: the scored documents have no token after their first.",
               "loss_documents", len(documents))
    clean, spliced, zero = (s / tokens for s in sums)
    return NextTokenLoss(len(documents), tokens, clean, spliced, zero, worst)


def _capture_logprobs(reader: Any, doc: str) -> list[float] | None:
    if not reader.job.get("scores"):
        return None
    values = reader.scores(doc)["logprob"].tolist()
    return [math.nan if v is None else float(v) for v in values]
