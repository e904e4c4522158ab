"""Builds the training corpus: real English prose and Python code from Debian's archive, in
documents of at most 1,024 SmolLM2 tokens, for training sparse autoencoders and computing
feature dashboards (docs/features-from-data.md, "The corpus").

`python scripts/make_corpus.py` (`make corpus`) downloads each source's Debian package with
`apt-get download` (into `$WORKBENCH_CACHE/corpus/debs/`, default `~/.cache/workbench`;
nothing is installed), extracts it with `dpkg-deb -x`, turns its files into text (HTML stripped
with the standard library's parser, the novels read from the R package's data), splits each
text at paragraph boundaries (code: at top-level statements) into documents under the token
cap, drops duplicates, keeps each source within its share, shuffles with a fixed seed and
writes `corpus.jsonl` (one `{"id", "text", "source", "licence"}` object a line: the rows a
capture job reads, `workbench/jobs/dataset.py`) and `manifest.json` (the packages, their
versions and licences, document and token counts, the file's sha256) beside it. The same
package versions give the same bytes. With `corpus.jsonl` already there it does nothing but
say where it is (`--force` rebuilds). `--sample` also writes `data/corpus-sample.jsonl`: the
shuffled corpus's first 200 documents, for the tests, with its own entry in the manifest, and
a copy of the manifest beside it (`data/corpus-manifest.json`).
"""

from __future__ import annotations

import argparse
import functools
import gzip
import hashlib
import json
import math
import os
import random
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_PATH = ROOT / "data" / "corpus-sample.jsonl"
SAMPLE_MANIFEST_PATH = ROOT / "data" / "corpus-manifest.json"  # the manifest, beside the sample
TOKENIZER = ROOT / "workbench" / "models" / "tokenizers" / "smollm2" / "tokenizer.json"
MAX_TOKENS = 1024  # a document's cap: capture jobs stay fast (SmolLM2's context is 8,192)
MIN_TOKENS = 128  # a text shorter than this (an index page, a three-line module) is left out
SEED = 0
SAMPLE_DOCS = 200


# --- Text from HTML -------------------------------------------------------------------------

BLOCK_TAGS = frozenset({
    "address", "article", "aside", "blockquote", "br", "caption", "dd", "div", "dl", "dt",
    "figcaption", "figure", "footer", "h1", "h2", "h3", "h4", "h5", "h6", "header", "hr", "li",
    "ol", "p", "pre", "section", "table", "tbody", "thead", "tr", "ul"})
VOID_TAGS = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link",
                       "meta", "source", "track", "wbr"})
SKIPPED_TAGS = frozenset({"head", "script", "style", "template"})


class _HTMLText(HTMLParser):
    """The text of an HTML page inside the first element `root` matches (the whole page when
    None), less the elements `skip` matches: one paragraph per block element (per row in a
    table, its cells joined by " | "), whitespace collapsed except inside `<pre>`."""

    def __init__(self, root: Callable[[str, dict], bool] | None,
                 skip: Callable[[str, dict], bool]):
        super().__init__(convert_charrefs=True)
        self.root, self.skip = root, skip
        self.stack: list[tuple[str, str]] = []  # open tags and what each is: root, skip or ""
        self.found_root = root is None
        self.blocks: list[str] = []
        self.current: list[str] = []

    def _inside(self) -> bool:
        if not self.found_root:
            return False
        if self.root is not None and not any(role == "root" for _, role in self.stack):
            return False
        return not any(role == "skip" for _, role in self.stack)

    def _pre(self) -> bool:
        return any(tag == "pre" for tag, _ in self.stack)

    def _flush(self) -> None:
        text = "".join(self.current)
        self.current = []
        text = text.strip("\n").rstrip() if self._pre() else " ".join(text.split())
        if text.strip():
            self.blocks.append(text)

    def _breaks(self, tag: str) -> bool:
        """Whether `tag` starts or ends a paragraph here: a table row is one paragraph."""
        return self._inside() and (tag == "tr" or tag in BLOCK_TAGS and
                                   not any(t == "tr" for t, _ in self.stack))

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {k: v or "" for k, v in attrs}
        if self._breaks(tag):
            self._flush()
        elif tag in ("td", "th") and self._inside() and "".join(self.current).strip():
            self.current.append(" | ")
        if tag in VOID_TAGS:
            return
        role = ""
        if tag in SKIPPED_TAGS or self.skip(tag, values):
            role = "skip"
        elif self.root is not None and not self.found_root and self.root(tag, values):
            role, self.found_root = "root", True
        self.stack.append((tag, role))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self._breaks(tag):
            self._flush()

    def handle_endtag(self, tag: str) -> None:
        if not any(open_tag == tag for open_tag, _ in self.stack):
            return  # a stray end tag
        if self._breaks(tag):
            self._flush()
        while self.stack.pop()[0] != tag:
            pass  # elements left open inside this one end with it

    def handle_data(self, data: str) -> None:
        if self._inside():
            self.current.append(data)

    def text(self) -> str:
        self._flush()
        return "\n\n".join(self.blocks)


