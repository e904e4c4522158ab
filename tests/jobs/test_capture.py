"""Capture jobs on the tiny llama in this process: the folder's layout, reading back, resume,
refusals before the start, error rows, chat masks, and exactness against one request."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors import safe_open

from workbench.jobs import shards as sh
from workbench.jobs.capture import CaptureJob, JobError
from workbench.jobs.reader import CaptureReader

DOCS = [{"id": "a", "text": "The quick brown fox jumps over the lazy dog."},
        {"id": "b", "text": ""},
        {"id": "c", "text": "Hello world, this is a test of the capture job."},
        {"id": "d", "text": "A"},
        {"id": "e", "text": "Numbers: one two three four five six seven."}]
SPEC = {"sites": ["resid_post", "attn_out"], "layers": [0, -1]}


@pytest.fixture(scope="module")
def llm(tiny_dir):
    from workbench import LLM

    return LLM(model=tiny_dir, dtype="float32", batch_invariant=True)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "docs.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    return str(path)


def job_of(llm, data, out, **kw):
    kw = {"scores": True, "id_column": "id", "docs_per_shard": 2, "progress": False, **kw}
    return CaptureJob(llm.config.model, data, kw.pop("capture", SPEC), str(out), llm=llm, **kw)


@pytest.fixture(scope="module")
def done(llm, data, tmp_path_factory):
    out = tmp_path_factory.mktemp("cap")
    job = job_of(llm, data, out)
    return job, job.run(), out


def shard_hashes(out):
    return {p.name: sh.sha256_file(p) for p in sorted((out / "shards").glob("*.safetensors"))}


def test_layout(done):
    job, summary, out = done
    assert summary["documents"] == 5 and summary["shards"] == 3 and summary["errors"] == 1
    assert 0 < summary["first_shard_s"] <= summary["seconds"]
    assert summary["steady_tokens_per_s"] > 0  # the rate after the first shard
    assert sorted(os.listdir(out)) == ["index.parquet", "job.json", "shards"]
    assert sorted(os.listdir(out / "shards")) == [f"0000{k}.{e}" for k in range(3)
                                                  for e in ("json", "safetensors")]
    meta = json.loads((out / "job.json").read_text())
    assert meta["batch_invariant"] is True and meta["capture"]["names"] == [
        "blocks.0.hook_resid_post", "blocks.1.hook_resid_post", "blocks.0.hook_attn_out",
        "blocks.1.hook_attn_out"]
    for key in ("model", "dtype", "kernel", "source", "workbench_version"):
        assert key in meta
    manifest = json.loads((out / "shards" / "00000.json").read_text())
    assert manifest["documents"] == 2 and manifest["errors"] == {"1": "empty document"}
    assert manifest["sha256"] == sh.sha256_file(out / "shards" / "00000.safetensors")
    with safe_open(str(out / "shards" / "00000.safetensors"), "pt") as f:
        tokens = f.get_tensor("token_ids")
        assert f.get_tensor("doc_offsets").tolist() == [0, len(tokens), len(tokens)]
        assert f.get_tensor("blocks.0.hook_resid_post").shape == (len(tokens), 64)
        assert torch.isnan(f.get_tensor("logprob")[0])
    index = job.open().index
    assert list(index.columns) == ["doc_id", "row", "shard", "start", "stop", "tokens", "error"]
    assert index["doc_id"].tolist() == ["a", "b", "c", "d", "e"]
    assert index.loc[1, "error"] == "empty document" and index.loc[1, "tokens"] == 0


def test_exact_as_one_request(done, llm):
    """A document read back is its request's capture, bit for bit."""
    from workbench import SamplingParams

    job, _, out = done
    reader = job.open()
    ids = reader.token_ids("c")
    spec = {k: v for k, v in job.job["capture"].items() if k != "names"}
    params = SamplingParams(max_tokens=1, temperature=0, capture=spec, prompt_logprobs=0,
                            token_stats=True)
    want = llm.generate([{"prompt_token_ids": ids}], params)[0]
    got = reader.doc("c")
    assert list(got) == list(want.activations)
    for name in got:
        assert torch.equal(got[name], want.activations[name]), name
    scores = reader.scores("c")
    assert scores["logprob"].tolist()[1:] == [
        want.prompt_logprobs[p][t].logprob for p, t in enumerate(ids) if p]
    assert reader.site("blocks.1.hook_resid_post").shape[0] == int(reader.index["tokens"].sum())
    rows = reader.rows("blocks.0.hook_attn_out")
    batch = next(iter(reader.dataloader("blocks.0.hook_attn_out", batch_size=4)))
    assert len(rows) == int(reader.index["tokens"].sum()) and batch.shape == (4, 64)
    with pytest.raises(KeyError, match="empty document"):
        reader.doc("b")


