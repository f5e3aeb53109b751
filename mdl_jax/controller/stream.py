"""Sweeps over records streamed from Parquet: more records than memory, reduced as they are read.

    res = sweep_parquet("records.parquet", config_grid(g_a=np.linspace(0, 1, 21)), bootstrap=10)
    res.accuracy            # (21, 10), exactly what ``sweep`` gives on the same records and weights

The file is read row group by row group in batches (pyarrow ``ParquetFile.iter_batches``), the
records are cut into passes of ``record_chunk`` and every pass goes through the same pass machinery as
``sweep`` (``passes.Reducer``: the engine chosen by ``engine``, the 2-D device mesh, exact integer
sums), so memory holds one pass and one batch whatever the number of records.

Bootstrap for a stream. ``sweep``'s ``bootstrap_weights`` draws N times from N records, which needs N
up front; a stream uses the Poisson(1) bootstrap instead (each record's multiplicity in a resample is
an independent Poisson(1) draw, the standard bootstrap for data seen once: its resamples have a
random size, N on average). The draws are a function of (seed, resample, row index) only: rows are
grouped in blocks of 2^16 and block b's (W, 2^16) multiplicities come from
``numpy.random.default_rng([seed, b])``, so the weights do not depend on the batch size, the row-group
layout or how rows are split between processes, and ``poisson_weights(0, N, W, seed)`` gives the same
(W, N) weights for ``sweep`` on arrays (the tests check both agree).

Records that share a question are not independent: resampled one by one, their intervals come out too
narrow. With a "group" column (a question id) the multiplicities are drawn per group instead, every
record of a group weighing its group's draw (the Poisson cluster bootstrap). A group's draw is a
function of (seed, resample, the group's id) only, hashed, not of where its records stand, so it needs
no table of the groups seen: a group's records may lie anywhere in the file, and ``group_weights(ids,
W, seed)`` gives ``sweep`` on arrays the same weights.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from mdl_jax.controller import sweep as _sw
from mdl_jax.controller.batches import as_batch, check_batch
from mdl_jax.controller.config import MDLConfig
from mdl_jax.controller.passes import (
    Reducer,
    check_pass_options,
    engine_for_mesh,
    pass_layout,
    passes_on_mesh,
    result_from_state,
)
from mdl_jax.controller.sweep import RECORD_CHUNK, SweepResult

# Rows per block of Poisson draws (see the module docstring).
POISSON_BLOCK = 1 << 16
ROLES = ("M", "R", "A", "adopt", "weight", "group")
# Poisson(1)'s cumulative distribution at 0, 1, ..., 19: P(X > 19) < 2^-62, below the 2^-53 steps of the
# uniform draws, so a longer table would change no draw
_POISSON_CDF = np.cumsum([np.exp(-1.0) / np.prod(np.arange(1, k + 1, dtype=np.float64)) for k in range(20)])
_MIX = (np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))


def _mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on a uint64 array (wrapping arithmetic): equal inputs give equal outputs,
    nearby ones unrelated."""
    x = x ^ (x >> np.uint64(30))
    x = x * _MIX[0]
    x = x ^ (x >> np.uint64(27))
    x = x * _MIX[1]
    return x ^ (x >> np.uint64(31))