def html_to_text(html: str, root: Callable[[str, dict], bool] | None = None,
                 skip: Callable[[str, dict], bool] = lambda tag, attrs: False) -> str:
    """The text of `html` (see `_HTMLText`): paragraphs separated by blank lines.

    >>> html_to_text("<p>One <b>two</b></p><script>x()</script><pre>a\\n  b</pre>")
    'One two\\n\\na\\n  b'
    """
    parser = _HTMLText(root, skip)
    parser.feed(html)
    parser.close()
    return parser.text()


def has_class(attrs: dict, *names: str) -> bool:
    return bool(set(attrs.get("class", "").split()) & set(names))


# --- R's serialized data (the novels of r-cran-janeaustenr) ---------------------------------

class _RReader:
    """Reads R's XDR serialization (versions 2 and 3) as far as a package of character vectors
    needs: vectors, lists, pairlists, symbols and strings; names become dicts' keys."""

    NIL, REF, SYMBOL, PAIRLIST, CHARS = 254, 255, 1, 2, 9
    SPECIAL = frozenset({241, 242, 250, 251, 252, 253})  # environments and markers: no value
    INTEGERS, LOGICALS, DOUBLES, STRINGS, LIST, EXPRESSIONS = 13, 10, 14, 16, 19, 20

    def __init__(self, data: bytes):
        if data[:2] != b"X\n":
            raise ValueError("not R's XDR serialization")
        self.data, self.pos, self.refs = data, 2, []
        version = self._int()
        self.pos += 8  # the writer's R version, the oldest that reads it
        if version == 3:
            self.pos += 4 + self._int()  # the native encoding's name

    def _int(self) -> int:
        (value,) = struct.unpack_from(">i", self.data, self.pos)
        self.pos += 4
        return value

    def _length(self) -> int:
        n = self._int()
        return n if n != -1 else (self._int() << 32) + self._int()

    def read(self):
        flags = self._int()
        kind, has_attributes, has_tag = flags & 0xFF, flags & (1 << 9), flags & (1 << 10)
        if kind == self.NIL or kind in self.SPECIAL:
            return None
        if kind == self.REF:
            return self.refs[(flags >> 8 or self._int()) - 1]
        if kind == self.SYMBOL:
            self.refs.append(self.read())
            return self.refs[-1]
        if kind == self.PAIRLIST:
            if has_attributes:
                self.read()  # a pairlist's own attributes: not needed here
            tag = self.read() if has_tag else None
            head, tail = self.read(), self.read()
            return {tag: head, **(tail or {})}
        if kind == self.CHARS:
            n = self._int()
            if n == -1:
                return None  # NA
            raw = self.data[self.pos:self.pos + n]
            self.pos += n
            return raw.decode("latin-1" if flags & (1 << 14) else "utf-8")
        n = self._length()
        if kind in (self.INTEGERS, self.LOGICALS):
            value = list(struct.unpack_from(f">{n}i", self.data, self.pos))
            self.pos += 4 * n
        elif kind == self.DOUBLES:
            value = list(struct.unpack_from(f">{n}d", self.data, self.pos))
            self.pos += 8 * n
        elif kind in (self.STRINGS, self.LIST, self.EXPRESSIONS):
            value = [self.read() for _ in range(n)]
        else:
            raise ValueError(f"R type {kind} is not read here")
        names = (self.read() or {}).get("names") if has_attributes else None
        return dict(zip(names, value)) if names else value