def test_without_scores_each_request_stops_after_the_deepest_layer_captured(llm, data,
                                                                            tmp_path):
    """No logits wanted: each document's request ends its forward after layer 0
    (`stop_at_layer`); its rows are still the whole forward's bits (the job with scores, whose
    requests run every layer and the LM head)."""
    from workbench.jobs.capture import ShardComputer

    spec = {"sites": ["resid_post", "mlp_out"], "layers": [0]}
    stopped = job_of(llm, data, tmp_path / "stopped", capture=spec, scores=False)
    whole = job_of(llm, data, tmp_path / "whole", capture=spec, scores=True)
    stopped.run()
    whole.run()
    assert ShardComputer(llm, stopped.job, str(tmp_path / "stopped")).params.stop_at_layer == 1
    assert ShardComputer(llm, whole.job, str(tmp_path / "whole")).params.stop_at_layer is None
    for doc in ("a", "c", "d", "e"):
        got, want = stopped.open().doc(doc), whole.open().doc(doc)
        assert list(got) == list(want)
        for name in got:
            assert torch.equal(got[name], want[name]), (doc, name)


def test_resume_and_truncated_shard(done, llm, data):
    job, _, out = done
    before = shard_hashes(out)
    again = job_of(llm, data, out).run()
    assert again["computed"] == 0 and again["reused"] == 3
    path = out / "shards" / "00001.safetensors"
    path.write_bytes(path.read_bytes()[:100])  # a truncated shard: found by its sha256
    (out / "shards" / "00002.json").unlink()  # a shard without its manifest
    again = job_of(llm, data, out).run()
    assert again["computed"] == 2 and shard_hashes(out) == before


def test_other_job_refused(done, llm, data):
    _, _, out = done
    with pytest.raises(JobError, match="capture: folder has"):
        job_of(llm, data, out, capture={"sites": ["resid_pre"]}).run()
    with pytest.raises(JobError, match="source"):
        job_of(llm, DOCS[:2], out).run()


@pytest.mark.parametrize("spec, match", [
    ({"sites": ["nope"]}, "unknown site"),
    ({"sites": ["resid_post"], "layers": [7]}, "out of range"),
    ({"sites": ["pattern"], "layers": [0]}, "attention patterns"),
])
def test_spec_refused_before_start(llm, data, tmp_path, spec, match):
    with pytest.raises(JobError, match=match):
        job_of(llm, data, tmp_path / "x", capture=spec).run()
    assert not (tmp_path / "x").exists()


def test_missing_column_and_long_document(llm, data, tmp_path):
    with pytest.raises(JobError, match="column 'body' is in no row"):
        job_of(llm, data, tmp_path / "x", text_column="body").run()
    long = [{"text": "word " * 3000}, {"text": "short"}]
    job = CaptureJob(llm.config.model, long, SPEC, str(tmp_path / "y"), llm=llm, progress=False)
    summary = job.run()
    index = job.open().index
    assert summary["errors"] == 1 and "longer than the context" in index.loc[0, "error"]


