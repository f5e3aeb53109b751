"""Where benchmark and question files are found, and the readers that turn them into rows.

The one place that knows the data folder: the explicit argument first, then ``MDL_JAX_DATA_DIR`` (and, for
the benchmarks, ``MDL_JAX_BENCHMARK_DIR``), then the project's offline copy ``../shared/data`` beside the
repository. Every defect in a file (not UTF-8, malformed JSON, a key stated twice in one object, a row that
is not an object, a missing field, a blank question) is a ``DataError`` that names the file, the line and
what was expected.
"""

from __future__ import annotations

import itertools
import json
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from mdl_jax.strict_json import DuplicateKeyError, loads_unique

ENV_DATA_DIR = "MDL_JAX_DATA_DIR"
ENV_BENCHMARK_DIR = "MDL_JAX_BENCHMARK_DIR"


class DataError(ValueError):
    """A data file is missing or malformed; the message names the file and line."""


def need(row: dict, field: str, where: str, kind: type | tuple[type, ...] = str, *,
         expected: str = "it in every record", none_is_missing: bool = False) -> Any:
    """``row[field]``, checked to be of ``kind``; a DataError naming the place and field otherwise.

    Args:
      row: one record of a data file.
      field: the field to read.
      where: the file and line (or row) the record came from, for the message.
      kind: the type(s) the value must have.
      expected: what the message says was expected of a missing field.
      none_is_missing: a null value counts as missing (the hub's exports write absent fields as null).

    Raises:
      DataError: the field is missing (or null, with ``none_is_missing``) or not of ``kind``.
    """
    if field not in row or (none_is_missing and row[field] is None):
        raise DataError(f"{where}: missing field {field!r}; expected {expected}")
    v = row[field]
    if not isinstance(v, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise DataError(f"{where}: {field}: expected {names}, got {type(v).__name__}")
    return v


def need_text(row: dict, field: str, where: str, *, expected: str = "it in every record",
              none_is_missing: bool = False) -> str:
    """``row[field]`` as a stripped string that is not blank (a question, a passage): ``need``, then the
    blank check, so an empty or whitespace-only value is named where it is, not refused later by a
    signal that no longer knows the file.

    Args:
      row: one record of a data file.
      field: the field to read.
      where: the file and line (or row) the record came from, for the message.
      expected: what the message says was expected of a missing field.
      none_is_missing: a null value counts as missing.

    Returns:
      The value, stripped.

    Raises:
      DataError: the field is missing, not a string, or blank (empty or whitespace only).
    """
    v = need(row, field, where, str, expected=expected, none_is_missing=none_is_missing)
    if not v.strip():
        raise DataError(f"{where}: {field}: expected a non-blank string, got {v!r}"[:300])
    return v.strip()


def text_list(values: Iterable[Any], where: str, field: str) -> list[str]:
    """A list field's strings, stripped, blank ones dropped; a DataError naming ``where`` and ``field`` for
    an element that is not a string."""
    out = []
    for v in values:
        if not isinstance(v, str):
            raise DataError(f"{where}: {field}: expected a list of strings, got an element of type {type(v).__name__}")
        if v.strip():
            out.append(v.strip())
    return out


def limited(rows: Iterable, limit: int | None) -> Iterator:
    """The first ``limit`` rows (all of them for None)."""
    return iter(rows) if limit is None else itertools.islice(rows, limit)


def default_data_dir() -> Path | None:
    """``$MDL_JAX_DATA_DIR``, else ``../shared/data`` beside the repository when it exists, else None.

    Returns:
        The folder, or None when neither is set or present (callers then fall back to the hub).
    """
    env = os.environ.get(ENV_DATA_DIR)
    if env:
        return Path(env)
    shared = Path(__file__).resolve().parents[4] / "shared" / "data"  # ../shared beside the repo
    return shared if shared.is_dir() else None


def benchmark_dir() -> Path | None:
    """The folder holding one sub-folder per benchmark (``rgb_en_fact/``, ``ramdocs/``, ...).

    ``$MDL_JAX_BENCHMARK_DIR`` when set; else ``benchmarks/`` inside ``default_data_dir()`` when it exists.

    Returns:
        The folder, or None when no local copy is configured or present.
    """
    env = os.environ.get(ENV_BENCHMARK_DIR)
    if env:
        return Path(env)
    base = default_data_dir()
    if base is None:
        return None
    folder = base / "benchmarks"
    return folder if folder.is_dir() else None


def read_text(path: Path) -> str:
    """A UTF-8 text file's contents (a byte-order mark is dropped).

    Raises:
        DataError: the file is missing or holds bytes that are not UTF-8 (the line is named).
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    try:
        return data.decode("utf-8-sig")  # a byte-order mark (spreadsheet exports) is not a column name
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise DataError(f"{path}, line {line}: bytes that are not UTF-8 ({e.reason} at byte {e.start}); "
                        "expected a UTF-8 text file") from None


def _kind(obj: Any) -> str:
    return {type(None): "null", list: "an array", str: "a string", bool: "a boolean",
            dict: "an object"}.get(type(obj), "a number")


# a JSON escape of a UTF-16 surrogate: paired, it decodes to one character; alone, to a lone surrogate
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _check_unicode(raw: str, obj: Any, where: str) -> None:
    """A DataError at ``where`` if the JSON ``raw`` decoded to a string holding a lone surrogate (an
    escape such as "\\ud800" without its pair): no Unicode text, it would fail only where the text is
    encoded, far from the file (the embedder, a run record's digest), without the file and line."""
    if _SURROGATE_ESCAPE.search(raw):
        _check_strings(obj, where)


def _lone_escape(text: str) -> tuple[int, int, str] | None:
    """(line, column, character) of the first escape in the JSON ``text`` that decodes to a lone
    surrogate (as ``json`` pairs them: a high one directly followed by a low one is one character);
    None if there is none."""
    paired = -1  # where the low half of the last pair starts
    for m in _SURROGATE_ESCAPE.finditer(text):
        s = m.start()
        if s == paired:
            continue
        k = s
        while k and text[k - 1] == "\\":
            k -= 1
        if (s - k) % 2:  # an escaped backslash followed by "u...": text, not an escape
            continue
        c = int(m.group()[2:], 16)
        if c < 0xDC00 and re.match(r"\\u[dD][c-fC-F][0-9a-fA-F]{2}", text[m.end():m.end() + 6]):
            paired = m.end()
            continue
        return text.count("\n", 0, s) + 1, s - text.rfind("\n", 0, s), chr(c)
    return None


def _check_strings(obj: Any, where: str) -> None:
    """A DataError at ``where`` if a string of ``obj`` (a key too) holds a lone surrogate."""
    todo = [obj]
    while todo:
        o = todo.pop()
        if isinstance(o, str):
            try:
                o.encode("utf-8")
            except UnicodeEncodeError as e:
                raise DataError(f"{where}: a string holds a lone surrogate ({o[e.start]!r} at character "
                                f"{e.start}), which is not Unicode text; expected UTF-8 text") from None
        elif isinstance(o, dict):
            todo += [*o.keys(), *o.values()]
        elif isinstance(o, list):
            todo += o


def iter_jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    """(line number, object) for every non-blank line of a JSON-lines file, in file order.

    Raises:
        DataError: malformed JSON, a key stated twice in one object, a line that is not a JSON object,
            or a string holding a lone surrogate (file and line named).
    """
    # split on "\n" only: str.splitlines would also cut at U+2028 and friends, which JSON strings may hold raw
    for n, line in enumerate(read_text(path).split("\n"), 1):
        if not line.strip():
            continue
        try:
            obj = loads_unique(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}, line {n}: malformed JSON ({e.msg}); expected one object per line") from None
        except DuplicateKeyError as e:
            raise DataError(f"{path}, line {n}: {e}") from None
        except RecursionError:  # [[[…]]] deeper than Python's stack: a defect of the file, not a bug
            raise DataError(f"{path}, line {n}: JSON nested too deeply; expected one object per line") from None
        if not isinstance(obj, dict):
            raise DataError(f"{path}, line {n}: expected a JSON object, got {_kind(obj)}")
        _check_unicode(line, obj, f"{path}, line {n}")
        yield n, obj


def read_json(path: Path) -> Any:
    """One JSON document.

    Raises:
        DataError: malformed JSON, or a string holding a lone surrogate (the line and column named), or
            a key stated twice in one object (the key named).
    """
    text = read_text(path)
    try:
        doc = loads_unique(text)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}, line {e.lineno}: malformed JSON ({e.msg}); expected one JSON document") from None
    except DuplicateKeyError as e:
        raise DataError(f"{path}: {e}") from None
    except RecursionError:
        raise DataError(f"{path}: JSON nested too deeply; expected one JSON document") from None
    if _SURROGATE_ESCAPE.search(text):
        try:  # the decoded strings first: the escape-by-escape search runs only for a file with one
            _check_strings(doc, str(path))
        except DataError:
            # one document is often the whole data set on a few lines: where, not just which file
            at = _lone_escape(text)
            if at is None:
                raise
            raise DataError(f"{path}, line {at[0]}, column {at[1]}: a string holds a lone surrogate "
                            f"({at[2]!r}), which is not Unicode text; expected UTF-8 text") from None
    return doc


def read_records(path: Path) -> list[tuple[str, dict]]:
    """(where, row) for every record of a local export of a hub split: ``.jsonl``, ``.json`` (an array of
    objects, or one object per line) or ``.parquet``.

    Args:
        path: the file.

    Returns:
        One (``"<file>, line N"`` or ``"<file>, record N"``, row) pair per record, in file order.

    Raises:
        DataError: an unknown suffix, a malformed file, a key stated twice in one object, or a record
            that is not an object.
    """
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq  # a dependency of ``datasets``; imported on use

        if not path.is_file():
            raise DataError(f"{path}: file not found")
        rows = pq.read_table(path).to_pylist()
        return [(f"{path}, record {i}", r) for i, r in enumerate(rows)]
    if suffix == ".jsonl":
        return [(f"{path}, line {n}", r) for n, r in iter_jsonl(path)]
    if suffix == ".json":
        text = read_text(path)
        try:
            doc = loads_unique(text)
        except json.JSONDecodeError:
            return [(f"{path}, line {n}", r) for n, r in iter_jsonl(path)]
        except DuplicateKeyError as e:
            try:
                json.loads(text)
            except json.JSONDecodeError:  # one object per line: the line is named, as in a .jsonl file
                return [(f"{path}, line {n}", r) for n, r in iter_jsonl(path)]
            except RecursionError:
                pass
            raise DataError(f"{path}: {e}") from None
        except RecursionError:  # [[[…]]] deeper than Python's stack: a defect of the file, not a bug
            raise DataError(f"{path}: JSON nested too deeply; expected an array of objects") from None
        if isinstance(doc, dict):
            doc = [doc]
        if not isinstance(doc, list):
            raise DataError(f"{path}: expected an array of objects, got {_kind(doc)}")
        # a record named as every other error of it is, not the whole array's file
        escapes = _SURROGATE_ESCAPE.search(text) is not None
        out = []
        for i, r in enumerate(doc):
            if not isinstance(r, dict):
                raise DataError(f"{path}, record {i}: expected a JSON object, got {_kind(r)}")
            if escapes:
                _check_strings(r, f"{path}, record {i}")
            out.append((f"{path}, record {i}", r))
        return out
    raise DataError(f"{path}: expected a .jsonl, .json or .parquet file")


def hub_records(repo: str, config: str | None, split: str | None, *,
                trust_remote_code: bool = False) -> list[tuple[str, str, dict]]:
    """(split, where, row) for every record of a hub data set, through ``datasets.load_dataset`` (needs a
    network the first time; the ``datasets`` library caches it after).

    Args:
        repo: the hub id, e.g. ``"Salesforce/FaithEval-unanswerable-v1.0"``.
        config: the configuration name, or None for the default.
        split: the split name, or None for every split in the order the hub lists them.
        trust_remote_code: True for hub sets that are a loading script (those need a ``datasets`` release
            that still runs scripts).

    Returns:
        One (split, ``"<repo>:<split>, record N"``, row) triple per record, in the hub's order.
    """
    import datasets  # heavy; imported on use

    kwargs = {"trust_remote_code": True} if trust_remote_code else {}
    loaded = datasets.load_dataset(repo, config, split=split, **kwargs)
    parts = [(split, loaded)] if split is not None else list(loaded.items())
    return [(name, f"{repo}:{name}, record {i}", dict(r)) for name, ds in parts for i, r in enumerate(ds)]


def hub_files(repo: str, filenames: list[str]) -> Path:
    """Download files of a hub data-set repository (``huggingface_hub.hf_hub_download``, into its cache;
    needs a network the first time) and return the folder holding them, laid out as upstream, so the local
    reader reads them unchanged.

    Args:
        repo: the hub id, e.g. ``"HanNight/RAMDocs"``.
        filenames: paths inside the repository.

    Returns:
        The snapshot folder the files are in.
    """
    from huggingface_hub import hf_hub_download  # a dependency of ``datasets``; imported on use

    paths = [Path(hf_hub_download(repo, f, repo_type="dataset")) for f in filenames]
    return paths[0].parent