def r_lazyload(folder: Path, stem: str) -> dict[str, object]:
    """Every object of R's lazy-load database `folder/stem.rdb` (its index: `stem.rdx`)."""
    index = _RReader(gzip.decompress((folder / f"{stem}.rdx").read_bytes())).read()
    blob = (folder / f"{stem}.rdb").read_bytes()
    objects = {}
    for name, (offset, length) in index["variables"].items():
        chunk = blob[offset:offset + length]
        objects[name] = _RReader(zlib.decompress(chunk[4:])).read()  # 4 bytes: the raw size
    return objects


def lines_to_paragraphs(lines: list[str]) -> str:
    """A Project Gutenberg text's wrapped lines as paragraphs (blank lines between), its
    underscores for italics dropped."""
    paragraphs, current = [], []
    for line in [*lines, ""]:
        if line.strip():
            current.append(line.strip().replace("_", ""))
        elif current:
            paragraphs.append(" ".join(current))
            current = []
    return "\n\n".join(paragraphs)


# --- The sources ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Source:
    """One source of documents: the Debian packages it is read from (the first of `candidates`
    that the archive has: the same texts under another Python's version), its licence (and a
    phrase its copyright file must hold), whether it is prose or code, and at most how many
    tokens of it the corpus keeps (None: all)."""

    name: str
    candidates: tuple[tuple[str, ...], ...]
    licence: str
    licence_phrase: str
    kind: str
    budget: int | None
    read: Callable[[Path], Iterator[tuple[str, str]]]  # extracted tree -> (name, text)


def read_austen(tree: Path) -> Iterator[tuple[str, str]]:
    """The six novels (`emma`, `prideprejudice`, ...: R's character vectors, a line each)."""
    novels = r_lazyload(tree / "usr/lib/R/site-library/janeaustenr/data", "Rdata")
    for name in sorted(novels):
        yield name, lines_to_paragraphs(novels[name])


PYTHON_DOC_FOLDERS = ("tutorial", "howto", "library", "reference", "faq", "using", "extending",
                      "installing", "distributing", "whatsnew")


def read_python_docs(tree: Path) -> Iterator[tuple[str, str]]:
    """The manual's pages (not the C API's, the indexes, the changelog or the licences)."""
    html = next(tree.glob("usr/share/doc/python3.*/html"))
    pages = [p for folder in PYTHON_DOC_FOLDERS for p in (html / folder).rglob("*.html")
             if p.name != "changelog.html"] + [html / "glossary.html"]
    for page in sorted(pages):
        text = html_to_text(page.read_text(encoding="utf-8"),
                            root=lambda tag, a: tag == "div" and a.get("role") == "main",
                            skip=lambda tag, a: has_class(a, "headerlink"))
        yield str(page.relative_to(html)), text


def read_debian_handbook(tree: Path) -> Iterator[tuple[str, str]]:
    """The English edition's chapters and sections, less the navigation."""
    html = next(tree.glob("usr/share/doc/debian-handbook/html/en-US"))
    for page in sorted(p for p in html.glob("*.html") if p.name != "index.html"):
        text = html_to_text(page.read_text(encoding="utf-8"), root=lambda tag, a: tag == "body",
                            skip=lambda tag, a: a.get("id") in ("banner", "title")
                            or has_class(a, "docnav", "toc", "indexterm"))
        yield page.name, text


STDLIB_LEFT_OUT = ("test/", "encodings/", "pydoc_data/", "__phello__/")


def read_python_stdlib(tree: Path) -> Iterator[tuple[str, str]]:
    """The standard library's modules, less its tests, the codecs' generated tables
    (`encodings/`) and pydoc's data (the manual as strings)."""
    lib = next(tree.glob("usr/lib/python3.*"))
    for path in sorted(lib.rglob("*.py")):
        name = str(path.relative_to(lib))
        if not path.is_symlink() and not name.startswith(STDLIB_LEFT_OUT):
            yield name, path.read_text(encoding="utf-8")


def _python_versions(*patterns: str) -> tuple[tuple[str, ...], ...]:
    return tuple(tuple(p.format(v) for p in patterns) for v in ("3.11", "3.12", "3.13"))


