"""Training SAEs with SAELens (`workbench/features/train.py`, `workbench/jobs/sae_training.py`,
`workbench train-sae`): on a capture job of the tiny llama, the saved folder read the same by
SAELens's `SAE.load_from_disk` and workbench's `SparseAutoencoder.load`, the reported figures
against a recomputation in plain torch from the saved weights, refusals naming the parameter,
planted features recovered, the same weights from the same seed, and the next-token loss with
the SAE spliced in against patching its reconstruction in by hand."""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch
from sae_lens import SAE
from safetensors.torch import load_file

from workbench.errors import ValidationError
from workbench.features import train as training
from workbench.features.sae import SparseAutoencoder
from workbench.jobs.capture import CaptureJob
from workbench.jobs.reader import CaptureReader
from workbench.jobs.sae_training import (
    SAE_NAME,
    document_rows,
    next_token_loss,
    split_rows,
    train_sae,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SITE = "blocks.1.hook_resid_post"
FAST = {"d_sae": 128, "k": 8, "training_tokens": 256 * 300, "batch_size": 256, "lr": 3e-3,
        "eval_documents": 20}


@pytest.fixture(scope="module")
def llm(tiny_llama_dir):
    from workbench import LLM

    return LLM(model=str(tiny_llama_dir), dtype="float32", batch_invariant=True)


@pytest.fixture(scope="module")
def capture(llm, tmp_path_factory):
    """data/sentences.jsonl's first 160 sentences through the tiny llama: layer 1's residual
    stream and per-token scores."""
    out = tmp_path_factory.mktemp("capture")
    with open(os.path.join(ROOT, "data", "sentences.jsonl")) as f:
        docs = [json.loads(line) for line in f][:160]
    CaptureJob(llm.config.model, docs, {"sites": ["resid_post"], "layers": [1]}, str(out),
               llm=llm, scores=True, id_column="id", progress=False).run()
    return str(out)


@pytest.fixture(scope="module")
def trained(capture, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("sae") / "topk")
    return train_sae(capture, SITE, out=out, eval_loss=False, **FAST)


def held_out(capture, documents=20, skip=1):
    """The rows of the last `documents` documents, each from position `skip` on, read one
    document at a time."""
    reader = CaptureReader(capture)
    return torch.cat([reader.doc(d)[SITE][skip:]
                      for d in reader.index["doc_id"].tolist()[-documents:]])


@pytest.mark.parametrize("skip", [0, 1, 3])
def test_the_rows_split_a_shard_at_a_time_are_the_documents_own(capture, skip):
    """Training and held-out rows, filled shard by shard (the split inside a shard), are the
    documents' rows from position `skip` on, in order, in the shards' dtype."""
    reader = CaptureReader(capture)
    assert len(reader.shards) > 2
    documents = document_rows(reader, SITE)
    for held in (1, 20, len(documents) - 1):
        train_rows, eval_rows, skipped = split_rows(reader, SITE, documents[-held][1], skip)
        ids = reader.index["doc_id"].tolist()
        want = [reader.doc(d)[SITE][skip:] for d in ids]
        assert torch.equal(train_rows, torch.cat(want[:-held]))
        assert torch.equal(eval_rows, torch.cat(want[-held:]))
        assert skipped == sum(min(skip, len(reader.doc(d)[SITE])) for d in ids)


def test_both_loaders_read_the_folder_and_encode_the_same(trained, capture):
    x = held_out(capture)
    theirs = SAE.load_from_disk(trained.path)
    ours = SparseAutoencoder.load("mine", trained.path)
    assert ours.hook_name == SITE == theirs.cfg.metadata.hook_name
    assert (ours.architecture, ours.d_sae, ours.k) == ("topk", 128, 8)
    with torch.no_grad():
        acts = theirs.encode(x)
        torch.testing.assert_close(ours.encode(x), acts, atol=1e-6, rtol=0)
        torch.testing.assert_close(ours.decode(acts), theirs.decode(acts), atol=1e-6, rtol=0)


def test_reported_figures_equal_plain_torch_from_the_saved_weights(trained, capture):
    x = held_out(capture).double()
    w = {k: v.double() for k, v in load_file(os.path.join(trained.path,
                                                          "sae_weights.safetensors")).items()}
    cfg = json.load(open(os.path.join(trained.path, "cfg.json")))
    assert cfg["normalize_activations"] == "none" and cfg["apply_b_dec_to_input"]
    norms = w["W_dec"].norm(dim=-1) if cfg["rescale_acts_by_decoder_norm"] else 1.0
    pre = ((x - w["b_dec"]) @ w["W_enc"] + w["b_enc"]) * norms
    top = pre.topk(cfg["k"], dim=-1)
    acts = torch.zeros_like(pre).scatter(-1, top.indices, top.values.relu())
    recon = (acts / norms) @ w["W_dec"] + w["b_dec"]
    fvu = float((recon - x).pow(2).sum() / (x - x.mean(0)).pow(2).sum())
    measured = trained.reconstruction
    assert measured.rows == len(x) == trained.split["held_out_rows"]
    reader = CaptureReader(capture)
    assert trained.split["training_rows"] == int(reader.index["tokens"][:-20].sum()) - 140
    assert trained.split["skipped_rows"] == 160  # each document's first position
    assert measured.l0 == pytest.approx(float((acts != 0).sum(-1).double().mean()), abs=1e-9)
    assert measured.fvu == pytest.approx(fvu, rel=1e-5)
    assert measured.dead_features == int(((acts != 0).sum(0) == 0).sum())
    assert measured.dead_share == measured.dead_features / 128
    assert trained.training.tokens == 256 * 300 and trained.training.steps == 300
    assert trained.config.dead_feature_window == 30  # a tenth of the run: under SAELens's 1000
    written = json.load(open(os.path.join(trained.path, "training.json")))
    assert written == json.loads(json.dumps(trained.to_dict()))
    assert written["reconstruction"]["fvu"] == measured.fvu and written["loss"] is None
    assert "FVU" in repr(trained) and "<table" in trained._repr_html_()


@pytest.mark.parametrize(("change", "parameter"), [
    ({"site": "blocks.0.hook_resid_post"}, "site"),  # not captured
    ({"architecture": "gated"}, "architecture"),
    ({"architecture": "standard"}, "k"),  # k given to an L1 SAE
    ({"k": 8.5}, "k"),
    ({"k": 129}, "k"),
    ({"sparsity_coefficient": 0.1}, "sparsity_coefficient"),  # to a TopK SAE
    ({"batch_size": 0}, "batch_size"),
    ({"lr": -1.0}, "lr"),
    ({"eval_documents": 160}, "eval_documents"),
    ({"training_tokens": 10}, "training_tokens"),
    ({"dead_feature_window": 0}, "dead_feature_window"),
    ({"skip_positions": -1}, "skip_positions"),
    ({"b_dec_init": "median"}, "b_dec_init"),
    ({"lr_decay_steps": -1}, "lr_decay_steps"),
    ({"lr_decay_steps": 301}, "lr_decay_steps"),  # more than the run's 300 steps
    ({"skip_positions": 100}, "eval_documents"),  # no rows left
])
def test_refused_before_training_naming_the_parameter(capture, tmp_path, change, parameter):
    kwargs = {"site": SITE, "out": str(tmp_path / "sae"), "eval_loss": False, **FAST, **change}
    with pytest.raises(ValidationError) as info:
        train_sae(capture, **kwargs)
    assert info.value.parameter == parameter
    assert not os.path.exists(tmp_path / "sae")


def test_a_folder_in_use_is_refused(capture, trained):
    with pytest.raises(ValidationError) as info:
        train_sae(capture, SITE, out=trained.path, eval_loss=False, **FAST)
    assert info.value.parameter == "out"


def test_without_sae_lens_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "sae_lens", None)
    with pytest.raises(ImportError, match=r"workbench\[train\]"):
        training.sae_lens()


