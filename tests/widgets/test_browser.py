"""The beam explorer in a real JupyterLab, in headless Chromium (Debian's, driven by Playwright).

JupyterLab starts on a free port with a token in a temporary directory holding a one-cell
notebook that runs a beam search on a tiny random llama (width 2, 3 tokens) and shows it in a
`BeamExplorer`; the test runs the cell, waits for the widget, moves the step slider with the
keyboard and checks the HTML view follows. Never
`playwright install`: `make install` puts chromium at /usr/bin/chromium.
"""

from __future__ import annotations

import contextlib
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


def _notebook(path: Path, cells: list[str] | None = None, outputs: dict | None = None) -> None:
    """A notebook of code `cells`; `outputs`: stored outputs of cell i (an unsigned notebook,
    so JupyterLab opens them untrusted)."""
    cells = [CELL] if cells is None else cells
    nb = {"nbformat": 4, "nbformat_minor": 5,
          "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                      "language": "python"}},
          "cells": [{"cell_type": "code", "id": f"cell{i}", "metadata": {},
                     "outputs": (outputs or {}).get(i, []), "execution_count": None,
                     "source": source} for i, source in enumerate(cells)]}
    path.write_text(json.dumps(nb))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


THEMES = {"light": "JupyterLab Light", "dark": "JupyterLab Dark"}


@contextlib.contextmanager
def _jupyterlab(tmp_path: Path, theme: str = "light"):
    """A JupyterLab server on `tmp_path/root` in `theme`: yields its base URL; killed afterwards."""
    root = tmp_path / "root"
    root.mkdir(exist_ok=True)
    settings = tmp_path / "config" / "lab" / "user-settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True, exist_ok=True)
    (settings / "themes.jupyterlab-settings").write_text(json.dumps({"theme": THEMES[theme]}))
    # no "get notified about official Jupyter news?" toast over the screenshots
    (settings / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    notebook = settings.parent / "notebook-extension"  # every cell in the DOM, not only those in view
    notebook.mkdir(exist_ok=True)
    (notebook / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
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
def lab(tmp_path):
    """JupyterLab (light theme) on a directory holding the one-cell explorer notebook."""
    (tmp_path / "root").mkdir()
    _notebook(tmp_path / "root" / "explorer.ipynb")
    with _jupyterlab(tmp_path) as url:
        yield url


@pytest.fixture
def page(tmp_path):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:  # a persistent context is how playwright takes a fresh user-data-dir
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "chromium"), executable_path=CHROMIUM, headless=True,
            args=CHROMIUM_ARGS, viewport={"width": 1400, "height": 900})
        try:
            page = context.pages[0] if context.pages else context.new_page()
            # the kernel's work can take twice as long beside `make test`'s other process
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


# -- the inspect views in both themes, the explorer's busy state, an untrusted notebook ---------

SCREENSHOTS = Path(__file__).parent / "screenshots"

VIEWS = [
    """import time
from workbench import LLM, BeamSearchParams, SamplingParams
from workbench.inspect import LogprobTable, ParsedOutput
from workbench.inspect.similarity import SimilarityMatrix
from workbench.models import tiny_model
from workbench.widgets import BeamExplorer, LogprobViewer

llm = LLM(tiny_model("llama", seed=0, dtype="float32"))
out = llm.generate("Once upon a time", SamplingParams(max_tokens=6, temperature=0, logprobs=3,
                                                      prompt_logprobs=1))[0]
table = LogprobTable.from_request_output(out, tokenizer=llm.get_tokenizer())
table""",
    'llm.beam_search(["Once upon a time"], BeamSearchParams(beam_width=3, max_tokens=6))[0].tree',
    """ParsedOutput.from_tokens(["<think>", "Need", " weather", "</think>", "Sure", "."],
                         reasoning_parser="qwen3")""",
    """SimilarityMatrix(["A cat sits on the mat.", "Stocks fell sharply today."],
                 ["A kitten rests on a rug, in a sentence long enough to be cut", "The market dropped."],
                 [[0.8, 0.1], [0.05, 0.7]])""",
    "LogprobViewer(table, position=1)",
    "out",
    """def slow_search(prompt, width, length_penalty, max_tokens):
    time.sleep(3)  # long enough to see the busy state
    return llm.beam_search([prompt], BeamSearchParams(beam_width=width, max_tokens=max_tokens,
                                                      length_penalty=length_penalty))[0].tree

first = llm.beam_search(["Once upon a time"], BeamSearchParams(beam_width=2, max_tokens=3))[0].tree
explorer = BeamExplorer(tree=first, search=slow_search)
explorer""",
]