def group_keys(ids, what: str = "group", row0: int = 0) -> np.ndarray:
    """The 64-bit keys of group ids: integers as their value, strings (and bytes) by an 8-byte BLAKE2b
    digest of their UTF-8; a function of the id alone, the same in every process and on every run.

    Args:
      ids: a sequence or 1-d array of integers or of strings / bytes (one kind), or a pyarrow array.
      what: the name the errors give the ids.
      row0: the row of the first id, for the errors (a batch's place in its file).

    Returns:
      (n,) uint64 keys.

    Raises:
      ValueError: ids that are neither all integers nor all strings (floats, bools, mixed kinds), or a
        missing id, naming ``what``.
    """
    import hashlib

    try:
        import pyarrow as pa
    except ImportError:  # pragma: no cover - pyarrow is in the [signals] extra
        pa = None
    if pa is not None and isinstance(ids, (pa.Array, pa.ChunkedArray)):
        if ids.null_count:
            i = int(np.flatnonzero(np.asarray(ids.is_null()))[0])
            raise ValueError(f"{what}: expected an id in every row; row {row0 + i} is null")
        if pa.types.is_string(ids.type) or pa.types.is_large_string(ids.type) or pa.types.is_binary(ids.type):
            # each distinct id hashed once (a question's records share it), in Arrow's own encoder
            enc = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
            enc = enc.dictionary_encode()
            return group_keys(enc.dictionary.to_numpy(zero_copy_only=False), what)[
                enc.indices.to_numpy(zero_copy_only=False)]
        ids = ids.to_numpy(zero_copy_only=False)
    # as objects, a list's kinds as given: NumPy would read [1, "a"] as two strings
    x = ids if isinstance(ids, np.ndarray) else np.array(list(ids) + [None], object)[:-1]
    if x.ndim != 1:
        raise ValueError(f"{what}: expected a 1-d sequence of ids, got shape {x.shape}")
    if x.dtype == object and len(x):
        values = x.tolist()
        if type(None) in (kinds := {type(v) for v in values}):
            raise ValueError(f"{what}: expected an id for every record; index {values.index(None)} is None")
        if all(issubclass(k, (int, np.integer)) and not issubclass(k, (bool, np.bool_)) for k in kinds):
            try:
                x = x.astype(np.int64)
            except OverflowError:
                # ids past 2^63 (a uint64 column's, as Python ints): the keys the uint64 column gives
                try:
                    x = x.astype(np.uint64)
                except OverflowError:
                    raise ValueError(f"{what}: expected integer ids that int64 or uint64 holds (not "
                                     "negative ids beside ids past 2^63 - 1)") from None
        elif not (kinds <= {str} or kinds <= {bytes}):
            raise ValueError(f"{what}: expected integer or string ids of one kind, got "
                             f"{', '.join(sorted(k.__name__ for k in kinds))}")
    if x.dtype.kind in "iu":
        return _mix64(x.astype(np.uint64))   # (two's complement for negative ids: one key each)
    if x.dtype.kind in "USO":
        uniq, inv = np.unique(x, return_inverse=True)
        # (a lone surrogate, which a Parquet string cannot hold but a Python one can, is an id too)
        keys = np.array([int.from_bytes(hashlib.blake2b(v.encode("utf-8", "surrogatepass") if isinstance(v, str)
                                                          else bytes(v), digest_size=8).digest(), "little")
                         for v in uniq.tolist()], np.uint64)
        return keys[inv.reshape(-1)]
    raise ValueError(f"{what}: expected integer or string ids (a question id), got {x.dtype}")


def group_weights(ids, n_resamples: int, seed: int = 0) -> np.ndarray:
    """(n_resamples, n) int32 Poisson(1) cluster-bootstrap multiplicities: one draw per (resample,
    group), every record of a group weighing its group's; a function of (seed, resample, id) only.

    Examples:
      >>> w = group_weights(["q1", "q1", "q2"], 3, seed=0)   # the records of q1 move together
      >>> bool((w[:, 0] == w[:, 1]).all())
      True

    Args:
      ids: (n,) group ids of the records (integers, or strings), as ``group_keys`` takes them.
      n_resamples: W ≥ 1.
      seed: an int ≥ 0.

    Returns:
      (W, n) int32 multiplicities, to pass to ``sweep(..., weights=...)``: what ``sweep_parquet`` with a
      "group" column and ``bootstrap=W`` draws for the same ids.

    Raises:
      ValueError: ids as ``group_keys``; ``n_resamples`` or ``seed`` outside their domain.
    """
    if isinstance(n_resamples, bool) or not isinstance(n_resamples, (int, np.integer)) or n_resamples < 1:
        raise ValueError(f"n_resamples: expected an int ≥ 1, got {n_resamples!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed: expected an int ≥ 0, got {seed!r}")
    return _group_draws(group_keys(ids, "ids"), int(n_resamples), int(seed))


