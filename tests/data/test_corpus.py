"""scripts/make_corpus.py (`make corpus`) without the archive: the committed slice
(data/corpus-sample.jsonl) has the corpus's schema and its manifest's hash; HTML becomes its
text, R's lazy-load data its novels, long texts documents cut at paragraphs (code: at top-level
statements) under the token cap; duplicates and short texts are left out; the same input gives
the same bytes (under other hash seeds too); a corpus already built is not built again."""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "make_corpus.py"


@pytest.fixture(scope="module")
def corpus():
    """scripts/make_corpus.py as a module (registered while it runs: its dataclass looks it up)."""
    spec = importlib.util.spec_from_file_location("make_corpus", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


@pytest.fixture(scope="module")
def count(corpus):
    return corpus.token_counter()


def words(texts: list[str]) -> list[int]:
    """A counter for the splitting tests: one token a word."""
    return [len(t.split()) for t in texts]


def paragraph(seed: int, n: int) -> str:
    return " ".join(f"w{seed}x{i}" for i in range(n - 1)) + " end."


# --- the committed slice --------------------------------------------------------------------

def test_the_sample_has_the_corpus_schema(corpus, count):
    rows = [json.loads(line) for line in (ROOT / "data" / "corpus-sample.jsonl").open()]
    assert len(rows) == corpus.SAMPLE_DOCS
    assert all(list(r) == ["id", "text", "source", "licence"] for r in rows)
    assert len({r["id"] for r in rows}) == len(rows)
    assert all(isinstance(r["text"], str) and r["text"].strip() for r in rows)
    licences = {s.name: s.licence for s in corpus.SOURCES}
    assert all(r["licence"] == licences[r["source"]] for r in rows)
    assert {s.kind for s in corpus.SOURCES if s.name in {r["source"] for r in rows}} == \
        {"prose", "code"}
    assert all(corpus.MIN_TOKENS <= n <= corpus.MAX_TOKENS for n in count([r["text"] for r in rows]))


def test_the_sample_is_the_one_its_manifest_describes(corpus):
    manifest = json.loads((ROOT / "data" / "corpus-manifest.json").read_text())
    data = (ROOT / "data" / "corpus-sample.jsonl").read_bytes()
    assert manifest["sample"]["sha256"] == hashlib.sha256(data).hexdigest()
    assert manifest["sample"]["documents"] == corpus.SAMPLE_DOCS
    assert manifest["tokens"] >= 2_000_000
    assert 0.15 <= manifest["code_share"] <= 0.30
    for source in manifest["sources"]:
        assert source["licence"] and all(p["version"] for p in source["packages"])


def test_a_capture_job_reads_the_sample_by_its_ids():
    from workbench.jobs.dataset import Source

    path = ROOT / "data" / "corpus-sample.jsonl"
    rows = Source(str(path))
    assert rows.id_column == "id"
    first = json.loads(path.read_text().splitlines()[0])
    assert rows.documents(0, 1)[0].doc_id == first["id"]
    assert rows.documents(0, 1)[0].text == first["text"]


# --- text from HTML and from R's data --------------------------------------------------------

def test_html_is_stripped_to_the_main_elements_text(corpus):
    page = ("<html><head><title>T</title></head><body><div class='nav'>Nav</div>"
            "<div class='body' role='main'><h1>os &mdash; things<a class='headerlink'>¶</a></h1>"
            "<p>Some   <code>text</code>\n here &lt;b&gt;.</p><pre>def f():\n    return 1\n</pre>"
            "<table><tr><th><p>a</p></th><td>b</td></tr></table><script>var x;</script>"
            "<p>one<p>two</div><p>Footer</p></body></html>")
    text = corpus.html_to_text(page, root=lambda tag, a: a.get("role") == "main",
                               skip=lambda tag, a: corpus.has_class(a, "headerlink"))
    assert text == ("os — things\n\nSome text here <b>.\n\ndef f():\n    return 1\n\na | b"
                    "\n\none\n\ntwo")


def _ints(*values: int) -> bytes:
    return struct.pack(f">{len(values)}i", *values)


def _chars(text: str) -> bytes:
    raw = text.encode()
    return _ints(9 | 1 << 15, len(raw)) + raw  # CHARSXP, UTF-8


def _vector(kind: int, items: list[bytes], names: list[str] | None = None,
            first_names: bool = True) -> bytes:
    """An R vector; its names attribute's symbol written out the first time, else by
    reference."""
    body = _ints(kind | (1 << 9 if names else 0), len(items)) + b"".join(items)
    if not names:
        return body
    symbol = _ints(1) + _chars("names") if first_names else _ints(255 | 1 << 8)
    return body + _ints(2 | 1 << 10) + symbol + _vector(16, [_chars(n) for n in names]) + \
        _ints(254)


def _serialized(item: bytes) -> bytes:
    return b"X\n" + _ints(3, 0, 0, 5) + b"UTF-8" + item


def test_the_novels_are_read_from_rs_lazy_load_data(corpus, tmp_path):
    lines = ["EMMA", "", "Emma Woodhouse, _handsome_, clever,", "and rich.", "", "", "CHAPTER I"]
    raw = _serialized(_vector(16, [_chars(line) for line in lines]))
    blob = _ints(len(raw)) + zlib.compress(raw)
    index = _vector(19, [_vector(19, [_ints(13, 2, 0, len(blob))], names=["emma"])],
                    names=["variables"], first_names=False)
    folder = tmp_path / "usr/lib/R/site-library/janeaustenr/data"
    folder.mkdir(parents=True)
    (folder / "Rdata.rdb").write_bytes(blob)
    (folder / "Rdata.rdx").write_bytes(gzip.compress(_serialized(index)))
    assert corpus.r_lazyload(folder, "Rdata") == {"emma": lines}
    assert list(corpus.read_austen(tmp_path)) == [
        ("emma", "EMMA\n\nEmma Woodhouse, handsome, clever, and rich.\n\nCHAPTER I")]


# --- splitting ------------------------------------------------------------------------------

def test_a_long_text_is_cut_at_paragraphs_under_the_cap(corpus):
    paragraphs = [paragraph(i, 10 + 7 * i % 40) for i in range(30)]
    text = "\n\n".join(paragraphs)
    docs = corpus.split_text(text, "prose", words, cap=100)
    assert len(docs) > 1 and all(words([d])[0] <= 100 for d in docs)
    assert "\n\n".join(docs) == text  # whole paragraphs, in order, none lost
    sizes = words(docs)
    assert max(sizes) - min(sizes) <= max(words(paragraphs))  # no short last document


def test_a_paragraph_over_the_cap_is_cut_at_sentences(corpus):
    text = " ".join(paragraph(i, 30) for i in range(8))  # one paragraph, 240 words
    docs = corpus.split_text(text, "prose", words, cap=100)
    assert len(docs) == 3 and all(d.endswith("end.") for d in docs)


def test_code_is_cut_between_top_level_statements(corpus):
    function = "def f{0}():\n    x = {0}\n\n    return x * 2 + 1 - 3\n"
    text = "import os\n\n\n" + "\n\n".join(function.format(i) for i in range(6))
    docs = corpus.split_text(text, "code", words, cap=30)
    assert len(docs) > 1 and all(words([d])[0] <= 30 for d in docs)
    assert all(d.startswith(("import", "def")) and "    return" in d for d in docs)


def test_documents_stay_under_the_cap_in_smollm2_tokens(corpus, count):
    text = "\n\n".join(f"Paragraph {i}: " + "It was a truth universally acknowledged. " * (i % 9 + 1)
                       for i in range(200))
    docs = corpus.split_text(text, "prose", count, cap=128)
    assert all(n <= 128 for n in count(docs)) and len(docs) >= sum(count([text])) // 128


# --- dedup, budget, determinism, the cache ---------------------------------------------------

def toy_source(corpus, name="toy", budget=None):
    return corpus.Source(name, ((name,),), "CC0-1.0", "CC0", "prose", budget, lambda tree: iter(()))


def test_duplicates_and_short_texts_are_left_out(corpus):
    text = paragraph(1, 300)
    texts = [("a", text), ("b", "  " + text.upper().replace(" ", "\n ")), ("c", paragraph(2, 50)),
             ("d", paragraph(3, 300))]
    docs = corpus.source_documents(toy_source(corpus), iter(texts), words, set())
    assert [d["id"] for d in docs] == ["toy/a#0", "toy/d#0"]
    assert [d["tokens"] for d in docs] == [300, 300]


def test_a_budget_keeps_a_seeded_subset(corpus):
    docs = [{"id": str(i), "tokens": 100} for i in range(50)]
    kept = corpus.take_budget(docs, 1000, "0:toy")
    assert len(kept) == 10 and kept == corpus.take_budget(docs, 1000, "0:toy")
    assert kept != corpus.take_budget(docs, 1000, "1:toy")


PIPELINE = """
import hashlib, importlib.util, sys
spec = importlib.util.spec_from_file_location("make_corpus", sys.argv[1])
m = importlib.util.module_from_spec(spec)
sys.modules["make_corpus"] = m
spec.loader.exec_module(m)
count = m.token_counter()
seen, read = set(), []
for name, budget in (("prose", None), ("more", 2000)):
    source = m.Source(name, ((name,),), "CC0-1.0", "CC0", "prose", budget, None)
    texts = [(f"t{i}", "\\n\\n".join(f"Text {i}, paragraph {j}: " + "a word and another. " * (j % 7 + 3)
                                    for j in range(40 + i))) for i in range(6)]
    read.append((source, m.source_documents(source, iter(texts), count, seen)))
print(hashlib.sha256(m.jsonl(m.assemble(read))).hexdigest())
"""


def test_the_same_input_gives_the_same_bytes():
    """Two processes under different hash seeds: no set's or dict's order leaks into the file."""
    digests = {subprocess.run([sys.executable, "-c", PIPELINE, str(SCRIPT)], check=True,
                              capture_output=True, text=True,
                              env={**os.environ, "PYTHONHASHSEED": seed}).stdout
               for seed in ("1", "2")}
    assert len(digests) == 1


def test_a_built_corpus_is_not_built_again(corpus, tmp_path, monkeypatch, capsys):
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "corpus.jsonl").write_text('{"id": "x", "text": "y", "source": "toy"}\n')
    (folder / "manifest.json").write_text(json.dumps({"documents": 1, "tokens": 1,
                                                      "code_share": 0.0}))
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))
    monkeypatch.setattr(sys, "argv", ["make_corpus.py"])
    monkeypatch.setattr(corpus, "build", lambda folder: pytest.fail("rebuilt"))
    corpus.main()
    assert f"the corpus is there: {folder / 'corpus.jsonl'}" in capsys.readouterr().out