# WCAG contrast of every visible text in the output areas against the colour behind it (alpha
# blended), SVG text against its drawing; drawings that stick out of their output area.
AUDIT_JS = """() => {
  const parse = c => { const m = c && c.match(/rgba?\\(([^)]+)\\)/); if (!m) return null;
    const p = m[1].split(',').map(Number); return {r: p[0], g: p[1], b: p[2], a: p.length > 3 ? p[3] : 1}; };
  const blend = (fg, bg) => ({r: fg.r * fg.a + bg.r * (1 - fg.a), g: fg.g * fg.a + bg.g * (1 - fg.a),
                              b: fg.b * fg.a + bg.b * (1 - fg.a), a: 1});
  const lum = c => { const f = v => { v /= 255; return v <= 0.04045 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
    return 0.2126 * f(c.r) + 0.7152 * f(c.g) + 0.0722 * f(c.b); };
  const ratio = (a, b) => { const [x, y] = [lum(a), lum(b)].sort((p, q) => q - p); return (x + 0.05) / (y + 0.05); };
  const behind = el => { const layers = [];
    for (let e = el; e; e = e.parentElement) { const c = parse(getComputedStyle(e).backgroundColor);
      if (c && c.a > 0) { layers.push(c); if (c.a >= 1) break; } }
    let bg = {r: 255, g: 255, b: 255, a: 1};
    for (const c of layers.reverse()) bg = blend(c, bg);
    return bg; };
  const visible = el => { const r = el.getBoundingClientRect(); return r.width > 0 && r.height > 0 &&
    getComputedStyle(el).visibility !== 'hidden'; };
  const low = [], overflow = []; let checked = 0;
  for (const area of document.querySelectorAll('.jp-OutputArea-output')) {
    const walker = document.createTreeWalker(area, NodeFilter.SHOW_TEXT);
    while (walker.nextNode()) {
      const node = walker.currentNode, el = node.parentElement;
      if (!node.textContent.trim() || el.closest('svg, style, select') || !visible(el)) continue;
      const bg = behind(el), fg = blend(parse(getComputedStyle(el).color), bg);
      const r = ratio(fg, bg); checked++;
      if (r < 4.5) low.push([node.textContent.trim().slice(0, 24), getComputedStyle(el).color, r.toFixed(2)]);
    }
    for (const text of area.querySelectorAll('svg text')) {
      if (!visible(text)) continue;
      const r = ratio(parse(getComputedStyle(text).fill), behind(text.closest('svg'))); checked++;
      if (r < 4.5) low.push([text.textContent.slice(0, 24), getComputedStyle(text).fill, r.toFixed(2)]);
    }
    const box = area.getBoundingClientRect();
    for (const el of area.querySelectorAll('.wb-drawing, svg, img, table')) {
      if (!visible(el) || el.closest('.wb-drawing') && el !== el.closest('.wb-drawing')) continue;
      const r = el.getBoundingClientRect();
      if (r.right > box.right + 1) overflow.push([el.tagName, el.className.baseVal ?? el.className, r.right, box.right]);
    }
  }
  return {checked, low, overflow};
}"""


