"""Reading ``mdl-jax gate``'s input: rows from a JSONL, CSV or Parquet file, a dataset folder or the
Hugging Face Hub, each as (0-based row, value, "line N" / "row N"), and one row's gate inputs.

The readers exist apart from the run because each source has its own ways to break (a JSONL line too
long to hold, a CSV cell past the csv module's limit, a truncated Parquet file, a dataset that cannot
load), and each is bounded and named here, once. A JSONL file is read a part at a time
(``jsonl_parts``), the other sources row by row (``iter_rows``); both digest what they read, so that a
resumed run can check its input is unchanged. A row that cannot be read is a ``Bad`` value saying why:
the run then stops or skips it (``--on-bad-row``).
"""

from __future__ import annotations

import csv
import functools
import hashlib
import io
import itertools
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from mdl_jax.gate.checks import check_query, memory_texts, surrogate_fault, unit_float
from mdl_jax.gate.job import CHUNK_SIZE, GateInputError, RowFields, canonical, changed, one_line
from mdl_jax.signals.aggregation import MAX_MEMORIES
from mdl_jax.strict_json import depth_message, loads, nested_deeper

# Bounds of reading a row (memories per row: MAX_MEMORIES in mdl_jax.signals.aggregation, a bad row):
#   CSV_FIELD_LIMIT    characters in one CSV cell (Python's csv default is 131,072); a longer cell
#                      stops the run (exit 2) naming the file and row: past it the file cannot be split
#                      into rows reliably (an unclosed quote reads the rest of the file as one cell).
#   MAX_LINE_BYTES     bytes in one JSONL line: a longer one is a bad row, skipped without being held
#                      in memory whole (a file with no newline is not read into memory at once).
#   MAX_JSON_DEPTH     nesting of a JSON value (a JSONL row, a CSV memories cell, a --risk table): a
#                      deeper one is a bad row; below it, every step that walks a row (the checks, the
#                      JSON and Arrow writers) stays far from Python's recursion limit.
CSV_FIELD_LIMIT = 1 << 26
MAX_LINE_BYTES = 1 << 26
MAX_JSON_DEPTH = 128


class Bad:
    """A row that cannot be read, in place of its value: ``why`` says what is wrong."""

    def __init__(self, why: str):
        self.why = why


# --- reading: (row index, row dict) from any supported source ---------------------------------------

def source_kind(src: str) -> str:
    """What IN is: "jsonl", "parquet" or "csv" (a file, by its suffix), "hf-disk" (a folder saved by
    ``datasets``), "hf-folder" (a folder of data files) or "hf-hub" (a dataset name); GateInputError
    for a file of another kind, or a path that names nothing."""
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
orjson: Any
try:
    import orjson
except ImportError:  # pragma: no cover - exercised where orjson is not installed
    orjson = None
# every digit made "0", so one substring search finds a run of 19 (cheaper than a regex scan per row)
# (and every "{" made "[", so one count bounds the nesting: see nested_deeper)
_DIGITS_AS_ZERO = bytes.maketrans(b"123456789{", b"000000000[")
_LONG_RUN = b"0" * 19


def decode_line(raw: bytes) -> object:
    """One JSONL line → its value, or ``Bad`` saying why it is not one (the same with or without orjson)."""
    folded = raw.translate(_DIGITS_AS_ZERO) if orjson is not None else b""
    if orjson is not None and _LONG_RUN not in folded:
        try:
            value = orjson.loads(raw)  # it refuses lone surrogates: none can be in what it returns
        except orjson.JSONDecodeError:
            pass  # json says what is wrong (NaN, Infinity, nesting past orjson's bound, ...)
        else:
            if folded.count(b"[") > MAX_JSON_DEPTH and nested_deeper(value, raw, MAX_JSON_DEPTH):
                return Bad(f"not a JSON object ({_TOO_DEEP})")
            return value
    try:
        value = strict_json(raw.decode("utf-8"))
    except ValueError as e:  # UnicodeDecodeError and JSONDecodeError among them
        return Bad(f"not a JSON object ({one_line(e)})")
    # JSON's \\ud800 escapes decode to lone surrogates, which no UTF-8 writer (nor tokenizer) takes
    bad = lone_surrogate(value, "") if b"\\u" in raw else None
    return Bad(bad) if bad else value


_TOO_DEEP = depth_message(MAX_JSON_DEPTH, "MAX_JSON_DEPTH")


def strict_json(text: str) -> Any:
    """``text`` as strict JSON (``mdl_jax.strict_json.loads``): no NaN or Infinity (Python's ``json``
    reads them, and a number past a double's range as infinity), nesting at most MAX_JSON_DEPTH deep.

    Args:
        text: the JSON text.

    Returns:
        Its value.

    Raises:
        ValueError: not strict JSON, nested too deep, or an integer past Python's digit limit; the
          message says which.
    """
    return loads(text, max_depth=MAX_JSON_DEPTH, depth_name="MAX_JSON_DEPTH")