def _group_draws(keys: np.ndarray, W: int, seed: int) -> np.ndarray:
    """(W, n) Poisson(1) draws of the groups whose keys are ``keys``: a uniform from the key mixed with
    (seed, resample), then Poisson(1)'s inverse distribution."""
    # each group's draws once (a question's records share its key), then spread to its records
    keys, rows = np.unique(keys, return_inverse=True)
    rows = rows.reshape(-1)
    out = np.empty((W, len(rows)), np.int32)
    # a seed past 64 bits (``default_rng`` takes any int ≥ 0, as the record bootstrap does) folded in 64-bit
    # words, the lowest first: a seed under 2^64 is its one word
    base = _mix64(np.array([seed & 0xFFFFFFFFFFFFFFFF], np.uint64))[0]
    seed >>= 64
    while seed:
        base = _mix64(np.array([base ^ np.uint64(seed & 0xFFFFFFFFFFFFFFFF)], np.uint64))[0]
        seed >>= 64
    for w in range(W):
        salt = _mix64(np.array([base ^ np.uint64(w)], np.uint64))[0]
        u = (_mix64(keys ^ salt) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
        out[w] = np.searchsorted(_POISSON_CDF, u, side="right").astype(np.int32)[rows]
    return out


def poisson_weights(start: int, stop: int, n_resamples: int, seed: int = 0) -> np.ndarray:
    """(n_resamples, stop − start) int32 Poisson(1) bootstrap multiplicities of rows [start, stop):
    a function of (seed, resample, row) only, so any split of the rows gives the same weights."""
    for name, v in (("start", start), ("stop", stop), ("n_resamples", n_resamples)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise ValueError(f"{name}: expected an int ≥ 0, got {v!r}")
    if stop < start or n_resamples < 1:
        raise ValueError(f"expected 0 ≤ start ≤ stop and n_resamples ≥ 1, got {start}, {stop}, {n_resamples}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed: expected an int ≥ 0, got {seed!r}")
    out = np.empty((n_resamples, stop - start), np.int32)
    b0, b1 = start // POISSON_BLOCK, -(-stop // POISSON_BLOCK)
    for b in range(b0, b1):
        lo, hi = max(start, b * POISSON_BLOCK), min(stop, (b + 1) * POISSON_BLOCK)
        # One resample's row of the block at a time: the generator fills a (W, 2^16) draw in C order, so
        # W draws of (2^16,) are the same numbers without the (W, 2^16) int64 block (5 GB for W = 10^4,
        # whatever the number of rows).
        rng = np.random.default_rng([int(seed), b])
        for w in range(n_resamples):
            out[w, lo - start:hi - start] = rng.poisson(1.0, POISSON_BLOCK)[lo - b * POISSON_BLOCK:hi - b * POISSON_BLOCK]
    return out


class _PoissonBlocks:
    """``poisson_weights`` for consecutive row ranges, keeping the last block's (W, 2^16) draws: passes
    shorter than a block (many resamples under the memory bound) would otherwise draw each block once
    per pass. The same numbers as ``poisson_weights``; ``keep`` False draws every time (no cache)."""

    def __init__(self, n_resamples: int, seed: int, keep: bool):
        self.W, self.seed, self.keep = int(n_resamples), int(seed), keep
        self.block: int | None = None
        self.draws: np.ndarray | None = None

    def __call__(self, start: int, stop: int) -> np.ndarray:
        if not self.keep:
            return poisson_weights(start, stop, self.W, self.seed)
        out = np.empty((self.W, stop - start), np.int32)
        for b in range(start // POISSON_BLOCK, -(-stop // POISSON_BLOCK)):
            if self.block != b or self.draws is None:
                self.block, self.draws = b, None    # free the old block before drawing the next
                self.draws = poisson_weights(b * POISSON_BLOCK, (b + 1) * POISSON_BLOCK, self.W, self.seed)
            lo, hi = max(start, b * POISSON_BLOCK), min(stop, (b + 1) * POISSON_BLOCK)
            assert self.draws is not None
            out[:, lo - start:hi - start] = self.draws[:, lo - b * POISSON_BLOCK:hi - b * POISSON_BLOCK]
        return out


def open_parquet(path, columns: dict | None):
    """A Parquet file of records and the columns that play each role.

    Args:
      path: the file, as ``sweep_parquet``'s.
      columns: {role: column name} or None, as ``sweep_parquet``'s.

    Returns:
      (pyarrow ``ParquetFile``, {role: column name}) with every named column present.

    Raises:
      ValueError: a missing or unreadable file, a bad ``columns``, or a named column the file lacks.
      TypeError: ``path`` not a path.
      ImportError: pyarrow is not installed.
    """
    try:
        import pyarrow.parquet as pq
    except ImportError:  # pragma: no cover - pyarrow is in the [signals] extra
        raise ImportError("sweep_parquet needs pyarrow: pip install pyarrow (the signals extra has it too)") from None
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path: expected a path to a Parquet file, got {type(path).__name__}")
    p = Path(path)
    if not p.is_file():
        if p.exists():   # a folder, a FIFO, a device: there, but not a file of records
            raise ValueError(f"path: {str(path)!r} is not a regular file; expected a Parquet file")
        raise ValueError(f"path: no such file: {str(path)!r}")
    try:
        # pages written with a CRC are checked against it (free for files without): a flipped bit
        # inside a page that still decodes would otherwise move the counts with no error
        pf = pq.ParquetFile(p, page_checksum_verification=True)
    except Exception as e:  # pyarrow raises ArrowInvalid / OSError for a file that is not Parquet
        raise ValueError(f"path: {str(path)!r} is not a readable Parquet file ({e})") from None
    have = pf.schema_arrow.names
    cols = {"M": "M", "R": "R", "A": "A"}
    if "adopt" in have:
        cols["adopt"] = "adopt"
    if columns is not None:
        if not isinstance(columns, dict) or any(k not in ROLES for k in columns):
            raise ValueError(f"columns: expected a dict from roles {ROLES} to column names, got {columns!r}")
        for k in ("M", "R", "A"):
            if k in columns and columns[k] is None:   # was a KeyError further on
                raise ValueError(f"columns: role {k!r} cannot be dropped (M, R and A are required); "
                                 "map it to a column name or leave it out")
        cols.update({k: v for k, v in columns.items() if v is not None})
        for k, v in columns.items():
            if v is None:
                cols.pop(k, None)
    for role, name in cols.items():
        if name not in have:
            raise ValueError(f"columns: {str(path)!r} has no column {name!r} (for {role}); it has {have}")
    return pf, cols


def _read_batches(pf, path, group: int, **kw):
    """``pf.iter_batches`` of one row group; a page pyarrow cannot decode (corrupt compressed data, a
    broken page header: OSError or another ArrowException) is a ValueError naming the file and the row
    group, not a traceback."""
    import pyarrow as pa

    it = pf.iter_batches(row_groups=[group], **kw)
    while True:
        try:
            batch = next(it)
        except StopIteration:
            return
        except (OSError, pa.ArrowException) as e:
            raise ValueError(f"path: {str(path)!r}: row group {group} cannot be read; the file is damaged "
                             f"({type(e).__name__}: {' '.join(str(e).split())})") from None
        yield batch


def _column(batch, name: str, role: str, row0: int) -> np.ndarray:
    """One column of a record batch as NumPy, checked: ValueError naming the column and the row."""
    col = batch.column(name)
    if col.null_count:
        i = int(np.flatnonzero(np.asarray(col.is_null()))[0])
        raise ValueError(f"{name}: expected a value in every row; row {row0 + i} is null")
    x = col.to_numpy(zero_copy_only=False)
    if x.dtype.kind not in "biuf" or (x.dtype.kind == "b" and role in ("M", "R", "A")):
        # (a bool signal is refused as sweep and decide refuse it: True is no relevance)
        raise ValueError(f"{name}: expected numbers, got {col.type} (row {row0})")
    if role in ("M", "R", "A"):
        bad = ~((x >= 0) & (x <= 1))
        what = "values in [0, 1]"
    elif role == "adopt":
        bad = ~((x == 0) | (x == 1))
        what = "binary labels (0/1 or bool)"
    else:
        bad = ~(np.isfinite(x) & (x >= 0))
        what = "finite, non-negative weights"
    if np.any(bad):
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{name}: expected {what}; row {row0 + i} has {x[i].item()!r}")
    if role == "adopt":
        return x.astype(bool)
    return x.astype(np.float32) if role != "weight" else x


def row_group_share(pf, process: int, n_processes: int) -> list[int]:
    """The row groups of process ``process`` out of ``n_processes``: contiguous, about equal rows."""
    rows = np.array([pf.metadata.row_group(i).num_rows for i in range(pf.num_row_groups)], np.int64)
    start = np.concatenate([[0], np.cumsum(rows)[:-1]])
    owner = (start * n_processes) // max(int(rows.sum()), 1)
    return [i for i in range(len(rows)) if owner[i] == process]


def parquet_state(path, configs, *, columns, bootstrap, seed, record_chunk, engine, mesh_shape, progress,
                  row_groups=None, checkpoint=None):
    """``sweep_parquet``'s checks and passes over ``row_groups`` (all when None), before the sums become
    a result (the multi-process sweep adds every process's state first). A share without rows gives
    zero sums.

    Args:
      path, configs, columns, bootstrap, seed, record_chunk, engine, mesh_shape, progress: as
        ``sweep_parquet``.
      row_groups: the row groups to read (``row_group_share``), or None for all.
      checkpoint: as ``sweep_parquet``'s (only with every row group: ``row_groups`` None).

    Returns:
      (``Reducer`` state, whether there is a W axis, whether ``configs`` was a batch, whether the file
      has labels).

    Raises:
      ValueError, TypeError, ImportError: as ``sweep_parquet``.
    """
    check_pass_options(record_chunk, engine)
    engine = engine_for_mesh(engine, mesh_shape)
    if isinstance(bootstrap, bool) or not isinstance(bootstrap, (int, np.integer)) or bootstrap < 0:
        raise ValueError(f"bootstrap: expected an int ≥ 0 (Poisson resamples; 0 = none), got {bootstrap!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed: expected an int ≥ 0, got {seed!r}")
    pf, cols = open_parquet(path, columns)
    if "group" in cols and not bootstrap:
        raise ValueError(f"columns: a \"group\" column ({cols['group']!r}) groups the bootstrap's draws; "
                         "give bootstrap > 0, or leave it out")
    cfg, K, batched = as_batch(configs)
    check_batch(cfg, K)
    n_rows = [pf.metadata.row_group(i).num_rows for i in range(pf.num_row_groups)]
    if sum(n_rows) == 0:
        raise ValueError(f"path: {str(path)!r} holds no records")
    starts = np.concatenate([[0], np.cumsum(n_rows)[:-1]]).astype(np.int64)
    groups = list(range(pf.num_row_groups)) if row_groups is None else list(row_groups)
    mine = sum(n_rows[g] for g in groups)
    W = max(int(bootstrap), 1)
    # passes (and the batches read) cut to the sweep's memory bound: W resamples' weights per record,
    # and the current Poisson block's draws when they take at most a quarter of the bound
    cache = W * POISSON_BLOCK * 4 if bootstrap and "group" not in cols else 0   # (groups draw no blocks)
    keep = bool(bootstrap) and cache <= _sw.MEMORY_BOUND // 4
    record_chunk = _sw.bounded_chunk(record_chunk, K, W, "bootstrap" if bootstrap else "configs",
                                     reserved=cache if keep else 0)
    draws = _PoissonBlocks(W, seed, keep)
    _, size, shape = pass_layout(K, max(min(mine, int(record_chunk)), 1), record_chunk, mesh_shape)
    names = list(dict.fromkeys(cols.values()))
    if checkpoint is not None and row_groups is not None:   # a share's rows are not the stream's
        raise ValueError("checkpoint: a sweep of a share of the row groups keeps none (the multi-process sweep)")
    if checkpoint is not None and os.path.exists(checkpoint) and os.path.samefile(checkpoint, path):
        # read as a checkpoint, the records file failed as "not a readable sweep checkpoint; remove it"
        raise ValueError(f"checkpoint: {str(checkpoint)!r} is the Parquet file being swept (path); name "
                         "another file for the sweep's progress")
    ckpt = None
    with passes_on_mesh(shape):
        red = Reducer(cfg, K, W, size, engine)
        if checkpoint is not None:
            from mdl_jax.controller import checkpoint as _ckpt

            # the engine that runs ("auto" resolved, the kernel's ISA variant) and the versions that
            # compute: passes of another would not add up to the same bits
            options = {"columns": cols, "bootstrap": int(bootstrap), "seed": int(seed), "pass": int(size),
                       "engine": red.engine, "mesh": list(shape), **_ckpt.versions()}
            ckpt = _ckpt.Checkpoint(checkpoint, {"file": _ckpt.file_digest(path),
                                                 "configs": _ckpt.configs_digest(cfg), "options": options})
        buf: list[tuple] = []
        held = 0
        # rows of the stream added in whole passes (passes start at multiples of ``size``): where a
        # resumed sweep starts reading, and what a checkpoint records
        added = 0
        resumed = ckpt.load() if ckpt is not None else None
        if resumed is not None:
            sums, added = resumed
            if set(sums) != set(red.s) or any(sums[k].shape != red.s[k].shape for k in sums):
                raise ValueError(f"checkpoint: {str(checkpoint)!r} holds sums of another shape; remove it "
                                 "to start over")
            # a checkpoint is saved only at a pass boundary inside the file, its sums in the reducer's
            # dtypes: anything else (a file made by hand) would be added to silently, as other sums
            if any(sums[k].dtype != red.s[k].dtype for k in sums):
                raise ValueError(f"checkpoint: {str(checkpoint)!r} holds sums of other dtypes than a sweep's; "
                                 "remove it to start over")
            if added % size or added > sum(n_rows):
                raise ValueError(f"checkpoint: {str(checkpoint)!r} records progress to row {added:,}, not a "
                                 f"boundary of this sweep's passes of {size:,} rows within the file's "
                                 f"{sum(n_rows):,}; remove it to start over")
            red.s = {k: np.array(sums[k]) for k in red.s}
        last_save = time.monotonic()

        def flush(final: bool):
            nonlocal buf, held, added
            if not buf:
                return
            parts = [np.concatenate(x, axis=-1) if len(buf) > 1 else x[0] for x in zip(*buf)]
            while held >= size or (final and held):
                n = min(size, held)
                red.add(parts[0][:n], parts[1][:n], parts[2][:n], parts[3][:n], parts[4][:, :n])
                parts = [x[..., n:] for x in parts]
                held -= n
                added += n
            buf = [tuple(parts)] if held else []

        from tqdm.auto import tqdm

        skip_to = added   # rows before it are in the loaded sums (0 for a fresh sweep)
        for g in tqdm(groups, desc="sweep", unit="row group", disable=not progress):
            row = int(starts[g])
            if row + n_rows[g] <= skip_to:
                continue
            for batch in _read_batches(pf, path, g, batch_size=int(record_chunk), columns=names):
                if row + batch.num_rows <= skip_to:
                    row += batch.num_rows
                    continue
                if row < skip_to:
                    batch, row = batch.slice(skip_to - row), skip_to
                n = batch.num_rows
                M, R, A = (_column(batch, cols[k], k, row) for k in ("M", "R", "A"))
                lab = (_column(batch, cols["adopt"], "adopt", row) if "adopt" in cols
                       else np.zeros(n, bool))
                keys = group_keys(batch.column(cols["group"]), cols["group"], row) if "group" in cols else None
                w = np.ones((1, n), np.int32)
                if "weight" in cols:
                    w = _column(batch, cols["weight"], "weight", row)[None]
                if bootstrap:
                    p = draws(row, row + n) if keys is None else _group_draws(keys, W, int(seed))
                    if w.dtype.kind in "iu" and float(w.max(initial=0)) >= 2.0 ** 53:
                        # past 2^53 the product in float64 (an int64 one could wrap to negative weights);
                        # below, the int64 product is exact and float64 would give the same value, so a
                        # record's weight does not depend on the batch it is read in (a resumed sweep's
                        # batches are cut elsewhere)
                        w = w.astype(np.float64)
                    w = p * w
                buf.append((M, R, A, lab, w))
                held += n
                row += n
                if held >= size:
                    flush(False)
                    if ckpt is not None and time.monotonic() - last_save >= _ckpt.EVERY_S:
                        ckpt.save(red.state(), added)
                        last_save = time.monotonic()
        flush(True)
    return red.state(), bool(bootstrap), batched, "adopt" in cols


def sweep_parquet(path: str | os.PathLike, configs: MDLConfig, *, columns: dict | None = None,
                  bootstrap: int = 0, seed: int = 0, record_chunk: int = RECORD_CHUNK, engine: str = "jax",
                  mesh_shape: tuple[int, int] | None = None, progress: bool = False,
                  checkpoint: str | os.PathLike | None = None) -> SweepResult:
    """``sweep`` over the records of a Parquet file, streamed: memory is one pass, not N.

    Examples:
      >>> grid = config_grid(MDLConfig(), g_a=np.linspace(0, 1, 21))   # doctest: +SKIP
      >>> res = sweep_parquet("records.parquet", grid, bootstrap=10)  # your file   # doctest: +SKIP
      >>> res.accuracy.shape       # doctest: +SKIP
      (21, 10)

    Args:
      path: a Parquet file with one record per row (needs pyarrow, in the ``[signals]`` extra).
      configs: as ``sweep`` (a batch, a single config; not a list: call once per batch).
      columns: {role: column name} for roles "M", "R", "A" (default: columns of those names),
        "adopt" (binary oracle labels; default: the column "adopt" if the file has one, else no
        accuracy), "weight" (per-record weights; default none) and "group" (integer or string ids,
        a question's, say: the bootstrap draws whole groups; only with ``bootstrap``). A role mapped
        to None is dropped.
      bootstrap: W > 0 gives W Poisson(1) bootstrap resamples (module docstring), multiplied into the
        weight column if there is one; per group with a "group" column (``group_weights``); 0
        (default): the records once.
      seed: the resamples' seed (an int ≥ 0).
      record_chunk: as ``sweep``'s: records per pass.
      engine: as ``sweep``'s.
      mesh_shape: as ``sweep``'s.
      progress: a tqdm bar over row groups (off by default, like every library call here).
      checkpoint: a file to keep the sweep's progress in (``mdl_jax.controller.checkpoint``): written
        every minute or so at a pass boundary, read first, so the same call after a kill resumes
        where it left off (the same result to the bit), and removed when the sweep is done; None
        (default): none. A checkpoint of other inputs (another file content, configs or option) is
        a ValueError saying what changed, as is one whose progress row is no pass boundary within the
        file or whose sums have other dtypes (a file edited by hand), and one naming ``path`` itself.
        Costs one read of the file up front (its sha256).

    Returns:
      ``SweepResult`` as ``sweep``'s, with a W axis after K when ``bootstrap`` > 0.

    Raises:
      ValueError: naming the column and row for a missing file or column, a file that is not
        Parquet or holds no records, a null, a signal outside [0, 1], a label that is not 0/1, a
        negative or non-finite weight, a group id that is null or neither integer nor string, a
        "group" column without ``bootstrap``; a weight vector whose total is 0, or a Poisson resample
        that drew no record (naming ``bootstrap``); ``columns``, ``bootstrap``, ``seed``,
        ``record_chunk``, ``engine`` or ``mesh_shape`` outside their domains; a config of the
        batch outside its domain.
      TypeError: ``path`` not a path; ``configs`` a list or tuple, or not an ``MDLConfig``.
      ImportError: pyarrow is not installed.
    """
    result = sweep_parquet_kept(path, configs, columns=columns, bootstrap=bootstrap, seed=seed,
                                record_chunk=record_chunk, engine=engine, mesh_shape=mesh_shape,
                                progress=progress, checkpoint=checkpoint)
    if checkpoint is not None:
        from mdl_jax.controller.checkpoint import remove

        remove(checkpoint)
    return result


def sweep_parquet_kept(path, configs, *, columns, bootstrap, seed, record_chunk, engine, mesh_shape, progress,
                       checkpoint) -> SweepResult:
    """``sweep_parquet`` that leaves its checkpoint in place: for a caller that has more to do before
    the progress may go (``mdl-jax sweep`` writes its CSV first, then removes it). Arguments, result
    and errors as ``sweep_parquet``'s."""
    if isinstance(configs, (list, tuple)):
        raise TypeError("configs: expected one MDLConfig batch; call sweep_parquet once per batch")
    state, w2d, batched, has_adopt = parquet_state(
        path, configs, columns=columns, bootstrap=bootstrap, seed=seed, record_chunk=record_chunk,
        engine=engine, mesh_shape=mesh_shape, progress=progress, checkpoint=checkpoint)
    check_resamples(state, bootstrap, columns)
    return finish(state, has_adopt=has_adopt, w2d=w2d, batched=batched)


def check_resamples(state: dict, bootstrap: int, columns: dict | None) -> None:
    """ValueError naming ``bootstrap`` when a Poisson resample drew no record at all.

    Without a weight column a zero total can only be such a resample (each is empty with probability
    e^-N for N records, so likely for a tiny file): the generic "weight" error of ``finish`` would
    name a column the caller never gave."""
    empty = np.flatnonzero(state["wsum"] <= 0)
    if bootstrap and len(empty) and not (columns or {}).get("weight"):
        # a group column draws its groups: more records of the same groups would not help
        group = (columns or {}).get("group")
        what = (f"N groups (distinct ids of {group!r})): use more groups or fewer resamples" if group
                else "N records): use more records or fewer resamples")
        raise ValueError(f"bootstrap: {len(empty)} of {int(bootstrap)} Poisson resamples drew no record "
                         f"(resample {int(empty[0])} first; each is empty with probability e^-N for {what}")


def finish(state: dict, *, has_adopt: bool, w2d: bool, batched: bool) -> SweepResult:
    """A SweepResult from (summed) reducer states; ValueError when a weight vector's total is 0."""
    if np.any(state["wsum"] <= 0):
        raise ValueError("weight: every weight vector needs a positive total; "
                         f"totals {state['total'].tolist()}")
    if not np.all(np.isfinite(state["total"])):
        raise ValueError("weight: the weights' total overflows float64 (as sweep's weights: a vector's "
                         "total must be finite); scale the weight column down")
    return result_from_state(state, has_adopt=has_adopt, w2d=w2d, batched=batched)