def _run_all(page, cells: int) -> None:
    page.locator(".jp-Notebook .jp-Cell").first.click()
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']")
    for _ in range(cells):
        page.keyboard.press("Shift+Enter")
    page.wait_for_function(f"() => document.querySelectorAll('.jp-Cell .jp-InputPrompt').length >= {cells} && "
                           "[...document.querySelectorAll('.jp-InputPrompt')].slice(0, "
                           f"{cells}).every(p => /\\[\\d+\\]/.test(p.innerText))", timeout=240_000)


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_views_fit_explain_themselves_and_read_in_both_themes(tmp_path, page, theme):
    (tmp_path / "root").mkdir()
    _notebook(tmp_path / "root" / "views.ipynb", VIEWS)
    with _jupyterlab(tmp_path, theme) as url:
        page.goto(f"{url}/lab/tree/views.ipynb?token={TOKEN}")
        _run_all(page, len(VIEWS))
        page.locator(".wb-summary").first.wait_for()
        body = page.evaluate("getComputedStyle(document.body).getPropertyValue('--jp-layout-color0')")
        assert (body.strip().lower() in ("#111", "#111111")) == (theme == "dark")
        legends = page.locator(".jp-OutputArea-output .wb-legend")
        assert legends.count() >= 6  # table, tree, parsed, similarity, viewer, explorer's tree
        assert page.locator(".jp-OutputArea-output svg g.wb-legend").count() >= 2
        audit = page.evaluate(AUDIT_JS)
        SCREENSHOTS.mkdir(exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / f"views-{theme}.png"), full_page=True)
        for i, area in enumerate(page.locator(".jp-Cell-outputArea").all()):
            if area.is_visible():
                area.screenshot(path=str(SCREENSHOTS / f"views-{theme}-cell{i}.png"))
        assert audit["checked"] > 50
        assert audit["low"] == [], audit["low"]
        assert audit["overflow"] == [], audit["overflow"]

        # the explorer: Search shows its busy state, then the new tree
        explorer_width = page.locator(".widget-text input[type='number']").first  # beam width
        explorer_width.fill("3")
        explorer_width.press("Enter")
        page.get_by_role("button", name="Search").click()
        busy = page.locator(".wb-busy")
        busy.wait_for()
        assert page.locator("button:has-text('Searching…')").is_disabled()
        assert page.locator(".wb-dimmed").count() == 1  # the old tree stays, dimmed
        page.screenshot(path=str(SCREENSHOTS / f"explorer-busy-{theme}.png"))
        page.wait_for_function("() => !document.querySelector('.wb-busy') && [...document."
                               "querySelectorAll('.wb-summary')].pop().innerText.includes('(3 kept')",
                               timeout=120_000)
        assert page.get_by_role("button", name="Search").is_enabled()
        summary = page.locator(".wb-summary").last.inner_text()
        assert re.fullmatch(r"step 3 of 3: \d+ candidates \(3 kept, \d+ completed, \d+ pruned\)",
                            summary), summary


def test_an_untrusted_notebook_shows_the_trees_picture(tmp_path, page):
    from workbench.inspect.beam_tree import BeamNode, BeamTree

    tree = BeamTree([1], beam_width=2, length_penalty=1.0, prompt_text="Hi", nodes=[
        BeamNode(0, 1, 5, " a", -0.1, -0.1, None, 1, "kept", -0.05),
        BeamNode(1, 1, 6, " b", -2.0, -2.0, None, 2, "pruned", -1.0),
        BeamNode(2, 2, 7, " c", -0.2, -0.3, 0, 1, "completed", -0.15)], returned=[2])
    stored = {0: [{"output_type": "execute_result", "execution_count": 1, "metadata": {},
                   "data": {"text/html": tree._repr_html_(), "text/plain": repr(tree)}}]}
    (tmp_path / "root").mkdir()
    _notebook(tmp_path / "root" / "stored.ipynb", ["tree"], stored)  # unsigned: untrusted
    with _jupyterlab(tmp_path) as url:
        page.goto(f"{url}/lab/tree/stored.ipynb?token={TOKEN}")
        picture = page.locator(".jp-OutputArea-output img[src^='data:image/svg+xml']")
        picture.wait_for()
        assert picture.evaluate("img => img.complete && img.naturalWidth > 0")
        assert picture.is_visible()
        assert page.locator(".jp-OutputArea-output svg").count() == 0  # stripped, not shown as text
        assert "step 1, rank 1" not in page.locator(".jp-OutputArea-output").inner_text()
        SCREENSHOTS.mkdir(exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / "untrusted-tree.png"))


REPO_NOTEBOOKS = Path(__file__).parents[2] / "notebooks"


@pytest.mark.parametrize(("name", "theme"), [("04_beam_search_explorer", "light"),
                                             ("04_beam_search_explorer", "dark"),
                                             ("05_logprobs", "dark"),
                                             ("21_branches", "dark")])
