"""Capture jobs on a local Ray: the shards byte-identical (sha256) to a local run's with 1 and
2 replicas, a replica killed mid-shard (Ray restarts it and retries the shard), a driver killed
after some shards (the rerun computes only the rest), a missing Ray named, every replica
loaded before the first item."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from workbench.jobs import shards as sh
from workbench.jobs.capture import CaptureJob

DOCS = [{"text": f"Document number {i}: " + "alpha beta gamma " * (i % 5 + 1)}
        for i in range(8)] + [{"text": ""}]
SPEC = {"sites": ["resid_post", "mlp_out"], "layers": [0, 1]}

pytestmark = pytest.mark.slow


def hashes(out):
    return {p.name: sh.sha256_file(p) for p in sorted((out / "shards").glob("*.safetensors"))}


@pytest.fixture(scope="module")
def local_run(tiny_dir, tmp_path_factory):
    from workbench import LLM

    out = tmp_path_factory.mktemp("local")
    llm = LLM(model=tiny_dir, dtype="float32", batch_invariant=True)
    CaptureJob(tiny_dir, DOCS, SPEC, str(out), llm=llm, scores=True, docs_per_shard=2,
               dtype="float32", progress=False).run()
    return out


def ray_job(tiny_dir, out, replicas, **kw):
    return CaptureJob(tiny_dir, DOCS, SPEC, str(out), scores=True, docs_per_shard=2,
                      dtype="float32", ray=True, replicas=replicas, progress=False, **kw)


def differing_tensors(a, b):
    """Per shard, the tensors whose bits differ between two folders."""
    from safetensors.torch import load_file

    diffs = {}
    for name in hashes(a):
        ta, tb = load_file(a / "shards" / name), load_file(b / "shards" / name)
        bad = [k for k in ta if not _same_bits(ta[k], tb.get(k))]
        if bad:
            diffs[name] = bad
    return diffs


def _same_bits(x, y):
    import torch

    if y is None or x.shape != y.shape or x.dtype != y.dtype:
        return False
    if x.dtype == torch.float32:  # bits, so NaN == NaN
        return torch.equal(x.view(torch.int32), y.view(torch.int32))
    return torch.equal(x, y)


@pytest.mark.parametrize("replicas", [1, 2])
def test_ray_shards_identical_to_local(local_run, tiny_dir, tmp_path, ray_local, replicas):
    summary = ray_job(tiny_dir, tmp_path / "ray", replicas).run()
    assert summary["computed"] == 5 and summary["errors"] == 1
    assert differing_tensors(local_run, tmp_path / "ray") == {}
    assert hashes(tmp_path / "ray") == hashes(local_run)
    # a Ray resume of it reuses everything
    assert ray_job(tiny_dir, tmp_path / "ray", replicas).run()["computed"] == 0


def test_replica_killed_mid_shard(local_run, tiny_dir, tmp_path, ray_local):
    marker = tmp_path / "killed-once"
    env = {"runtime_env": {"env_vars": {"WORKBENCH_CAPTURE_TEST_KILL": str(marker)}}}
    summary = ray_job(tiny_dir, tmp_path / "out", 2, ray_options=env).run()
    assert marker.exists()  # a replica did die in shard 1
    assert summary["computed"] == 5
    assert hashes(tmp_path / "out") == hashes(local_run)
    leftovers = [p.name for p in (tmp_path / "out" / "shards").iterdir()
                 if p.name.startswith(".")]
    assert leftovers == []  # the dead replica's half shard was cleaned, nothing duplicated
    assert len(list((tmp_path / "out" / "shards").glob("*.safetensors"))) == 5


def test_driver_killed_then_rerun(local_run, tiny_dir, tmp_path):
    """A local job's process killed after some shards: the rerun computes only the rest and
    the folder equals an uninterrupted run's."""
    docs = tmp_path / "docs.jsonl"
    many = DOCS * 6
    docs.write_text("".join(json.dumps(d) + "\n" for d in many))
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "workbench.apps.cli", "capture", "--model", tiny_dir,
            "--dtype", "float32", "--data", str(docs), "--capture", json.dumps(SPEC),
            "--out", str(out), "--scores", "--docs-per-shard", "1"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None:
            if len(list((out / "shards").glob("*.json"))) >= 3:
                os.kill(proc.pid, signal.SIGKILL)
                break
            time.sleep(0.01)
    finally:
        proc.wait()
    done_at_kill = len([k for k in range(len(many)) if sh.shard_done(out, k, k, k + 1)])
    assert 0 < done_at_kill < len(many)
    assert not (out / "index.parquet").exists()
    job = CaptureJob(tiny_dir, str(docs), SPEC, str(out), scores=True, docs_per_shard=1,
                     dtype="float32", progress=False)
    summary = job.run()
    assert summary["computed"] == len(many) - done_at_kill
    whole = tmp_path / "whole"
    CaptureJob(tiny_dir, str(docs), SPEC, str(whole), llm=job.llm, scores=True,
               docs_per_shard=1, dtype="float32", progress=False).run()
    assert hashes(out) == hashes(whole)