PSF = "PSF-2.0 (the Python Software Foundation License)"
SOURCES = (
    Source("austen", (("r-cran-janeaustenr",),),
           "public domain (the novels, as Project Gutenberg transcribed them); the package: MIT",
           "License: MIT", "prose", None, read_austen),
    Source("debian-handbook", (("debian-handbook",),), "GPL-2.0+ or CC-BY-SA-3.0",
           "License: GPL-2.0+ or CC-BY-SA-3.0", "prose", None, read_debian_handbook),
    Source("python-docs", _python_versions("python{}-doc"), PSF,
           "PYTHON SOFTWARE FOUNDATION LICENSE", "prose", 1_200_000, read_python_docs),
    Source("python-stdlib", _python_versions("libpython{}-minimal", "libpython{}-stdlib"), PSF,
           "PYTHON SOFTWARE FOUNDATION LICENSE", "code", 700_000, read_python_stdlib),
)


# --- Documents: split, dedup, select --------------------------------------------------------

# Where a text may be cut, coarsest first: a piece still over the cap is cut at the next level
BREAKS = {
    "prose": (r"\n\n+", r"\n", r"(?<=[.!?;:])\s+", r"\s+"),  # paragraphs, lines, sentences, words
    "code": (r"\n\n+(?=\S)", r"\n\n+", r"\n"),  # top-level statements, blank lines, lines
}
Counter = Callable[[list[str]], list[int]]  # texts -> their token counts


def cut(text: str, pattern: str) -> list[str]:
    """`text` cut after each match of `pattern` (the separator stays with the piece before it):
    the pieces join back into `text`."""
    pieces, start = [], 0
    for match in re.finditer(pattern, text):
        pieces.append(text[start:match.end()])
        start = match.end()
    pieces.append(text[start:])
    return [p for p in pieces if p]


def segments(text: str, breaks: tuple[str, ...], count: Counter, cap: int) -> list[tuple[str, int]]:
    """`text` in pieces of at most `cap` tokens, each with its token count, cut at the coarsest
    level of `breaks` that gets there; a piece no break brings under the cap (one huge line) is
    left out."""
    pieces = cut(text, breaks[0])
    out = []
    for piece, n in zip(pieces, count(pieces)):
        if n <= cap:
            out.append((piece, n))
        elif len(breaks) > 1:
            out += segments(piece, breaks[1:], count, cap)
    return out


def pack(pieces: list[tuple[str, int]], cap: int) -> list[str]:
    """Consecutive pieces joined into as few documents as the cap allows (by the pieces'
    counts), of about equal size: each piece goes to the document its middle token falls in
    when the text is cut into equal parts, one more part while a document is over the cap."""
    total = sum(n for _, n in pieces)
    if not total:
        return []
    parts = math.ceil(total / cap)
    while True:
        groups: list[list[tuple[str, int]]] = [[] for _ in range(parts)]
        before = 0
        for piece, n in pieces:
            groups[min(parts - 1, int((before + n / 2) * parts / total))].append((piece, n))
            before += n
        if all(sum(n for _, n in group) <= cap for group in groups):
            break
        parts += 1
    return ["".join(piece for piece, _ in group).strip("\n").rstrip() for group in groups
            if group]


def split_text(text: str, kind: str, count: Counter, cap: int = MAX_TOKENS) -> list[str]:
    """`text` as documents of at most `cap` tokens, cut where `BREAKS[kind]` says. A document
    that joining made longer than its pieces' counts (tokens merge across a cut) is split again
    under a lower cap."""
    docs = []
    for doc, n in zip(packed := pack(segments(text, BREAKS[kind], count, cap), cap),
                      count(packed)):
        docs += [doc] if n <= cap else split_text(doc, kind, count, 2 * cap - n)
    return docs


def dedup_key(text: str) -> str:
    """Two documents are the same when their words are, case and spacing aside."""
    return hashlib.sha256(" ".join(text.lower().split()).encode()).hexdigest()


def take_budget(docs: list[dict], budget: int | None, seed: str) -> list[dict]:
    """A seeded random subset of `docs` of at most `budget` tokens (all of them when None)."""
    if budget is None:
        return docs
    order = list(docs)
    random.Random(seed).shuffle(order)
    kept, size = [], 0
    for doc in order:
        if size + doc["tokens"] <= budget:
            kept.append(doc)
            size += doc["tokens"]
    return kept


# --- Debian packages ------------------------------------------------------------------------

class Unavailable(Exception):
    """A package the archive did not give (its 'no', or no apt-get here)."""


