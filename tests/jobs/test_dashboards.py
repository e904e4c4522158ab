"""Feature dashboards as a job (`workbench.jobs.dashboards`) on the tiny llama and a small SAE:
every figure equal to a brute-force computation from the SAE's dense features per request and
transformers' own LM head; the same bytes however the documents are split, resumed, or on 2 Ray
replicas; error rows; refusals."""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

from workbench.features.sae import save_sae
from workbench.jobs.dashboards import (
    CONTEXTS_FILE,
    DASHBOARDS_FILE,
    FEATURES_FILE,
    INTERVALS,
    SAMPLES,
    TOP,
    WINDOW,
    DashboardJob,
    bin_edges,
)
from workbench.jobs.dataset import JobError

D_SAE = 24
HOOK = "blocks.1.hook_resid_post"
DOCS = [{"id": f"d{i}", "text": " ".join(f"w{(i * 7 + j * 3) % 40}" for j in range(20 + 3 * i))}
        for i in range(10)] + [{"id": "empty", "text": ""}]
FILES = (FEATURES_FILE, CONTEXTS_FILE, DASHBOARDS_FILE)


@pytest.fixture(scope="module")
def sae_dir(tmp_path_factory):
    g = torch.Generator().manual_seed(0)
    return save_sae(str(tmp_path_factory.mktemp("sae") / "s"), {
        "W_enc": torch.randn(64, D_SAE, generator=g) / 8, "b_enc": torch.full((D_SAE,), -0.3),
        "W_dec": torch.randn(D_SAE, 64, generator=g) / 6, "b_dec": torch.zeros(64)}, HOOK)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "docs.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    return str(path)


def run(tiny_dir, data, sae_dir, out, **kw):
    kw = {"docs_per_shard": 4, "id_column": "id", "dtype": "float32", "progress": False, **kw}
    return DashboardJob(tiny_dir, data, sae_dir, str(out), **kw).run()


def digests(out):
    return {f: hashlib.sha256((out / f).read_bytes()).hexdigest() for f in FILES}


