"""prepared_dir: build a model directory once, atomically, under a lock."""

import json
import threading
import time

import pytest

from workbench.models.cache import MARKER, cache_dir, model_cache_dir, prepared_dir, read_marker

SOURCE = {"kind": "test", "file": "weights.bin", "size": 3}


def _builder(calls, delay=0.0):
    def build(out):
        calls.append(out)
        time.sleep(delay)
        (out / "config.json").write_text("{}")
    return build


def test_cache_dir_follows_the_environment_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))
    assert cache_dir() == tmp_path
    assert model_cache_dir("m") == tmp_path / "models" / "m"


def test_builds_once_then_reuses(tmp_path):
    calls = []
    target = tmp_path / "models" / "m"
    assert prepared_dir(target, SOURCE, _builder(calls)) == target
    prepared_dir(target, SOURCE, _builder(calls))
    assert len(calls) == 1
    assert (target / "config.json").is_file()
    assert read_marker(target)["source"] == SOURCE


def test_a_failed_build_leaves_nothing_behind(tmp_path):
    def broken(out):
        (out / "half-written").write_text("x")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        prepared_dir(tmp_path / "m", SOURCE, broken)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".m.lock"]


def test_a_changed_source_rebuilds(tmp_path):
    calls = []
    prepared_dir(tmp_path / "m", SOURCE, _builder(calls))
    prepared_dir(tmp_path / "m", {**SOURCE, "size": 4}, _builder(calls))
    assert len(calls) == 2
    assert read_marker(tmp_path / "m")["source"]["size"] == 4
    assert not list(tmp_path.glob(".m.tmp-*"))


def test_a_directory_without_marker_is_rebuilt(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{\"half\": true}")
    calls = []
    prepared_dir(tmp_path / "m", SOURCE, _builder(calls))
    assert len(calls) == 1
    assert json.loads((tmp_path / "m" / "config.json").read_text()) == {}


def test_leftovers_of_a_crashed_build_are_cleaned(tmp_path):
    (tmp_path / ".m.tmp-crashed").mkdir()
    prepared_dir(tmp_path / "m", SOURCE, _builder([]))
    assert not (tmp_path / ".m.tmp-crashed").exists()
    assert (tmp_path / "m" / MARKER).is_file()


def test_concurrent_callers_build_once(tmp_path):
    calls, errors = [], []

    def prepare():
        try:
            prepared_dir(tmp_path / "m", SOURCE, _builder(calls, delay=0.2))
        except Exception as error:  # surfaced by the assertion below
            errors.append(error)

    threads = [threading.Thread(target=prepare) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(calls) == 1