def fetch_deb(package: str, debs: Path) -> Path:
    """The package's .deb: the one cached in `debs`, else `apt-get download`'s (nothing is
    installed)."""
    cached = sorted(debs.glob(f"{package}_*.deb"))
    if cached:
        return cached[-1]
    debs.mkdir(parents=True, exist_ok=True)
    try:
        run = subprocess.run(["apt-get", "download", "-q", package], cwd=debs,
                             capture_output=True, text=True)
    except FileNotFoundError as exc:
        raise Unavailable("no apt-get on this machine") from exc
    if run.returncode != 0:
        errors = [line for line in run.stderr.splitlines() if line.startswith("E:")]
        raise Unavailable("; ".join(errors) or run.stderr.strip() or "apt-get download failed")
    return sorted(debs.glob(f"{package}_*.deb"))[-1]


def deb_field(deb: Path, field: str) -> str:
    return subprocess.run(["dpkg-deb", "-f", str(deb), field], check=True, capture_output=True,
                          text=True).stdout.strip()


@functools.cache
def refresh_package_lists() -> bool:
    """`apt-get update`, once a run, where root may: whether it ran."""
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return False
    print("apt-get update (a package was not found in the package lists)")
    return subprocess.run(["apt-get", "update", "-q"], capture_output=True).returncode == 0


def fetch_source(source: Source, debs: Path) -> list[Path]:
    """The .debs of the first of the source's candidates the archive gives (the package lists
    refreshed once if none is found)."""
    for refreshed in (False, True):
        reasons = []
        for packages in source.candidates:
            try:
                return [fetch_deb(p, debs) for p in packages]
            except Unavailable as exc:
                reasons.append(f"{' + '.join(packages)}: {exc}")
        if refreshed or not refresh_package_lists():
            break
    raise Unavailable(" | ".join(reasons))


def extract(debs: list[Path], tree: Path) -> None:
    for deb in debs:
        subprocess.run(["dpkg-deb", "-x", str(deb), str(tree)], check=True)


def check_licence(source: Source, debs: list[Path], tree: Path) -> None:
    """Refuses a package whose copyright file no longer states the licence recorded here."""
    for deb in debs:
        copyright_file = tree / "usr/share/doc" / deb_field(deb, "Package") / "copyright"
        if source.licence_phrase not in copyright_file.read_text(encoding="utf-8"):
            raise SystemExit(f"{copyright_file} does not say {source.licence_phrase!r}: check "
                             f"the licence of {deb.name} and update SOURCES")


# --- The build ------------------------------------------------------------------------------

def token_counter() -> Counter:
    """SmolLM2's tokenizer (the one the package ships, byte for byte the model's), without
    special tokens."""
    from tokenizers import Tokenizer  # deferred: only the build needs it

    tokenizer = Tokenizer.from_file(str(TOKENIZER))
    return lambda texts: [len(e.ids) for e in tokenizer.encode_batch(texts,
                                                                     add_special_tokens=False)]


def source_documents(source: Source, texts: Iterator[tuple[str, str]], count: Counter,
                     seen: set[str]) -> list[dict]:
    """The source's documents in order, with their token counts: each text split, a document
    under `MIN_TOKENS` (a whole short text: packing leaves no short last part) or already in
    `seen` left out (the others are added to it)."""
    parts = [(f"{source.name}/{name}#{part}", doc) for name, text in texts
             for part, doc in enumerate(split_text(text, source.kind, count))]
    docs = []
    for (doc_id, text), n in zip(parts, count([doc for _, doc in parts])):
        key = dedup_key(text)
        if n >= MIN_TOKENS and key not in seen:
            seen.add(key)
            docs.append({"id": doc_id, "text": text, "source": source.name,
                         "licence": source.licence, "tokens": n})
    return docs


def jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps({k: r[k] for k in ("id", "text", "source", "licence")},
                              ensure_ascii=False) + "\n" for r in rows).encode()


def write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as f:
        f.write(data)
    Path(f.name).chmod(0o644)
    Path(f.name).replace(path)


def assemble(read: list[tuple[Source, list[dict]]], seed: int = SEED) -> list[dict]:
    """The corpus: each source's documents within its budget, all of them shuffled (seeded)."""
    corpus = [doc for source, docs in read
              for doc in take_budget(docs, source.budget, f"{seed}:{source.name}")]
    random.Random(seed).shuffle(corpus)
    return corpus