def read_jsonl(path: Path, start: int) -> Iterator[tuple[int, object, str]]:
    """(row, value, where): row = 0-based line index; blank lines are skipped but counted."""
    for part in jsonl_parts(path, 0, CHUNK_SIZE):
        for i, value, where in part:
            if i >= start:
                yield i, value, where


class HashingReader(io.RawIOBase):
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


def open_hashed(path: Path) -> tuple[HashingReader, io.BufferedReader]:
    """``path`` opened for reading through a ``HashingReader`` (the digest) and a 1 MiB buffer."""
    raw = HashingReader(path)
    return raw, io.BufferedReader(raw, buffer_size=1 << 20)


class Part(list):
    """A part's rows, and ``digest``: the input read so far (``HashingReader.state``) once they were read."""

    digest: dict | None = None


_TOO_LONG: Any = object()  # a line past MAX_LINE_BYTES, in what next_lines returns


def next_lines(f, n: int) -> list:
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


def jsonl_parts(path: Path, k: int, C: int) -> Iterator[Part]:
    """Part k, k + 1, ... of a JSONL file: input lines [k·C, (k+1)·C) at a time, as ``read_jsonl``'s rows
    (a blank line counted, not yielded). A part's lines are read as one slice of the file, not row by
    row through a look-ahead: a fifth of a cached run's reading time. Each part's ``digest`` is that of
    the file's bytes read until then (the lines of the parts before k included)."""
    raw, f = open_hashed(path)
    with f:
        i = 0
        while i < k * C:  # the parts already on disk: read (and digested), not decoded
            got = len(next_lines(f, min(C, k * C - i)))
            if not got:
                break
            i += got
        while True:
            lines = next_lines(f, C)
            if not lines:
                return
            part = Part((i + j, Bad(f"line longer than MAX_LINE_BYTES = {MAX_LINE_BYTES:,} bytes")
                          if line is _TOO_LONG else decode_line(line), f"line {i + j + 1}")
                         for j, line in enumerate(lines) if line is _TOO_LONG or not line.isspace())
            part.digest = raw.state()
            yield part
            i += len(lines)


def lone_surrogate(x: Any, path: str) -> str | None:
    """Why ``x`` (a JSON value at ``path``) is not Unicode text, or None (the gate's own check,
    ``surrogate_fault``, on every string in it)."""
    if isinstance(x, str):
        why = surrogate_fault(x)
        return None if why is None else f"field {path or 'the row'}: {why}"
    if isinstance(x, dict):
        for k, v in x.items():
            where = f"{path}[{k!r}]" if path else repr(k)
            why = lone_surrogate(k, where + " (its name)") or lone_surrogate(v, where)
            if why:
                return why
    elif isinstance(x, list):
        for j, v in enumerate(x):
            why = lone_surrogate(v, f"{path}[{j}]")
            if why:
                return why
    return None


def read_csv(path: Path, start: int, on_open=None) -> Iterator[tuple[int, object, str]]:
    """(row, value, where) from row ``start`` on; ``on_open`` is given the file's ``HashingReader``."""
    delim = "\t" if path.suffix.lower() == ".tsv" else ","
    raw, binary = open_hashed(path)
    if on_open is not None:
        on_open(raw)
    # utf-8-sig: a byte-order mark (a spreadsheet's "CSV UTF-8" export) is not part of the first name
    with io.TextIOWrapper(binary, newline="", encoding="utf-8-sig", errors="strict") as f:
        # strict: a quoted cell left open at the end of the file (a torn file) or text after a closing
        # quote is an error, not a cell read to the end of the file or with its quotes dropped
        reader = csv.DictReader(f, delimiter=delim, strict=True)
        i = 0
        header = None
        while True:
            # the limit is the csv module's, process-wide: raised for this read only, then put back
            old = csv.field_size_limit(CSV_FIELD_LIMIT)
            try:
                if header is None:
                    header = _csv_header(path, reader.fieldnames or [])
                row = next(reader)
            except StopIteration:
                return
            except UnicodeDecodeError as e:
                raise GateInputError(f"IN: {path}: not UTF-8 text ({e})") from None
            except csv.Error as e:
                limit = (f"; the limit is CSV_FIELD_LIMIT = {CSV_FIELD_LIMIT:,} characters per cell"
                         if "field limit" in str(e) else "")
                raise GateInputError(f"IN: {path}, row {i + 1}: not readable as CSV ({e}{limit})") from None
            finally:
                csv.field_size_limit(old)
            if i >= start:
                # DictReader keeps the cells past the header under None and fills missing ones with None:
                # the first became a column named "null", the second a field read as empty
                if None in row or None in row.values():
                    n = len(header) + len(row.get(None) or ()) - sum(v is None for v in row.values())
                    yield i, Bad(f"the row has {n} cell{'s' * (n != 1)}, the header {len(header)}"), f"row {i + 1}"
                else:
                    yield i, row, f"row {i + 1}"
            i += 1