def test_repository_notebooks_run_and_read_in_jupyterlab(tmp_path, page, name, theme):
    """A notebook of `notebooks/` run cell by cell in JupyterLab, then audited as above."""
    (tmp_path / "root").mkdir()
    source = json.loads((REPO_NOTEBOOKS / f"{name}.ipynb").read_text())
    for cell in source["cells"]:
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
    (tmp_path / "root" / f"{name}.ipynb").write_text(json.dumps(source))
    with _jupyterlab(tmp_path, theme) as url:
        page.goto(f"{url}/lab/tree/{name}.ipynb?token={TOKEN}")
        code_cells = sum(c["cell_type"] == "code" for c in source["cells"])
        page.locator(".jp-Notebook .jp-Cell").first.click()
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']")
        for _ in source["cells"]:
            page.keyboard.press("Shift+Enter")
        page.wait_for_function(
            "n => [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')]"
            ".filter(p => /\\[\\d+\\]/.test(p.innerText)).length >= n", arg=code_cells,
            timeout=480_000)
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']")
        assert page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']"
                            ":has-text('Traceback')").count() == 0
        assert page.locator(".jp-OutputArea-output .wb-legend").count() >= 2
        audit = page.evaluate(AUDIT_JS)
        SCREENSHOTS.mkdir(exist_ok=True)
        for i, area in enumerate(page.locator(".jp-Cell-outputArea").all()):
            if area.is_visible() and area.inner_html().strip():
                area.screenshot(path=str(SCREENSHOTS / f"{name}-{theme}-cell{i}.png"))
        assert audit["low"] == [], audit["low"]
        assert audit["overflow"] == [], audit["overflow"]


# -- a wide search: width 16 x 64 tokens ---------------------------------------------------------

WIDE = """from workbench import LLM
from workbench.models import tiny_model
from workbench.widgets import BeamExplorer

llm = LLM(tiny_model("llama", seed=0, dtype="float32"))
BeamExplorer(llm, "Once upon a time", beam_width=16, max_tokens=64)"""

# every edge of the drawing sampled every 2 px against every label's box (its column's)
CROSSINGS_JS = """svg => {
  const columns = new Map();
  for (const t of svg.querySelectorAll('text.wb-label')) {
    const b = t.getBBox(), x = Number(t.getAttribute('x'));
    if (!columns.has(x)) columns.set(x, []);
    columns.get(x).push([b.x + 0.5, b.x + b.width - 0.5, b.y + 0.5, b.y + b.height - 0.5, t.textContent]);
  }
  const starts = [...columns.keys()].sort((a, b) => a - b), crossings = [];
  let edges = 0;
  for (const path of svg.querySelectorAll('path.wb-edge')) {
    edges++;
    const length = path.getTotalLength();
    for (let d = 0; d <= length; d += 2) {
      const p = path.getPointAtLength(d);
      let column = null;
      for (const x of starts) { if (x <= p.x) column = x; else break; }
      for (const [x0, x1, y0, y1, text] of columns.get(column) || [])
        if (x0 < p.x && p.x < x1 && y0 < p.y && p.y < y1) crossings.push([text, p.x, p.y]);
    }
  }
  return {edges, labels: svg.querySelectorAll('text.wb-label').length, crossings: crossings.slice(0, 5)};
}"""