def test_without_ray_says_how_to_install(monkeypatch, tiny_dir, tmp_path):
    import builtins

    real = builtins.__import__

    def no_ray(name, *args, **kwargs):
        if name == "ray" or name.startswith("ray."):
            raise ImportError("No module named 'ray'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    with pytest.raises(ImportError, match=r"pip install 'workbench\[ray\]'"):
        ray_job(tiny_dir, tmp_path / "x", 1).run()


CLUSTER_SCRIPT = """
import json, sys
import ray
from ray.cluster_utils import Cluster
from workbench.jobs.capture import CaptureJob

model, out, docs, spec = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
cluster.add_node(num_cpus=1)
ray.init(address=cluster.address, log_to_driver=False)
try:
    nodes = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])
    summary = CaptureJob(model, docs, spec, out, scores=True, docs_per_shard=2, dtype="float32",
                         ray=True, replicas=2, progress=False).run()
    print(json.dumps({"nodes": nodes, "summary": summary}))
finally:
    ray.shutdown()
    cluster.shutdown()
"""


def test_two_node_cluster_same_shards(local_run, tiny_dir, tmp_path):
    """`ray.cluster_utils.Cluster`: a head and a second node of 1 CPU each (in their own
    process, this session's Ray aside), one replica on each; the shards equal the local run's
    and their manifests name the nodes that computed them."""
    pytest.importorskip("ray")
    out = tmp_path / "cluster"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    done = subprocess.run([sys.executable, "-c", CLUSTER_SCRIPT, tiny_dir, str(out),
                           json.dumps(DOCS), json.dumps(SPEC)], capture_output=True, text=True,
                          env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(found["nodes"]) == 2 and found["summary"]["computed"] == 5
    assert hashes(out) == hashes(local_run)
    used = {json.loads(p.read_text())["ray_node_id"] for p in (out / "shards").glob("*.json")}
    assert used <= set(found["nodes"]) and len(used) == 2, used


def test_every_replica_loads_before_the_first_item(ray_local, tmp_path):
    """A replica that loads 4 s after the other still gets items: the pool waits for every
    replica before it hands out the first (else the fast one takes the whole job, and the
    two-node test above finds one node in the manifests)."""
    from workbench.jobs.ray_pool import run_pool

    class SlowSecond:
        def __init__(self, marks: str):
            try:
                os.close(os.open(os.path.join(marks, "first"), os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                time.sleep(4.0)

        def __call__(self, batch):
            batch["pid"] = os.getpid()
            return batch

    rows = list(run_pool([{"i": i} for i in range(6)], SlowSecond, {"marks": str(tmp_path)},
                         replicas=2))
    assert sorted(r["i"] for r in rows) == list(range(6))
    assert len({r["pid"] for r in rows}) == 2


def test_a_replica_refuses_a_folder_its_node_does_not_share(tiny_dir, tmp_path):
    """On a cluster the replicas write into the driver's --out: a node that does not see the
    driver's job.json there stops before loading the model, saying a shared folder is needed."""
    from workbench.jobs.capture import CaptureReplica, JobError

    job = CaptureJob(tiny_dir, DOCS, SPEC, str(tmp_path / "driver"), ray=True, dtype="float32",
                     progress=False).plan()
    with pytest.raises(JobError, match="--out must be a folder every node sees"):
        CaptureReplica(job, str(tmp_path / "elsewhere"), {})


def test_bench_capture_figures(tiny_dir, ray_local):
    """`workbench bench`'s capture figures on the tiny llama: the local job against plain
    prefill, and the Ray job's wall-clock, steady and compute ratios; this session's Ray is
    used and left running (the bench shuts down only a Ray it started)."""
    from workbench import LLM
    from workbench.apps import bench

    config = bench.BenchConfig.quick(model=tiny_dir, dtype="float32")
    side = bench.Contenders(config, theirs=object(),
                            ours=LLM(model=tiny_dir, dtype="float32", seed=0))
    found = bench.bench_capture(side, config)
    assert set(found) == {"capture_job_tok_s", "capture_plain_prefill_tok_s",
                          "capture_prefill_ratio", "capture_mb_per_s", "capture_ray2_ratio",
                          "capture_ray2_steady_ratio", "capture_ray2_first_shard_s",
                          "capture_ray2_compute_ratio"}
    assert all(v > 0 for v in found.values()), found
    assert ray_local.is_initialized()
