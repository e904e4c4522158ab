"""The beam explorer in a real JupyterLab, in headless Chromium (Debian's, driven by Playwright).

JupyterLab starts on a free port with a token in a temporary directory holding a one-cell
notebook that shows a `BeamExplorer` over a small `BeamTree`; the test runs the cell, waits for
the widget, moves the step slider with the keyboard and checks the HTML view follows. Never
`playwright install`: `make install` puts chromium at /usr/bin/chromium.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
TOKEN = "workbench-browser-test"

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                 reason=f"{CHROMIUM} is missing (make install adds Debian's chromium)")]

TREE = {"prompt_token_ids": [1, 2], "prompt_text": "Hi", "beam_width": 2, "length_penalty": 1.0,
        "returned": [2, 3], "nodes": [
            {"id": 0, "step": 1, "token_id": 5, "text": " a", "logprob": -0.1, "cum_logprob": -0.1,
             "parent": None, "rank": 1, "status": "kept", "score": -0.05},
            {"id": 1, "step": 1, "token_id": 6, "text": " b", "logprob": -2.0, "cum_logprob": -2.0,
             "parent": None, "rank": 2, "status": "kept", "score": -1.0},
            {"id": 2, "step": 2, "token_id": 7, "text": " c", "logprob": -0.2, "cum_logprob": -0.3,
             "parent": 0, "rank": 1, "status": "completed", "score": -0.1},
            {"id": 3, "step": 2, "token_id": 8, "text": " d", "logprob": -0.5, "cum_logprob": -0.6,
             "parent": 0, "rank": 2, "status": "kept", "score": -0.2},
            {"id": 4, "step": 2, "token_id": 9, "text": " e", "logprob": -0.1, "cum_logprob": -2.1,
             "parent": 1, "rank": 1, "status": "pruned", "score": -0.7}]}

CELL = f"""from workbench.inspect.beam_tree import BeamTree
from workbench.widgets import BeamExplorer

BeamExplorer(tree=BeamTree.from_dict({TREE!r}))"""


def _notebook(path: Path) -> None:
    nb = {"nbformat": 4, "nbformat_minor": 5,
          "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                      "language": "python"}},
          "cells": [{"cell_type": "code", "id": "explorer", "metadata": {}, "outputs": [],
                     "execution_count": None, "source": CELL}]}
    path.write_text(json.dumps(nb))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def lab(tmp_path):
    """A JupyterLab server on the notebook's directory: yields its base URL; killed afterwards."""
    root = tmp_path / "root"
    root.mkdir()
    _notebook(root / "explorer.ipynb")
    port = _free_port()
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
           "JUPYTER_CONFIG_DIR": str(tmp_path / "config"), "PYTHONPATH": os.getcwd()}
    jupyter = Path(sys.executable).with_name("jupyter")
    proc = subprocess.Popen(
        [str(jupyter), "lab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
         f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={root}", "--allow-root",
         "--ServerApp.port_retries=0", "--LabApp.news_url=None",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
        env=env, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "lab.log", "w"),
        start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{url}/api/status?token={TOKEN}", timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("JupyterLab did not start:\n" + (tmp_path / "lab.log").read_text())
                time.sleep(0.5)
        yield url
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # the server and the kernels it started
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


@pytest.fixture
def page(tmp_path):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:  # a persistent context is how playwright takes a fresh user-data-dir
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "chromium"), executable_path=CHROMIUM, headless=True,
            args=CHROMIUM_ARGS, viewport={"width": 1400, "height": 900})
        try:
            page = context.pages[0] if context.pages else context.new_page()
            page.set_default_timeout(120_000)
            yield page
        finally:
            context.close()


def test_step_slider_moves_the_tree_in_jupyterlab(lab, page):
    page.goto(f"{lab}/lab/tree/explorer.ipynb?token={TOKEN}")
    page.locator(".jp-Notebook .jp-Cell").first.click()  # wait for the notebook, select the cell
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']")
    page.keyboard.press("Shift+Enter")

    summary = page.locator(".wb-summary")
    summary.wait_for()
    assert summary.inner_text() == "step 2 of 2: 3 candidates (1 kept, 1 completed, 1 pruned)"
    assert page.locator(".jp-OutputArea svg[id^='wb-beamtree-']").count() == 1

    handle = page.locator(".widget-slider .noUi-handle").first
    handle.focus()
    page.keyboard.press("ArrowLeft")
    page.wait_for_function(
        "() => document.querySelector('.wb-summary').innerText.startsWith('step 1 of 2')")
    assert summary.inner_text() == "step 1 of 2: 2 candidates (2 kept, 0 completed, 0 pruned)"
    options = [o.replace("\xa0", " ") for o in page.locator(".widget-select select option").all_inner_texts()]
    assert len(options) == 2 and options[0].startswith("#0 rank 1")