BOXES_JS = """el => {
  const box = el.querySelector('.wb-drawing'), area = el.closest('.jp-OutputArea-output');
  const r = box.getBoundingClientRect(), a = area.getBoundingClientRect();
  const s = box.querySelector('.wb-selected').getBoundingClientRect();
  return {scrollWidth: box.scrollWidth, clientWidth: box.clientWidth, boxRight: r.right,
          areaRight: a.right, widgetScrolls: el.scrollWidth > el.clientWidth + 1,
          selectedInView: s.left >= r.left && s.right <= r.right && s.top >= r.top && s.bottom <= r.bottom};
}"""


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_a_wide_search_scrolls_in_its_own_box_and_no_edge_crosses_a_label(tmp_path, page, theme):
    """Width 16 x 64 tokens: the drawing scrolls in its own box inside the output (the controls
    stay), the returned path's last node is in view, no edge crosses a label, a click on a node
    selects it, and every text reads in the theme."""
    (tmp_path / "root").mkdir()
    _notebook(tmp_path / "root" / "wide.ipynb", [WIDE])
    with _jupyterlab(tmp_path, theme) as url:
        page.goto(f"{url}/lab/tree/wide.ipynb?token={TOKEN}")
        _run_all(page, 1)
        explorer = page.locator(".wb-explorer")
        page.wait_for_function("() => document.querySelector('.wb-summary') && "
                               "document.querySelector('.wb-summary').innerText.startsWith("
                               "'step 64 of 64: 512 candidates (16 kept')", timeout=240_000)
        page.wait_for_timeout(500)  # the box's own script brings the selection into view
        boxes = explorer.evaluate(BOXES_JS)
        assert boxes["scrollWidth"] > boxes["clientWidth"], boxes  # it scrolls on its own
        assert boxes["boxRight"] <= boxes["areaRight"] + 1, boxes
        assert not boxes["widgetScrolls"], boxes  # so the controls stay put
        assert boxes["selectedInView"], boxes  # the best sequence's last node
        assert page.locator(".wb-node").inner_text().startswith("node #")
        options = page.locator(".widget-select select option").count()
        assert 16 <= options <= 32  # kept and returned, not all 512
        svg = explorer.locator(".wb-drawing svg")
        crossings = svg.evaluate(CROSSINGS_JS)
        assert crossings["edges"] > 64 * 16 and crossings["crossings"] == [], crossings
        SCREENSHOTS.mkdir(exist_ok=True)
        explorer.evaluate("el => el.scrollIntoView()")
        page.screenshot(path=str(SCREENSHOTS / f"explorer-wide-{theme}.png"))
        audit = page.evaluate(AUDIT_JS)
        assert audit["low"] == [], audit["low"]
        assert audit["overflow"] == [], audit["overflow"]

        # a click on a visible node of another beam selects it (the list follows)
        target = explorer.evaluate("""el => {
          const box = el.querySelector('.wb-drawing').getBoundingClientRect();
          const g = [...el.querySelectorAll('.wb-drawing g.wb-candidate')].find(g => {
            const r = g.getBoundingClientRect();
            return !g.querySelector('.wb-selected') && r.left > box.left && r.right < box.right
                   && r.top > box.top && r.bottom < box.bottom; });
          return g.getAttribute('data-pick'); }""")
        explorer.locator(f".wb-drawing g[data-pick='{target}']").click()
        page.wait_for_function(
            "id => (document.querySelector('.wb-node') || {}).innerText?.startsWith(`node #${id}:`)",
            arg=target)
        assert page.locator(".widget-select select").input_value().startswith(f"#{target} ")
        box_after = explorer.evaluate(BOXES_JS)
        assert box_after["selectedInView"], box_after  # the scroll stayed where the click was
        page.screenshot(path=str(SCREENSHOTS / f"explorer-wide-clicked-{theme}.png"))


@pytest.mark.parametrize("name", ["04_beam_search_explorer", "06_validation_and_errors"])
def test_a_repository_notebook_is_not_modified_by_opening_it(tmp_path, page, name):
    """Opened as saved (its kernel started, its widget state restored), the tab stays clean."""
    import shutil

    (tmp_path / "root").mkdir()
    shutil.copy(REPO_NOTEBOOKS / f"{name}.ipynb", tmp_path / "root")
    with _jupyterlab(tmp_path) as url:
        page.goto(f"{url}/lab/tree/{name}.ipynb?token={TOKEN}")
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']")
        page.wait_for_timeout(3000)  # what JupyterLab rewrites on opening, it has by now
        tab = page.locator(f"li.lm-TabBar-tab:has-text('{name}.ipynb')")
        assert "jp-mod-dirty" not in (tab.get_attribute("class") or "")


