"""The beam explorer in a real JupyterLab, in headless Chromium (Debian's, driven by Playwright).

JupyterLab starts on a free port with a token in a temporary directory holding a one-cell
notebook that runs a beam search on a tiny random llama (width 2, 3 tokens) and shows it in a
`BeamExplorer`; the test runs the cell, waits for the widget, moves the step slider with the
keyboard and checks the HTML view follows. Never
`playwright install`: `make install` puts chromium at /usr/bin/chromium.
"""

from __future__ import annotations

import json
import os
import re
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

CELL = """from workbench import LLM
from workbench.models import tiny_model
from workbench.widgets import BeamExplorer

llm = LLM(tiny_model("llama", seed=0, dtype="float32"))
BeamExplorer(llm, "Once upon a time", beam_width=2, max_tokens=3)"""


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
    log = open(tmp_path / "lab.log", "w")
    proc = subprocess.Popen(
        [str(jupyter), "lab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
         f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={root}", "--allow-root",
         "--ServerApp.port_retries=0", "--LabApp.news_url=None",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
        env=env, stdout=subprocess.DEVNULL, stderr=log,
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
        log.close()


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
    assert re.fullmatch(r"step 3 of 3: \d+ candidates \(2 kept, \d+ completed, \d+ pruned\)",
                        summary.inner_text())
    assert page.locator(".jp-OutputArea svg[id^='wb-beamtree-']").count() == 1
    last_step_svg = page.locator(".jp-OutputArea svg[id^='wb-beamtree-']").get_attribute("id")

    handle = page.locator(".widget-slider .noUi-handle").first
    handle.focus()
    page.keyboard.press("ArrowLeft")
    page.wait_for_function(
        "() => document.querySelector('.wb-summary').innerText.startsWith('step 2 of 3')")
    assert re.fullmatch(r"step 2 of 3: \d+ candidates \(2 kept, \d+ completed, \d+ pruned\)",
                        summary.inner_text())
    svg = page.locator(".jp-OutputArea svg[id^='wb-beamtree-']")
    assert svg.get_attribute("id") != last_step_svg  # the tree drawn only up to step 2
    options = [o.replace("\xa0", " ") for o in page.locator(".widget-select select option").all_inner_texts()]
    assert options and all(re.match(r"#\d+ rank \d", o) for o in options)