def build(folder: Path) -> dict:
    """Builds `folder/corpus.jsonl` and returns its manifest."""
    count = token_counter()
    debs, seen, read, sources = folder / "debs", set(), [], []
    for source in SOURCES:
        try:
            paths = fetch_source(source, debs)
        except Unavailable as exc:
            print(f"{source.name}: left out, the archive did not give it ({exc})")
            sources.append({"name": source.name, "left_out": str(exc)})
            continue
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            tree = Path(tmp)
            extract(paths, tree)
            check_licence(source, paths, tree)
            docs = source_documents(source, source.read(tree), count, seen)
        read.append((source, docs))
        sources.append({
            "name": source.name, "kind": source.kind, "licence": source.licence,
            "packages": [{"package": deb_field(p, "Package"), "version": deb_field(p, "Version"),
                          "sha256": hashlib.sha256(p.read_bytes()).hexdigest()} for p in paths],
            "tokens_available": sum(d["tokens"] for d in docs)})
    corpus = assemble(read)
    if not corpus:
        raise SystemExit("no source could be had: see docs/features-from-data.md for using "
                         "your own data")
    for entry in sources:
        if "packages" in entry:
            kept = [d["tokens"] for d in corpus if d["source"] == entry["name"]]
            entry.update(documents=len(kept), tokens=sum(kept))
            print(f"{entry['name']}: {len(kept)} documents, {sum(kept):,} tokens")
    data = jsonl(corpus)
    write_atomic(folder / "corpus.jsonl", data)
    tokens = sum(d["tokens"] for d in corpus)
    code_sources = {source.name for source, _ in read if source.kind == "code"}
    code = sum(d["tokens"] for d in corpus if d["source"] in code_sources)
    return {"file": "corpus.jsonl", "sha256": hashlib.sha256(data).hexdigest(),
            "bytes": len(data), "documents": len(corpus), "tokens": tokens,
            "code_share": round(code / tokens, 4),
            "tokenizer": "SmolLM2 (workbench/models/tokenizers/smollm2), no special tokens",
            "max_tokens": MAX_TOKENS, "min_tokens": MIN_TOKENS, "seed": SEED,
            "sources": sources}


def write_sample(folder: Path, manifest: dict) -> None:
    """`data/corpus-sample.jsonl`: the shuffled corpus's first `SAMPLE_DOCS` documents, and its
    entry in the manifest."""
    with open(folder / "corpus.jsonl", encoding="utf-8") as f:
        rows = [json.loads(line) for _, line in zip(range(SAMPLE_DOCS), f)]
    data = jsonl(rows)
    write_atomic(SAMPLE_PATH, data)
    manifest["sample"] = {"file": str(SAMPLE_PATH.relative_to(ROOT)),
                          "sha256": hashlib.sha256(data).hexdigest(), "documents": len(rows),
                          "tokens": sum(token_counter()([r["text"] for r in rows])),
                          "from": f"the first {SAMPLE_DOCS} documents of corpus.jsonl "
                                  f"(sha256 {manifest['sha256']})"}


def write_manifest(manifest: dict, *paths: Path) -> None:
    for path in paths:
        write_atomic(path, (json.dumps(manifest, indent=2) + "\n").encode())


def main() -> None:
    from workbench.models import cache_dir  # deferred: the tests import this module's helpers

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--force", action="store_true", help="rebuild even if the corpus is there")
    parser.add_argument("--sample", action="store_true",
                        help=f"also write {SAMPLE_PATH.relative_to(ROOT)} (the tests' slice)")
    args = parser.parse_args()
    folder = cache_dir() / "corpus"
    manifest_path = folder / "manifest.json"
    if (folder / "corpus.jsonl").exists() and manifest_path.exists() and not args.force:
        print(f"the corpus is there: {folder / 'corpus.jsonl'} (--force rebuilds it)")
        manifest = json.loads(manifest_path.read_text())
    else:
        start = time.perf_counter()
        manifest = build(folder)
        write_manifest(manifest, manifest_path)
        print(f"built in {time.perf_counter() - start:.0f} s")
    if args.sample:
        write_sample(folder, manifest)
        write_manifest(manifest, manifest_path, SAMPLE_MANIFEST_PATH)
        print(f"wrote {SAMPLE_PATH} and {SAMPLE_MANIFEST_PATH}")
    print(f"{folder / 'corpus.jsonl'}: {manifest['documents']:,} documents, "
          f"{manifest['tokens']:,} tokens ({manifest['code_share']:.0%} code)")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