TOKEN_CELL = """from workbench import LLM, SamplingParams
from workbench.models import tiny_model
from workbench.widgets import TokenExplorer

llm = LLM(tiny_model("llama", seed=0, dtype="float32"))
out = llm.generate("Once upon a time there was a", SamplingParams(max_tokens=6, temperature=0,
                                                                  logprobs=3))[0]
TokenExplorer(llm, out)"""


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_the_token_explorer_clicks_a_token_then_branches_in_jupyterlab(tmp_path, page, theme):
    """A click on a token selects its position (the hidden `.wb-pick` box), picking an
    alternative runs its branch; the texts read in both themes."""
    (tmp_path / "root").mkdir()
    _notebook(tmp_path / "root" / "tokens.ipynb", [TOKEN_CELL])
    with _jupyterlab(tmp_path, theme) as url:
        page.goto(f"{url}/lab/tree/tokens.ipynb?token={TOKEN}")
        _run_all(page, 1)
        explorer = page.locator(".wb-token-explorer")
        explorer.wait_for()
        assert "position 0:" in explorer.locator(".wb-summary").last.inner_text()
        explorer.locator(".wb-branch-tree [data-pick='2']").click()
        page.wait_for_function("() => [...document.querySelectorAll('.wb-summary')].pop()"
                               ".innerText.startsWith('position 2:')")
        explorer.locator(".widget-select select").select_option(index=0)
        page.wait_for_function("() => (document.querySelector('.wb-branch') || {})"
                               ".innerText?.startsWith('branch at 2:')", timeout=120_000)
        assert page.get_by_role("button", name="Branch").is_enabled()
        assert explorer.locator(".wb-branch-tree").inner_text().count("branch 0") == 2  # grid, table
        audit = page.evaluate(AUDIT_JS)
        SCREENSHOTS.mkdir(exist_ok=True)
        explorer.screenshot(path=str(SCREENSHOTS / f"token-explorer-{theme}.png"))
        assert audit["low"] == [], audit["low"]
        assert audit["overflow"] == [], audit["overflow"]


FEATURE_CELL = """import tempfile
import torch
from workbench import LLM
from workbench.features.sae import save_sae
from workbench.jobs.dashboards import DashboardJob
from workbench.models import tiny_model
from workbench.widgets import FeatureExplorer

g = torch.Generator().manual_seed(1)
sae = save_sae(tempfile.mkdtemp(), {
    "W_enc": torch.randn(64, 32, generator=g) / 8, "b_enc": torch.full((32,), -0.2),
    "W_dec": torch.randn(32, 64, generator=g) / 2, "b_dec": torch.zeros(64)},
    "blocks.1.hook_resid_post")
llm = LLM(tiny_model("llama", seed=0, dtype="float32"), batch_invariant=True, saes={"s": sae})
dash = tempfile.mkdtemp()
docs = [f"Document {i}: " + "alpha beta gamma delta " * (i + 2) for i in range(6)]
DashboardJob("tiny", docs, sae, dash, llm=llm, progress=False).run()
FeatureExplorer(llm, "s", dash, max_tokens=6)"""


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_the_feature_explorer_reads_a_text_and_steers_in_jupyterlab(tmp_path, page, theme):
    """Show a feature's dashboard, read a typed text (its active features listed, the text
    coloured), steer a prompt (steered beside default); every text readable in both themes."""
    (tmp_path / "root").mkdir()
    _notebook(tmp_path / "root" / "features.ipynb", [FEATURE_CELL])
    with _jupyterlab(tmp_path, theme) as url:
        page.goto(f"{url}/lab/tree/features.ipynb?token={TOKEN}")
        _run_all(page, 1)
        explorer = page.locator(".wb-feature-explorer")
        explorer.wait_for()
        assert "feature 0" in explorer.locator(".wb-dash").inner_text()
        explorer.locator("textarea").fill("The quick brown fox jumps over the lazy dog")
        page.get_by_role("button", name="Read").click()
        explorer.locator(".wb-features").wait_for()
        assert explorer.locator(".widget-select select option").count() > 0
        explorer.locator("input[placeholder='a prompt to steer']").fill("Once upon a time")
        page.get_by_role("button", name="Steer").click()
        explorer.locator(".wb-steer").wait_for()
        assert "default" in explorer.locator(".wb-steer").inner_text()
        audit = page.evaluate(AUDIT_JS)
        SCREENSHOTS.mkdir(exist_ok=True)
        explorer.screenshot(path=str(SCREENSHOTS / f"feature-explorer-{theme}.png"))
        assert audit["low"] == [], audit["low"]
        assert audit["overflow"] == [], audit["overflow"]