def planted(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows that are sparse sums of 48 planted unit directions in 32 dimensions (about 3 a row,
    magnitudes 0.5 to 2.5), and the directions."""
    g = torch.Generator().manual_seed(seed)
    directions = torch.nn.functional.normalize(torch.randn(48, 32, generator=g), dim=-1)
    active = torch.rand(n, 48, generator=g) < 3 / 48
    return (active * (torch.rand(n, 48, generator=g) * 2 + 0.5)) @ directions, directions


def test_planted_features_are_found(tmp_path):
    rows, directions = planted(40_000)
    config = training.TrainingConfig("topk", 64, 4, training_tokens=36_000 * 8, batch_size=256,
                                     lr=3e-3)
    training.train(rows[:36_000], SITE, str(tmp_path / "sae"), config)
    sae = SparseAutoencoder.load("planted", str(tmp_path / "sae"))
    measured = training.reconstruction(sae, rows[36_000:])
    assert measured.fvu < 0.12 and measured.l0 <= 4  # rows of more than 4 features: not 0
    cosines = torch.nn.functional.normalize(sae.weights["W_dec"], dim=-1) @ directions.T
    assert cosines.max(0).values.min() > 0.95  # every planted direction is a feature's


@pytest.mark.parametrize("b_dec_init", ["mean", "zeros"])
def test_the_decoder_bias_starts_at_the_rows_mean_or_zeros(tmp_path, b_dec_init):
    rows = planted(2048, seed=2)[0] + 3.0
    config = training.TrainingConfig("topk", 64, 4, batch_size=2048, lr=1e-12,
                                     b_dec_init=b_dec_init)  # one step that barely moves
    training.train(rows, SITE, str(tmp_path / "sae"), config)
    b_dec = load_file(str(tmp_path / "sae" / "sae_weights.safetensors"))["b_dec"]
    start = rows.double().mean(0).float() if b_dec_init == "mean" else torch.zeros(32)
    torch.testing.assert_close(b_dec, start, atol=1e-5, rtol=1e-5)


def test_the_same_seed_gives_the_same_weights(tmp_path):
    rows, _ = planted(4096, seed=1)
    config = training.TrainingConfig("batchtopk", 64, 4, batch_size=256, seed=3)
    for name in ("a", "b"):
        training.train(rows, SITE, str(tmp_path / name), config)
    a, b = (load_file(str(tmp_path / name / "sae_weights.safetensors")) for name in "ab")
    assert sorted(a) == ["W_dec", "W_enc", "b_dec", "b_enc", "threshold"]  # as jumprelu
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert SparseAutoencoder.load("b", str(tmp_path / "b")).architecture == "jumprelu"


def test_the_loss_is_measured_through_the_engine(llm, capture, tmp_path):
    result = train_sae(capture, SITE, out=str(tmp_path / "sae"), llm=llm, loss_documents=4,
                       **FAST)
    loss = result.loss
    assert loss is not None and loss.documents == 4 and loss.tokens > 0
    assert loss.capture_max_abs_diff == 0.0  # the capture's engine: its scores, exactly
    assert loss.delta == loss.spliced - loss.clean and SAE_NAME not in llm.saes
    written = json.load(open(tmp_path / "sae" / "training.json"))
    assert written["loss"]["spliced"] == loss.spliced and "loss_delta" in result.metrics()
    assert "spliced" in repr(result)


def test_spliced_loss_equals_patching_the_reconstruction_in(llm, capture, trained):
    """The loss with the SAE spliced in (from position 1) equals the loss with its
    reconstruction of the captured rows set there by hand; the clean loss equals the capture's
    scores."""
    reader = CaptureReader(capture)
    docs = [str(d) for d in reader.index["doc_id"].tolist()[-3:]]
    ids = [reader.token_ids(d) for d in docs]
    recorded = [reader.scores(d)["logprob"].tolist() for d in docs]
    llm.load_sae(SAE_NAME, trained.path)
    try:
        loss = next_token_loss(llm, SAE_NAME, SITE, ids, recorded, skip_positions=1)
    finally:
        llm.unload_sae(SAE_NAME)
    assert loss.capture_max_abs_diff == 0.0
    sae = SparseAutoencoder.load("by-hand", trained.path)
    from workbench.sampling_params import SamplingParams

    total, count = 0.0, 0
    for d, tokens in zip(docs, ids):
        x = reader.doc(d)[SITE][1:]
        patch = {"site": SITE, "op": "set", "vector": sae.decode(sae.encode(x)).tolist(),
                 "positions": list(range(1, len(tokens)))}
        out = llm.generate({"prompt_token_ids": tokens}, SamplingParams(
            max_tokens=1, temperature=0, prompt_logprobs=0, interventions=[patch]))[0]
        total -= sum(out.prompt_logprobs[p][tokens[p]].logprob for p in range(1, len(tokens)))
        count += len(tokens) - 1
    assert loss.tokens == count and loss.spliced == total / count
    assert loss.recovered == (loss.zero - loss.spliced) / (loss.zero - loss.clean)


def test_the_command_line_trains_and_prints_the_figures(capture, tmp_path, capsys):
    from workbench.apps.cli import main

    out = str(tmp_path / "sae")
    argv = ["train-sae", "--shards", capture, "--site", SITE, "--out", out, "--d-sae", "64",
            "--k", "4", "--tokens", "25600", "--batch-size", "256", "--eval-documents", "16",
            "--no-eval-loss"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    figures = json.loads(printed[printed.index("{"):])
    assert figures["training_tokens"] == 25600 and 0 < figures["l0"] <= 4
    assert SparseAutoencoder.load("cli", out).d_sae == 64
    with pytest.raises(SystemExit) as exit_info:
        main([*argv[:6], str(tmp_path / "other"), "--architecture", "gated", "--no-eval-loss"])
    assert exit_info.value.code == 2
    assert "--architecture" in capsys.readouterr().err
