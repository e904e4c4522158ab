"""Fixtures of the research-at-scale tests: the tiny llama saved as a model directory (Ray
replicas load models by name or path) and one local Ray for the whole session, shut down at
its end."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def tiny_dir(tiny_llama_dir):
    """The session's tiny llama (`tests/conftest.py`) as a directory `LLM(model=...)` loads."""
    return str(tiny_llama_dir)


@pytest.fixture(scope="session")
def ray_local():
    """A local Ray of 2 CPUs (no dashboard, no usage stats), shut down after the session; the
    replicas import this worktree's workbench through PYTHONPATH."""
    ray = pytest.importorskip("ray")
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [root, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield ray
    ray.shutdown()
