"""Writing ``mdl-jax gate``'s output: each part (Arrow IPC for a Parquet OUT, JSON lines for a JSONL
one), then OUT joined from the parts, one part in memory at a time.

It exists apart from the run because the output's format has rules of its own: a JSONL OUT is strict
JSON (a NaN or an infinity from a Parquet or dataset input is written as null, and said), and Parquet
needs one type per column while JSON rows may mix them (such a column is written as JSON text in every
part and named in the file's metadata, ``JSON_COLUMNS_KEY``). Every file goes through the one writer
(``mdl_jax._io``): a fresh name in the target folder, fsynced, renamed, the folder fsynced.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from mdl_jax._io import atomic_open
from mdl_jax.controller.decision import Action
from mdl_jax.gate.core import ACTION_NAMES, SCALARS

PART_SUFFIX = {".parquet": ".arrow", ".jsonl": ".jsonl"}  # a part's file: see write_part
ACTION_BY_CODE = np.array([ACTION_NAMES[a] for a in Action], dtype=object)  # action code → its name


def _replace_with(path: Path, write, *, tmp_dir: Path | None = None) -> None:
    with atomic_open(path, "wb", tmp_dir=tmp_dir, make_parents=False) as f:
        write(f)


class Decided:
    """One chunk's decided rows: the input rows as read, their 0-based input row numbers and the gate's
    columns (``MemoryGate.columns``). The output columns go to a Parquet part as arrays, never through
    one dict per row (that and the per-value conversions were a fifth of a cached run's time)."""

    def __init__(self, rows: list[dict], index: list[int], cols: dict):
        self.rows, self.index, self.cols = rows, index, cols

    def __len__(self) -> int:
        return len(self.rows)

    def names(self) -> list[str]:
        """The action names, row by row."""
        return ACTION_BY_CODE[self.cols["action"]].tolist()

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


def write_part(path: Path, part: Decided, fmt: str) -> list[str]:
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


def join_parts(parts: list[Path], out: Path, fmt: str, work: Path) -> list[str]:
    """Parts → OUT through a temp file in ``work`` (one part in memory at a time); the columns written
    as JSON text."""
    as_json: set = set()
    _replace_with(out, lambda f: _join_into(f, parts, fmt, as_json), tmp_dir=work)
    return sorted(as_json)


def _join_into(w, parts: list[Path], fmt: str, as_json: set) -> None:
    if fmt == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        def read(p: Path, schema_only: bool = False):  # a part: an Arrow IPC file of ours (write_part)
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