def _csv_header(path: Path, names: Sequence[str]) -> Sequence[str]:
    """A CSV file's column names; GateInputError naming the file if one is given twice (its cells would
    reach the output under one name: the later one kept, the earlier dropped)."""
    seen = set()
    for name in names:
        if name in seen:
            raise GateInputError(f"IN: {path}: the header names the column {name!r} twice; rename one")
        seen.add(name)
    return names


def parquet_file(path: Path):
    """``pyarrow.parquet.ParquetFile(path)``; GateInputError naming the file if it is not readable."""
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path)
    except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a broken file
        raise GateInputError(f"IN: {path}: not a readable Parquet file ({one_line(e)})") from None


def read_parquet(path: Path, start: int, chunk: int) -> Iterator[tuple[int, object, str]]:
    """(row, value, where) from row ``start`` on, ``chunk`` rows read at a time; GateInputError naming
    the rows that cannot be read (a file truncated or overwritten while it is read)."""
    f = parquet_file(path)
    i = 0
    batches = f.iter_batches(batch_size=chunk)
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except Exception as e:  # noqa: BLE001 - a truncated or overwritten file: ArrowInvalid, OSError, ...
            raise GateInputError(f"IN: {path}, rows {i + 1}-{i + chunk}: not readable as Parquet "
                                 f"({type(e).__name__}: {one_line(e)}); was the file truncated or "
                                 "overwritten?") from None
        n = batch.num_rows
        if i + n <= start:
            i += n
            continue
        try:
            rows = batch.to_pylist()
        except UnicodeDecodeError:   # a string column holding bytes that are not UTF-8: row by row
            rows = [_parquet_row(batch, j) for j in range(n)]
        for j, row in enumerate(rows):
            if i + j >= start:
                yield i + j, row, f"row {i + j + 1}"
        i += n


def _parquet_row(batch, j: int):
    row = batch.slice(j, 1)
    try:
        return row.to_pylist()[0]
    except UnicodeDecodeError as e:
        bad = [name for name, col in zip(row.schema.names, row.columns) if not _utf8(col)]
        return Bad(f"column {bad[0] if bad else '?'!r}: a string that is not UTF-8 ({one_line(e)})")


def _utf8(col) -> bool:
    try:
        col.to_pylist()
        return True
    except UnicodeDecodeError:
        return False


class RowDigest:
    """The rows of a streamed dataset, digested (SHA-256 of each row's canonical JSON) as they are read:
    ``state()`` is {"rows": n, "sha256": the first n rows' digest}. Given ``expect`` (a part's state
    from the run being resumed), reading past its rows checks them: GateInputError if they differ."""

    def __init__(self, src: str, expect: dict | None = None):
        self.src, self.expect = src, expect
        self._h, self._n = hashlib.sha256(), 0

    def add(self, row) -> None:
        self._h.update(json.dumps(row, sort_keys=True, default=canonical).encode() + b"\n")
        self._n += 1
        if self.expect is not None and self._n == self.expect["rows"]:
            self._check()

    def end(self) -> None:
        if self.expect is not None and self._n < self.expect["rows"]:
            self._check()

    def _check(self) -> None:
        expect = self.expect
        if expect is not None and self.state() != expect:
            raise GateInputError(changed(f"IN: {self.src}'s rows", f"its first {expect['rows']:,} rows"))
        self.expect = None

    def state(self) -> dict:
        return {"rows": self._n, "sha256": self._h.hexdigest()}