@pytest.fixture(scope="module")
def done(tiny_dir, data, sae_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("dash")
    summary = run(tiny_dir, data, sae_dir, out)
    return out, summary


@pytest.fixture(scope="module")
def llm(tiny_dir, sae_dir):
    from workbench import LLM

    return LLM(model=tiny_dir, dtype="float32", batch_invariant=True, saes={"s": sae_dir})


@pytest.fixture(scope="module")
def reference(llm):
    """Each document's dense features [tokens, d_sae] as a request captures them, its token
    ids, and W_dec @ W_U with transformers' own LM head weight."""
    from workbench import SamplingParams
    from workbench.models import tiny_model

    tok = llm.get_tokenizer()
    acts, ids = {}, {}
    for row, doc in enumerate(DOCS):
        if not doc["text"]:
            continue
        ids[row] = tok(doc["text"])["input_ids"]
        out = llm.generate([{"prompt_token_ids": ids[row]}], SamplingParams(
            max_tokens=1, capture={"sites": [f"{HOOK}.hook_sae_acts_post"],
                                   "positions": "prompt"}))[0]
        acts[row] = out.activations[f"{HOOK}.hook_sae_acts_post"]
    head = tiny_model("llama", seed=0, dtype="float32").model.lm_head.weight
    logits = llm.saes["s"].weights["W_dec"] @ head.T
    return acts, ids, logits, tok


def test_every_figure_is_the_brute_force_one(done, reference):
    out, summary = done
    acts, ids, logits, tok = reference
    features = pd.read_parquet(out / FEATURES_FILE)
    contexts = pd.read_parquet(out / CONTEXTS_FILE)
    meta = json.loads((out / DASHBOARDS_FILE).read_text())
    tokens = sum(len(t) for t in ids.values())
    assert meta["tokens"] == tokens and meta["errors"] == 1 and meta["d_sae"] == D_SAE
    entries = [(row, p, f, float(a[p, f])) for row, a in acts.items()
               for p, f in zip(*np.nonzero(a.numpy())) if p >= 1]  # the sink left out
    edges = bin_edges()
    for f in range(D_SAE):
        mine = [e for e in entries if e[2] == f]
        got = features.iloc[f]
        assert got["fires"] == len(mine) and got["density"] == pytest.approx(len(mine) / tokens)
        counts = np.zeros(len(edges) - 1, np.int64)
        for _, _, _, v in mine:
            counts[max(b for b in range(len(edges) - 1) if edges[b] <= v)] += 1
        assert got["histogram"].tolist() == counts.tolist()
        best = sorted(mine, key=lambda e: (-e[3], e[0], e[1]))[:TOP]
        tops = contexts[(contexts["feature"] == f) & (contexts["kind"] == "top")]
        assert [(r, p) for r, p in zip(tops["row"], tops["position"])] == \
            [(e[0], e[1]) for e in best]
        assert tops["activation"].tolist() == pytest.approx([e[3] for e in best], abs=0)
        for _, c in tops.head(3).iterrows():  # the window: its tokens and this feature's acts
            lo = c["window_start"]
            hi = min(c["position"] + WINDOW[1] + 1, len(ids[c["row"]]))
            assert lo == max(c["position"] - WINDOW[0], 0)
            assert c["token_ids"].tolist() == ids[c["row"]][lo:hi]
            read = acts[c["row"]][lo:hi, f].clone()
            read[:max(1 - lo, 0)] = 0  # position 0 is not read
            assert c["activations"].tolist() == read.tolist()
            assert c["tokens"].tolist() == [tok.decode([t]) for t in ids[c["row"]][lo:hi]]
        want = logits[f].topk(10)
        assert got["top_logit_ids"].tolist() == want.indices.tolist()
        assert got["top_logits"] == pytest.approx(want.values.tolist(), rel=1e-5, abs=1e-6)
        assert got["bottom_logits"] == pytest.approx(
            (-(-logits[f]).topk(10).values).tolist(), rel=1e-5, abs=1e-6)
        samples = contexts[(contexts["feature"] == f) & (contexts["kind"] == "sample")]
        assert samples.groupby("interval").size().max() <= SAMPLES
        assert set(samples["interval"]) <= set(range(INTERVALS))
        if len(mine) >= INTERVALS * SAMPLES:  # a spread: lower intervals, lower activations
            by = samples.groupby("interval")["activation"].median()
            assert by.iloc[0] < by.iloc[-1]
    assert math.isinf(edges[-1]) and summary["errors"] == 1


def test_the_same_bytes_however_split_or_resumed(done, tiny_dir, data, sae_dir, tmp_path, llm):
    out, _ = done
    other = tmp_path / "other"
    run(tiny_dir, data, sae_dir, other, docs_per_shard=3)
    assert digests(other) == digests(out)
    (other / "shards" / "00001.safetensors").unlink()
    summary = run(tiny_dir, data, sae_dir, other, docs_per_shard=3)
    assert summary["computed"] == 1 and digests(other) == digests(out)
    on_mine = tmp_path / "mine"  # on this process's engine: loaded for the job, then unloaded
    run(tiny_dir, data, sae_dir, on_mine, llm=llm)
    assert digests(on_mine) == digests(out) and sorted(llm.saes) == ["s"]


def test_the_view_reads_a_feature(done):
    from workbench.inspect.dashboards import FeatureDashboards

    dashboards = FeatureDashboards(str(done[0]))
    f = int(dashboards.features["fires"].idxmax())
    view = dashboards.feature(f)
    assert view.top[0]["activation"] == dashboards.features["max_activation"][f]
    html = view._repr_html_()
    assert f"feature {f}" in html and "wb-dash" in html
    assert len(dashboards) == D_SAE and f"{D_SAE} features of {HOOK}" in repr(dashboards)
    assert dashboards.densest(3)["feature"].iloc[0] == f


def test_refusals(tiny_dir, data, sae_dir, tmp_path):
    with pytest.raises(JobError, match="by name or path"):
        DashboardJob(object(), data, sae_dir, str(tmp_path / "x"))
    with pytest.raises(JobError, match="takes no 'scores'"):
        DashboardJob(tiny_dir, data, sae_dir, str(tmp_path / "x"), scores=True)
    from workbench.errors import ValidationError

    with pytest.raises(ValidationError, match="is missing") as error:
        DashboardJob(tiny_dir, data, str(tmp_path / "nothing"), str(tmp_path / "x"))
    assert error.value.parameter == "sae"
    wide = save_sae(str(tmp_path / "wide"), {
        "W_enc": torch.zeros(32, 4), "b_enc": torch.zeros(4), "W_dec": torch.zeros(4, 32),
        "b_dec": torch.zeros(32)}, HOOK)
    with pytest.raises(JobError, match="d_in 32 is not the width"):
        run(tiny_dir, data, wide, tmp_path / "y")


@pytest.mark.slow
def test_two_ray_replicas_write_the_same_bytes(done, tiny_dir, data, sae_dir, tmp_path,
                                                ray_local):
    out = tmp_path / "ray"
    summary = run(tiny_dir, data, sae_dir, out, ray=True, replicas=2)
    assert summary["computed"] == 3 and digests(out) == digests(done[0])


def test_the_command_line(done, tiny_dir, data, sae_dir, tmp_path):
    """`workbench feature-dashboards` writes the same bytes; `workbench capture --sae` captures
    an SAE's hooks (dense) from a dataset."""

    from workbench.apps.cli import main
    from workbench.jobs.reader import CaptureReader

    common = ["--model", tiny_dir, "--dtype", "float32", "--data", data, "--id-column", "id"]
    assert main(["feature-dashboards", *common, "--sae", sae_dir, "--out",
                 str(tmp_path / "d"), "--docs-per-shard", "5"]) == 0
    assert digests(tmp_path / "d") == digests(done[0])
    site = f"{HOOK}.hook_sae_acts_post"
    assert main(["capture", *common, "--sae", f"s={sae_dir}", "--capture",
                 json.dumps({"sites": [site], "positions": {"start": 1}}), "--out",
                 str(tmp_path / "c")]) == 0
    rows = CaptureReader(tmp_path / "c").site(site)
    assert rows.shape[1] == D_SAE and rows.shape[0] == json.loads(
        (done[0] / DASHBOARDS_FILE).read_text())["tokens"] - (len(DOCS) - 1)
    assert int((rows > 0).sum()) == int(pd.read_parquet(done[0] / FEATURES_FILE)["fires"].sum())
    with pytest.raises(SystemExit):
        main(["capture", *common, "--sae", "nameless", "--capture", "resid_post", "--out",
              str(tmp_path / "e")])
