"""A capture job's documents: rows of a JSONL or Parquet file, a list in memory (dicts or
strings), a pandas DataFrame, or a `datasets.Dataset` (never required), with a text column (`text`) or a chat column
(`messages`), and an id column or the row numbers. Unless a column is named, a column `id` or
`custom_id` (as in batch files: `ID_COLUMNS`) in which every row has an id of its own is the id;
else the row numbers are.

`Source.fingerprint` is the sha256 of the input (the file's bytes; a list's or a dataset's rows
as canonical JSON), which a resumed job must match. A missing column is refused before
anything runs (`JobError`); an empty or non-string row becomes that document's error row.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any

ID_COLUMNS = ("id", "custom_id")  # the id column when none is named, where every row has one


class JobError(ValueError):
    """A job refused before it starts: a bad spec, a missing column, an output folder of
    another job or one that cannot be written."""


@dataclass(frozen=True)
class Document:
    """One row: its number, its id, and its text or its conversation."""

    row: int
    doc_id: str
    text: str | None = None
    messages: list[dict[str, Any]] | None = None


class Source:
    """The rows of a job (see the module docstring)."""

    def __init__(self, data: Any, text_column: str = "text", chat_column: str | None = None,
                 id_column: str | None = None):
        self.text_column, self.chat_column, self.id_column = text_column, chat_column, id_column
        self.column = chat_column or text_column
        self.description = "a list"
        if isinstance(data, (str, os.PathLike)):
            path = os.fspath(data)
            if not os.path.isfile(path):
                raise JobError(f"no such data file {path!r}")
            self.description = os.path.abspath(path)
            with open(path, "rb") as f:
                self.fingerprint = hashlib.sha256(f.read()).hexdigest()
            self.rows = _read_file(path)
        else:
            if hasattr(data, "to_list") and hasattr(data, "column_names"):  # datasets.Dataset
                self.description = "a datasets.Dataset"
                data = data.to_list()
            elif hasattr(data, "to_dict") and hasattr(data, "columns"):  # a pandas DataFrame
                self.description = "a pandas DataFrame"
                data = [{k: _plain(v) for k, v in r.items()} for r in data.to_dict("records")]
            elif isinstance(data, dict):  # never its keys as documents
                raise JobError("the data is a dict: give a list of rows (dicts or strings), a "
                               "file, a pandas DataFrame or a datasets.Dataset")
            self.rows = [r if isinstance(r, dict) else {text_column: r} for r in list(data)]
            canon = json.dumps(self.rows, sort_keys=True, ensure_ascii=False, default=str)
            self.fingerprint = hashlib.sha256(canon.encode()).hexdigest()
        if id_column is None:
            self.id_column = default_id_column(self.rows)
        self.check()

    def __len__(self) -> int:
        return len(self.rows)

    def check(self) -> None:
        """Refuses a column no row has (a typo stops the job before it starts)."""
        if not self.rows:
            raise JobError("the data has no rows")
        for column in filter(None, (self.column, self.id_column)):
            if not any(column in r for r in self.rows):
                seen = sorted({k for r in self.rows[:100] for k in r})
                raise JobError(f"column {column!r} is in no row of the data; its columns are "
                               f"{seen}")

    def documents(self, start: int, stop: int) -> list[Document]:
        docs = []
        for row in range(start, min(stop, len(self.rows))):
            r = self.rows[row]
            doc_id = str(r.get(self.id_column, row)) if self.id_column else str(row)
            value = r.get(self.column)
            if self.chat_column:
                docs.append(Document(row, doc_id, messages=value))
            else:
                docs.append(Document(row, doc_id, text=value))
        return docs


def default_id_column(rows: list[dict[str, Any]]) -> str | None:
    """The first of `ID_COLUMNS` in which every row has an id (a string or a number), no two
    the same; None: the row numbers are the ids."""
    for name in ID_COLUMNS:
        values = [r.get(name) for r in rows]
        if all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in values) and \
                len({str(v) for v in values}) == len(values):
            return name
    return None


def _read_file(path: str) -> list[dict[str, Any]]:
    if path.endswith(".parquet"):
        import pandas as pd  # deferred: only Parquet input needs it here

        frame = pd.read_parquet(path)
        return [{k: _plain(v) for k, v in r.items()} for r in frame.to_dict("records")]
    rows = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as exc:
                raise JobError(f"{path} line {number}: not valid JSON ({exc})") from exc
            rows.append(value if isinstance(value, dict) else {"text": value})
    return rows


def _plain(value: Any) -> Any:
    """Parquet's numpy arrays (a list column such as `messages`) as plain lists."""
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        return [_plain(v) for v in value.tolist()] if hasattr(value, "__len__") else \
            value.tolist()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value