def read_hf(src: str, kind: str, split: str, start: int, on_open=None,
             expect: dict | None = None) -> Iterator[tuple[int, object, str]]:
    """(row, value, where) from row ``start`` on. A Hub dataset's rows are digested as they stream
    (``RowDigest``, given to ``on_open``; checked against ``expect``), and so are read from the first
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
            digest = RowDigest(src, expect)
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
    for row in _decoded(rows, src, i):
        if digest is not None:
            digest.add(row)
            if i < start:
                i += 1
                continue
        # a dataset built from Python objects (a loading script, a JSON loader) may hold lone surrogates
        bad = lone_surrogate(row, "")
        yield i, (Bad(bad) if bad else row), f"row {i + 1}"
        i += 1
    if digest is not None:
        digest.end()


def _decoded(rows, src: str, first: int) -> Iterator:
    # ``datasets`` decodes a batch's strings at once: one that is not UTF-8 ends the read (the batch's
    # other rows cannot be had either), as one line naming the row, never a traceback
    it, at = iter(rows), first
    while True:
        try:
            row = next(it)
        except StopIteration:
            return
        except UnicodeDecodeError as e:
            raise GateInputError(f"IN: {src}, near row {at + 1}: a string that is not UTF-8 ({one_line(e)}); "
                                 "give the Parquet file itself as IN to skip such rows") from None
        except MemoryError:
            raise
        except Exception as e:  # noqa: BLE001 - datasets reads lazily: a folder's files whose columns
            # differ, a file that is not of its suffix's format, ... fail here, as many types
            raise GateInputError(f"IN: cannot read the dataset {src!r} near row {at + 1} "
                                 f"({type(e).__name__}: {one_line(e)[:300]})") from None
        at += 1
        yield row


def iter_rows(src: str, kind: str, *, start: int = 0, split: str = "train", chunk: int = 1024,
              on_open=None, expect: dict | None = None) -> Iterator[tuple[int, object, str]]:
    """Rows from input row ``start`` on: (0-based row, row value, "line N" / "row N"). ``on_open`` is
    given what digests a CSV file's bytes or a Hub dataset's rows as they are read (its ``state()``);
    ``expect``, a Hub dataset's state from a run being resumed, is checked on the way."""
    if kind == "jsonl":
        return read_jsonl(Path(src), start)
    if kind == "csv":
        return read_csv(Path(src), start, on_open)
    if kind == "parquet":
        return read_parquet(Path(src), start, chunk)
    return read_hf(src, kind, split, start, on_open, expect)


# --- one row → (query, memories, category, risk) ----------------------------------------------------

def parse_row(row, fields: RowFields) -> tuple[str, list[str], Any, float | None]:
    """The gate's inputs from one row, checked as ``MemoryGate.check`` checks them.

    Args:
      row: a row as a reader yields it: a dict of fields, or a ``Bad``.
      fields: where the row keeps the query, memories, category and risk (``GateJob.row_fields``).

    Returns:
      (query, memory texts (a dict's "text"), category or None, risk in [0, 1] or None).

    Raises:
      GateInputError: the row is bad; the message starts with the field (or says why the row could
        not be read).
    """
    if isinstance(row, Bad):
        raise GateInputError(row.why)
    if not isinstance(row, dict):
        raise GateInputError(f"expected an object with fields, got {type(row).__name__}")

    def field(name):
        if name not in row:
            flag = next(f for f, v in (("--query-field", fields.query_field),
                                       ("--memories-field", fields.memories_field),
                                       ("--category-field", fields.category_field),
                                       ("--risk-field", fields.risk_field)) if v == name)
            raise GateInputError(f"field {name!r}: missing (fields: {sorted(map(str, row))[:10]}); "
                                 f"name the row's field with {flag}")
        return row[name]

    q, mems = row.get(fields.query_field), row.get(fields.memories_field)
    if type(q) is str and type(mems) is list and not fields.category_field and not fields.risk_field \
            and len(mems) <= MAX_MEMORIES and q and not q.isspace() \
            and all(type(m) is str and m and not m.isspace() for m in mems):
        # the common row (a query and a list of non-blank texts; JSONL parses to it), checked as the
        # general path below checks it, without its per-field calls (a cached row's cost is mostly these)
        return q, list(mems), None, None
    try:
        q = check_query("query", field(fields.query_field))
    except ValueError as e:
        raise GateInputError(f"field {fields.query_field!r}: {str(e).split(': ', 1)[1]}") from None
    mems = field(fields.memories_field)
    if isinstance(mems, str) and fields.kind == "csv":
        try:  # a CSV cell holds the list as JSON
            mems = strict_json(mems)
        except ValueError as e:
            raise GateInputError(f"field {fields.memories_field!r}: expected a JSON list of memories "
                                 f"in the CSV cell, got {mems[:60]!r} ({one_line(e)[:120]})") from None
    if hasattr(mems, "tolist") and not isinstance(mems, (str, bytes)):
        mems = mems.tolist()
    try:
        texts = memory_texts("memories", mems)
    except ValueError as e:
        raise GateInputError(f"field {fields.memories_field!r}{str(e)[len('memories'):]}") from None
    cat = field(fields.category_field) if fields.category_field else None
    risk = None
    if fields.risk_field:
        r = field(fields.risk_field)
        try:
            risk = unit_float("risk", float(r) if isinstance(r, str) else r)
        except ValueError:
            raise GateInputError(f"field {fields.risk_field!r}: expected a number in [0, 1], "
                                 f"got {r!r}"[:200]) from None
    return q, texts, cat, risk