def test_unwritable_folder(llm, data, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(JobError, match="cannot write to the output folder"):
        job_of(llm, data, blocker / "out").run()


def test_read_only_folder(llm, data, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("running as root: permissions do not bind")
        with pytest.raises(JobError, match="cannot write"):
            job_of(llm, data, locked / "out").run()
        assert not (locked / "out").exists()
    finally:
        locked.chmod(0o700)


def test_chat_documents_mask_the_assistant(llm, tmp_path):
    conv = [{"messages": [{"role": "user", "content": "Hi"},
                          {"role": "assistant", "content": "Hello there"},
                          {"role": "user", "content": "Bye"},
                          {"role": "assistant", "content": "Goodbye"}]}]
    job = CaptureJob(llm.config.model, conv, {"sites": ["resid_post"], "layers": [0]},
                     str(tmp_path / "chat"), llm=llm, chat_column="messages", scores=True,
                     progress=False)
    job.run()
    scores = job.open().scores(0)
    tok = llm.get_tokenizer()
    marked = tok.decode(scores.loc[scores["assistant_mask"], "token_id"].tolist())
    assert "Hello there" in marked and "Goodbye" in marked
    assert "Hi" not in marked and "Bye" not in marked.replace("Goodbye", "")


def test_reader_without_workbench_files(done):
    """index.parquet, job.json and the shards open with pandas, json and safetensors alone."""
    import pandas as pd

    _, _, out = done
    assert len(pd.read_parquet(out / "index.parquet")) == 5
    assert CaptureReader(out).doc("a")["resid_post", 0].shape[1] == 64


def test_cli_capture(tiny_dir, data, tmp_path):
    from workbench.apps.cli import main

    argv = ["capture", "--model", tiny_dir, "--dtype", "float32", "--data", data, "--capture",
            json.dumps({"sites": ["resid_post"], "layers": [1]}), "--out", str(tmp_path / "o"),
            "--id-column", "id", "--docs-per-shard", "3"]
    assert main(argv) == 0
    assert len(CaptureReader(tmp_path / "o").index) == 5
    with pytest.raises(SystemExit):
        main([*argv[:-6], "--capture", '{"sites": ["nope"]}', "--out", str(tmp_path / "p")])


def test_parquet_input_same_shards_as_jsonl(done, llm, tmp_path):
    """The same rows from Parquet: other source fingerprint, same shard bytes."""
    import pandas as pd

    _, _, out = done
    path = tmp_path / "docs.parquet"
    pd.DataFrame(DOCS).to_parquet(path)
    job = job_of(llm, str(path), tmp_path / "pq")
    job.run()
    assert shard_hashes(tmp_path / "pq") == shard_hashes(out)
    assert job.open().index["doc_id"].tolist() == ["a", "b", "c", "d", "e"]


def test_a_ray_job_decides_batch_invariance_before_its_replicas(tiny_dir, data, tmp_path):
    """The driver asks the engine's own check on the model's skeleton (no weights): a mixture
    of experts is refused, so job.json says batch_invariant false and why, and every replica
    runs the same arithmetic; the tiny llama keeps it."""
    pytest.importorskip("ray")
    from workbench.jobs.capture import batch_invariance_refusal
    from workbench.models import tiny_model

    moe = tiny_model("mixtral", seed=0)
    moe.model.save_pretrained(tmp_path / "moe")
    moe.tokenizer.save_pretrained(tmp_path / "moe")
    assert "experts' products run batched by expert" in batch_invariance_refusal(
        str(tmp_path / "moe"), "float32")
    assert batch_invariance_refusal(tiny_dir, "float32") is None
    job = CaptureJob(str(tmp_path / "moe"), data, SPEC, str(tmp_path / "o"), ray=True,
                     dtype="float32", progress=False).plan()
    assert job["batch_invariant"] is False and "experts" in job["batch_invariant_note"]
    assert json.loads((tmp_path / "o" / "job.json").read_text())["batch_invariant"] is False
    with pytest.raises(JobError, match="experts"):  # asked for: refused before any replica
        CaptureJob(str(tmp_path / "moe"), data, SPEC, str(tmp_path / "q"), ray=True,
                   dtype="float32", batch_invariant=True, progress=False).plan()
    plain = CaptureJob(tiny_dir, data, SPEC, str(tmp_path / "p"), ray=True, dtype="float32",
                       progress=False).plan()
    assert plain["batch_invariant"] is True and plain["batch_invariant_note"] is None


def test_dataset_and_frame_inputs_same_shards(done, llm, tmp_path):
    """A `datasets.Dataset` and a pandas DataFrame of the same rows: the same shard bytes as
    the JSONL file's; a dict (whose keys a list() would take for documents) is refused."""
    import datasets
    import pandas as pd

    _, _, out = done
    for name, data in (("ds", datasets.Dataset.from_list(DOCS)), ("df", pd.DataFrame(DOCS))):
        job = job_of(llm, data, tmp_path / name)
        job.run()
        assert shard_hashes(tmp_path / name) == shard_hashes(out), name
        assert job.open().index["doc_id"].tolist() == ["a", "b", "c", "d", "e"]
    assert json.loads((tmp_path / "ds" / "job.json").read_text())["source_description"] == \
        "a datasets.Dataset"
    with pytest.raises(JobError, match="the data is a dict"):
        job_of(llm, {"text": ["a", "b"]}, tmp_path / "dict").run()


def test_the_ids_users_already_have_are_the_default(llm, data, tmp_path):
    """Without `id_column`, a column `id` (or `custom_id`) in which every row has its own id
    numbers the documents, and job.json says so; without one, the row numbers do."""
    from workbench.jobs.dataset import Source, default_id_column

    job = job_of(llm, data, tmp_path / "ids", id_column=None)
    job.run()
    assert job.open().index["doc_id"].tolist() == ["a", "b", "c", "d", "e"]
    assert json.loads((tmp_path / "ids" / "job.json").read_text())["columns"]["id"] == "id"
    assert default_id_column([{"custom_id": "r1"}, {"custom_id": 7}]) == "custom_id"
    assert default_id_column([{"id": "x"}, {"id": "x"}]) is None  # not its own: row numbers
    assert default_id_column([{"id": "x"}, {"text": "no id"}]) is None
    assert Source([{"text": "a", "id": 1}, {"text": "b", "id": 2}]).documents(0, 2)[1].doc_id \
        == "2"
    assert Source([{"text": "a"}, {"text": "b"}]).id_column is None
    named = Source([{"text": "a", "id": 1, "key": "k"}], id_column="key")
    assert named.id_column == "key" and named.documents(0, 1)[0].doc_id == "k"
