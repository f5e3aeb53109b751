"""The memory gate as a Ray Data ``map_batches`` callable class: MDL over 10^8 (query, memories) rows
on a cluster, the embedder loaded once per actor (CPU or GPU).

    import ray
    from mdl_jax.integrations.ray_data import MemoryGateBatch

    ds = ray.data.read_parquet("s3://bucket/rows/")          # columns: query, memories (list of texts)
    out = ds.map_batches(MemoryGateBatch, fn_constructor_kwargs={"risk": 0.5},
                         concurrency=8, batch_size=1024)      # num_gpus=1 and device="cuda" on GPU nodes
    out.write_parquet("s3://bucket/gated/")

Ray builds one ``MemoryGateBatch`` per actor (so MiniLM loads ``concurrency`` times, not per batch) and
calls it on each batch. Each batch gains the columns ``mdl-jax gate`` writes, with the same names and
values: ``mdl_action`` ("Active" | "Supp" | "Silent" | "Opt-Out"), ``mdl_M`` ... ``mdl_E_a`` and
``mdl_n_relevant``; the input's columns pass through untouched. A row's decision depends on that row
alone, so the output equals the single-process gate's row for row whatever the batching (tested on a
local two-worker Ray instance).

Bad rows: ``on_bad_row="error"`` (default) fails the batch with a ValueError naming the row and field,
which Ray reports as the task's error; ``on_bad_row="mark"`` keeps the row with ``mdl_action`` = None
and the reason in ``mdl_error``, so one bad row in 10^8 does not stop a cluster job. A query or memory
holding a lone surrogate (not Unicode text: no tokenizer, Arrow or Parquet writer takes it) is such a
row, whatever the embedder; in a marked row its lone surrogates in the query and memories columns are
replaced by U+FFFD, so the batch can still be written (``mdl_error`` says where each was).

A batch that already holds a column this class writes (``mdl_action``, ``mdl_C_final``, ...; and
``mdl_error`` with ``on_bad_row="mark"``) is refused in both modes, with a ValueError naming it, as
``mdl-jax gate`` refuses such input: nothing of the input is overwritten or doubled.

Ray itself is an optional extra (``pip install 'mdl-jax[ray]'``); this module does not import it: a
``map_batches`` callable is a plain class, so it also runs (and is tested) without a cluster.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from mdl_jax.controller.decision import Action
from mdl_jax.gate.core import ACTION_NAMES, LONE_SURROGATE, SCALARS, MemoryGate
from mdl_jax.gate.files import refuse_output_columns
from mdl_jax.signals.embeddings import DEFAULT_MODEL, Embedder, check_backend

ON_BAD_ROW = ("error", "mark")


def _as_list(x) -> list:
    """A memories cell as Ray hands it over (a list, a NumPy object array, an Arrow list) → a list."""
    if isinstance(x, np.ndarray):
        return x.tolist()
    if hasattr(x, "as_py"):  # a pyarrow scalar
        return x.as_py()
    return x


def _scrub(x):
    """``x`` (a cell: a text, a list or array of texts or dicts) with each lone surrogate replaced by
    U+FFFD; other values as they are."""
    if isinstance(x, str):
        return LONE_SURROGATE.sub("\ufffd", x)
    if isinstance(x, Mapping):
        return {_scrub(k): _scrub(v) for k, v in x.items()}
    if isinstance(x, np.ndarray):
        x = x.tolist()
    if isinstance(x, (list, tuple)):
        return [_scrub(v) for v in x]
    return x


def _objects(values: list) -> np.ndarray:
    """A 1-d object array of ``values`` (cells that are lists stay cells, not a second axis)."""
    arr = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        arr[i] = v
    return arr


class MemoryGateBatch:
    """``map_batches`` callable: a batch (a ``{column: array}`` dict, a pandas DataFrame or a pyarrow
    Table) → the same batch with the gate's decision columns added.

    Args:
        embedder: a sentence-transformers name or path (default: the bundled all-MiniLM-L6-v2), an
            object with ``embed(texts)``, or a callable texts → (N, d) array; loaded once per actor.
        risk: A for every row: a number in [0, 1], a preset ("truthfulqa", "halueval"), a
            {category: risk} table or a callable (query, category) → A (as ``MemoryGate``).
        config: an ``MDLConfig`` or a config file path; default the paper's Table 2 settings.
        query_field: the column holding the query.
        memories_field: the column holding each row's memories (texts or dicts with "text").
        category_field: a column holding the category, for a table or preset risk; None for none.
        risk_field: a column holding A in [0, 1] per row (overrides ``risk``); None for none.
        cache_dir: the embedding cache folder on each node (default ``$MDL_JAX_CACHE_DIR`` or
            ``~/.cache/mdl_jax``).
        device: the torch device of a named embedder ("cpu", "cuda"); None for the CPU.
        embed_backend: what runs a named embedder, as ``MemoryGate``'s: "auto" (on the CPU:
            OpenVINO bfloat16 where the node's CPU has it, else ONNX Runtime, where installed on the
            node; torch on a GPU), "torch", ...
        batch_size: the embedder's encoding batch size.
        on_bad_row: "error" (a bad row fails the batch) or "mark" (the row gets ``mdl_action`` None
            and ``mdl_error``; its lone surrogates in the query and memories columns become U+FFFD).

    Raises:
        ValueError: a bad setting (named): a column name that is not a non-empty string, a device
            that is not a name or one given with an embedder that is not a name, a batch size that
            is not a positive int, and the gate's (``MemoryGate``); a batch holding a column this
            class writes (named); with ``on_bad_row="error"`` a bad row (its index in the batch, the field and what was
            expected; a lone surrogate in a query or memory included).
    """

    def __init__(self, embedder: Any = DEFAULT_MODEL, risk: Any = 0.5, config: Any = None, *,
                 query_field: str = "query", memories_field: str = "memories",
                 category_field: str | None = None, risk_field: str | None = None,
                 cache_dir: str | None = None, device: str | None = None, batch_size: int = 64,
                 embed_backend: str = "auto",
                 on_bad_row: str = "error"):
        if on_bad_row not in ON_BAD_ROW:
            raise ValueError(f"on_bad_row: expected one of {list(ON_BAD_ROW)}, got {on_bad_row!r}")
        for name, v in (("query_field", query_field), ("memories_field", memories_field)):
            if not isinstance(v, str) or not v:
                raise ValueError(f"{name}: expected a column name, got {v!r}")
        for name, col in (("category_field", category_field), ("risk_field", risk_field)):
            # "" was read as "no column": a preset then gave every row its default risk
            if col is not None and (not isinstance(col, str) or not col):
                raise ValueError(f"{name}: expected a column name or None, got {col!r}")
        if device is not None and (not isinstance(device, str) or not device):
            raise ValueError(f"device: expected a torch device name (\"cpu\", \"cuda\") or None, got {device!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size: expected a positive int, got {batch_size!r}")
        if isinstance(embedder, os.PathLike):  # a path names a model as its text does
            embedder = os.fspath(embedder)
        if device is not None and not isinstance(embedder, str):
            # an object or callable runs its own model: the device would be ignored, the job on the CPU
            raise ValueError(f"device: applies to a named embedder; the embedder given is a "
                             f"{type(embedder).__name__} (put its model on the device yourself)")
        if isinstance(risk, Mapping) and not category_field and not risk_field:
            # every row would fail ("None is not in the risk table"), as `mdl-jax gate` refuses at start
            raise ValueError("category_field: a {category: risk} table maps each row's category to A; name "
                             "the column holding it (or give risk_field)")
        check_backend(embed_backend, device, name="embed_backend")
        if isinstance(embedder, str) and device is not None:
            embedder = Embedder(embedder, cache_dir=cache_dir, batch_size=batch_size, device=device,
                                backend=embed_backend)
            embed_backend = "auto"  # the Embedder above carries it
        self.gate = MemoryGate(embedder=embedder, risk=risk, config=config, cache_dir=cache_dir,
                               embed_backend=embed_backend,
                               batch_size=batch_size)
        self.query_field, self.memories_field = query_field, memories_field
        self.category_field, self.risk_field = category_field, risk_field
        self.on_bad_row = on_bad_row
        # the columns a batch gains (decide_columns'), which an input batch must not hold already
        self.out_columns = ("mdl_action", *(f"mdl_{k}" for k in SCALARS), "mdl_n_relevant") + (
            ("mdl_error",) if on_bad_row == "mark" else ())

    # -- the batch formats Ray hands over ---------------------------------------------------------
    def __call__(self, batch):
        if isinstance(batch, Mapping):
            self._refuse_gated(list(batch))
            cols = {k: (v if isinstance(v, np.ndarray) else np.asarray(v, dtype=object)) for k, v in batch.items()}
            out = self.decide_columns(cols)
            return {**dict(batch), **{k: _objects(v) for k, v in self._scrubbed(batch, out).items()}, **out}
        if hasattr(batch, "to_pandas") and hasattr(batch, "schema"):  # a pyarrow Table
            import pyarrow as pa

            self._refuse_gated(batch.column_names)  # (Arrow text is UTF-8: it holds no lone surrogate)
            cols = {k: batch.column(k).to_pylist() for k in self._needed(batch.column_names)}
            out = self.decide_columns(cols)
            # each column's type stated: one inferred from an empty batch, or one whose rows are all
            # marked bad, was Arrow's null, and a Parquet folder mixing it with string parts is unreadable
            types = {"mdl_action": pa.string(), "mdl_error": pa.string(), "mdl_n_relevant": pa.int64()}
            for k, v in out.items():
                batch = batch.append_column(k, pa.array(v.tolist() if isinstance(v, np.ndarray) else v,
                                                        type=types.get(k, pa.float64())))
            return batch
        if hasattr(batch, "columns") and hasattr(batch, "assign"):  # a pandas DataFrame
            import pandas as pd

            self._refuse_gated(list(batch.columns))
            cols = {k: batch[k].tolist() for k in self._needed(list(batch.columns))}
            out = self.decide_columns(cols)
            fixed = {k: pd.Series(v, index=batch.index, dtype=object) for k, v in self._scrubbed(cols, out).items()}
            return batch.assign(**fixed, **out)
        raise TypeError(f"batch: expected a dict of columns, a pandas DataFrame or a pyarrow Table, got "
                        f"{type(batch).__name__} (map_batches' batch_format)")

    def _refuse_gated(self, names) -> None:
        refuse_output_columns(names, where="batch", what="the dataset", columns=self.out_columns)

    def _scrubbed(self, cols: Mapping[str, Any], out: Mapping[str, Any]) -> dict[str, list]:
        """The query and memories columns with each marked row's lone surrogates replaced by U+FFFD
        (only those that change): the row's ``mdl_error`` names them, and the batch stays writable."""
        marked = [i for i, e in enumerate(out.get("mdl_error", ())) if e is not None and "lone surrogate" in e]
        fixed: dict[str, list] = {}
        for k in dict.fromkeys((self.query_field, self.memories_field)):
            values = None
            for i in marked:
                cell = cols[k][i]
                new = _scrub(cell)
                if new != (_as_list(cell) if isinstance(cell, np.ndarray) else cell):
                    values = list(cols[k]) if values is None else values
                    values[i] = new
            if values is not None:
                fixed[k] = values
        return fixed

    def _needed(self, names) -> list[str]:
        want = [self.query_field, self.memories_field] + [f for f in (self.category_field, self.risk_field) if f]
        missing = [f for f in want if f not in names]
        if missing:
            raise ValueError(f"batch: no column {missing[0]!r} (columns: {list(names)[:12]}); set "
                             "query_field / memories_field / category_field / risk_field")
        return want

    def decide_columns(self, cols: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """The decision columns for a batch given as {column: sequence}; one entry per row."""
        lengths = {f: len(cols[f]) for f in self._needed(list(cols))}
        if len(set(lengths.values())) > 1:  # one value per row in each (a row past a short column was an IndexError)
            raise ValueError(f"batch: expected columns of one length (one value per row), got {lengths}")
        qs = list(cols[self.query_field])
        mems = [_as_list(m) for m in cols[self.memories_field]]
        cats = list(cols[self.category_field]) if self.category_field else None
        # a risk column's value must be a number in [0, 1] (NaN is refused), as `mdl-jax gate --risk-field`
        # (None becomes NaN so that the check names it: the gate's "use the assessor" is not meant here)
        risks = [float("nan") if r is None else r.item() if isinstance(r, np.generic) else r
                 for r in cols[self.risk_field]] if self.risk_field else None
        n = len(qs)
        ok = np.ones(n, bool)
        errors: list[str | None] = [None] * n
        try:
            self.gate.check(qs, mems, cats, risks)
        except ValueError:
            for i in range(n):  # find the bad rows one by one; only on a batch that has one
                why = self._row_error(i, qs, mems, cats, risks)
                if why is not None and self.on_bad_row == "error":
                    raise ValueError(f"row {i} of the batch: {why}") from None
                if why is not None:
                    ok[i], errors[i] = False, why.replace("[0]", f"[{i}]", 1)
        out: dict[str, np.ndarray] = {"mdl_action": np.full(n, None, dtype=object)}
        for k in SCALARS:
            out[f"mdl_{k}"] = np.full(n, np.nan, np.float64)
        out["mdl_n_relevant"] = np.full(n, -1, np.int64)
        idx = np.flatnonzero(ok)
        if len(idx):
            sub = self.gate.columns([qs[i] for i in idx], [mems[i] for i in idx],
                                    None if cats is None else [cats[i] for i in idx],
                                    None if risks is None else [risks[i] for i in idx])
            out["mdl_action"][idx] = [ACTION_NAMES[Action(int(a))] for a in sub["action"]]
            for k in SCALARS:  # float32 values, widened exactly: the values `mdl-jax gate` writes
                out[f"mdl_{k}"][idx] = sub[k].astype(np.float64)
            out["mdl_n_relevant"][idx] = sub["n_relevant"]
        if self.on_bad_row == "mark":
            out["mdl_error"] = np.array(errors, dtype=object)
        return out

    def _row_error(self, i, qs, mems, cats, risks) -> str | None:
        """What is wrong with row ``i`` alone (the gate's own check on a batch of one), or None."""
        try:
            self.gate.check([qs[i]], [mems[i]], None if cats is None else [cats[i]],
                            None if risks is None else [risks[i]])
        except ValueError as e:
            return str(e)
        return None
