"""Signals M, R, φ for query + memory stores (paper Section 3.2): ``memory_signals``, and its engines.

The formulas and their one batched JAX pass are ``jax_pass``'s (re-exported here). A comes from
``risk``. This is the one implementation behind both the benchmark pipeline
(``mdl_repro.pipeline.store_signals``) and the memory gate (``mdl_jax.gate``): both call
``memory_signals``, which embeds every query and unique memory text once, pads the stores to the
largest size S and masks them; the lexical flags are computed once per store (S(S-1)/2 pairs) in
Python and enter the JAX pass as a (B, S, S) boolean array.

``memory_signals`` takes ``engine=``, as the controller's functions do:
  "jax"     (the default) every store through that one JAX pass; no compiled library is built or imported.
  "native"  a store of at most ``SMALL_MEMORIES`` memories aggregated in NumPy (``small_signals``: the
            stores of one size stacked, the formulas of ``aggregate_small``) with the dot products in
            C++ (``dots_native``) and, for calls of more than RECENT_CALL stores, the default detector's
            flags too (``conflict_native``: the same flags);
            wider stores through the JAX pass. An error where those libraries cannot be built here.
  "auto"    the small-store path of "native", with NumPy's products and the Python detector where the
            C++ parts cannot be built (warned once): what the gate, its framework components and the
            gateway ask for, whose calls of one query the JAX pass's dispatch and padding would dominate.
The small-store path follows the row's own size, never the call's, so batching never changes a row's
bits (under "jax" the call's padded shapes change how XLA vectorises the sums: a row's last bits can
depend on its neighbours, as with ``decide``'s default); it agrees with the JAX pass to ≤ 1e-6 but where
a cosine lies within float32 rounding of the relevance threshold, and clips M at 0 as it does.
"""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from mdl_jax.controller.validation import zero_d_number
from mdl_jax.signals.conflict import (
    analyse,
    analyses_conflict,
    checked_conflict,
    pair_flags,
    recent_analysis,
)

# The JAX pass, the default engine and the definition the small-store path is tested against; its names
# are re-exported here, where callers have always found them.
from mdl_jax.signals.jax_pass import RELEVANCE_THRESHOLD as RELEVANCE_THRESHOLD
from mdl_jax.signals.jax_pass import StoreArrays as StoreArrays
from mdl_jax.signals.jax_pass import aggregate as aggregate
from mdl_jax.signals.jax_pass import aggregate_one as aggregate_one
from mdl_jax.signals.jax_pass import store_arrays as store_arrays

ENGINES = ("jax", "native", "auto")  # memory_signals' engines (module docstring)
# How far a row's squared norm may stray from 1 (float32 rounding of a normalised row, a bf16 or int8
# model's output normalised in float32, stays far inside it).
UNIT_NORM_TOLERANCE = 1e-3


@functools.cache
def _native():
    """The C++ parts of the small-store path, (``dots_native``, ``conflict_native``), imported on the
    first call that may use them: the default engine imports no compiled library."""
    from mdl_jax.signals import conflict_native, dots_native

    return dots_native, conflict_native


def native_why_not() -> str | None:
    """Why ``memory_signals(..., engine="native")`` cannot run here (its C++ dot products or detector
    cannot be built or loaded), else None."""
    from mdl_jax.engines.toolchain import ENV_SWITCH, enabled

    if not enabled():
        return f"{ENV_SWITCH}=0 switches it off"
    for lib, what in zip(_native(), ("dot products", "conflict detector")):
        if not lib.available(warn=False):
            return f"the native {what} could not be built or loaded ({lib.status().get('error', 'unknown error')})"
    return None



# Under "native" and "auto", a store of at most SMALL_MEMORIES memories is aggregated in NumPy by
# ``small_signals``, whatever the call's size (a path whose bits followed the call's size would make a
# row's last bit depend on its batch neighbours: tests/test_ray_data.py; ``small_signals``' own two paths
# give the same bits). For one query (a framework component, the gateway) JAX's dispatch, the
# padding to 16 rows and the transfers back cost several times the arithmetic itself. The two paths
# agree to ≤ 1e-6 (one float32 ulp in the tests: tests/test_aggregation.py); they can count a memory as
# relevant differently only when its cosine lies within float32 rounding (~1e-7) of the threshold.
SMALL_BATCH = 8  # (kept for callers; the path no longer depends on it)
SMALL_MEMORIES = 64


@functools.lru_cache(maxsize=SMALL_MEMORIES)
def _upper(n: int) -> np.ndarray:
    """(n, n) boolean mask of the pairs i < j (read-only: shared between calls)."""
    m = np.triu(np.ones((n, n), bool), 1)
    m.flags.writeable = False
    return m


def aggregate_small(q: np.ndarray, mem: np.ndarray,
                    flags: npt.ArrayLike | Callable[[np.ndarray], npt.ArrayLike] | None,
                    threshold: float = RELEVANCE_THRESHOLD) -> tuple[np.float32, np.float32, np.float32, int]:
    """``aggregate_one`` in NumPy, unpadded: M, R, φ, n_relevant for one store.

    The reference ``small_signals`` (the path the package runs) is tested against, bit for bit; the
    package itself no longer calls it.

    Args:
      q: (d,) query embedding.
      mem: (S, d) memory embeddings, S ≥ 0.
      flags: the (S, S) lexical conflict flags (None when S = 0), or a function of the relevant
        memories' indices (n,) → their (n, n) flags, called only when n ≥ 2 (for a pairwise detector,
        whose flag for a pair depends on those two texts alone, this gives the same φ).
      threshold: the relevance threshold on cos(e_q, e_m).

    Returns:
      (M, R, φ) as float32 values and n_relevant as an int. Dot products in float64, rounded to
      float32 once (the JAX path's float32 sums land within an ulp of them).
    """
    if not len(mem):
        return np.float32(0.0), np.float32(0.5), np.float32(0.0), 0
    native = _native_dots(q, mem)
    if native:  # the products every path of this process takes (dots_native): the same bits
        cos64, pairs64 = _native()[0].step_dots(mem, np.arange(len(mem))[None], np.asarray(q)[None])
        cos32 = cos64[0].astype(np.float32)
    else:
        mem64 = np.asarray(mem, np.float64)
        cos32 = (mem64 @ np.asarray(q, np.float64)).astype(np.float32)  # the relevance test in float32
    M = np.float32(min(max(float(cos32.max()), 0.0), 1.0) + 0.0)  # + 0.0: never -0.0
    r = np.flatnonzero(cos32 > np.float32(threshold))
    n_rel = len(r)
    if n_rel < 2:
        return M, np.float32(0.5), np.float32(0.0), n_rel
    upper = _upper(n_rel)
    n_pairs = n_rel * (n_rel - 1) // 2
    if native:  # the relevant pairs i < j, row-major: the upper triangle of the relevant submatrix
        rel = cos32 > np.float32(threshold)
        iu, ju = _pairs(len(mem))
        s_bar = np.float32(pairs64[0][rel[iu] & rel[ju]].sum() / n_pairs)
    else:
        sub = mem64[r]
        s_bar = np.float32((sub @ sub.T)[upper].sum() / n_pairs)
    fl = np.asarray(flags(r), bool) if callable(flags) else np.asarray(flags, bool)[r[:, None], r]
    phi = np.float32(np.count_nonzero(fl[upper])) / np.float32(n_pairs)
    R = np.clip(s_bar * (np.float32(1.0) - phi) ** 2, np.float32(0.0), np.float32(1.0)) + np.float32(0.0)
    return M, np.float32(R), np.float32(phi), n_rel


# Rows of one NumPy step of ``small_signals``: its (rows, S, d) float64 memory vectors stay under ~2 MB
# whatever S (≤ SMALL_MEMORIES) is. At ~16 MB (2^21 elements, before) each step's arrays were fresh
# pages from the system, faulted in and then read again from memory by each of the step's products,
# which made the cached gate's aggregation measurably slower than at 2 MB, which stays in the heap and
# in cache; 1 MB or 0.5 MB is no faster (the steps' fixed NumPy costs grow; bench_gate). Same bits.
SMALL_STEP_ELEMENTS = 1 << 18
RECENT_CALL = 64  # calls of at most this many queries keep analyses across calls (conflict.ANALYSES_KEPT)


_ARANGE = np.arange(SMALL_MEMORIES, dtype=np.int64)


def _native_dots(q: np.ndarray, mem: np.ndarray) -> bool:
    """Do the native products (``dots_native``) run for these arrays? Where the library is loaded and
    both are float32, the gate's and the pipeline's case: every path asks this, so a row's products are
    the same whichever path its call took. Other dtypes (a float64 caller of ``aggregate_small``) keep
    NumPy's, which read them unrounded."""
    return (isinstance(q, np.ndarray) and isinstance(mem, np.ndarray) and q.dtype == np.float32
            and mem.dtype == np.float32 and _native()[0].available())


@functools.lru_cache(maxsize=SMALL_MEMORIES + 1)
def _pairs(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The (i, j) index arrays of the pairs i < j of n items, row-major (read-only: shared)."""
    iu, ju = np.triu_indices(n, 1)
    iu.flags.writeable = ju.flags.writeable = False
    return iu, ju


def _small_row(q: np.ndarray, mem: np.ndarray, texts: Sequence[str], conflict, thr: np.float32,
               analyses: dict) -> tuple[float, float, float, int]:
    """``small_signals`` for one store of S ≥ 1 memories, with the same NumPy calls on (S, ·) arrays in
    place of their (n, S, ·) stacks (each stacked matmul runs these very 2-D products slice by slice, and
    each row sum is a sum over the row's own P pairs), so the same bits; without the stacking and
    scattering, whose fixed cost dominates a call of one query (a framework component's, the gateway's)."""
    S = len(texts)
    native = _native_dots(q, mem)
    if native:
        cos64, pairs64 = _native()[0].step_dots(mem, _ARANGE[:S][None], q[None])
        cos32 = cos64[0].astype(np.float32)
    else:
        mem64 = mem.astype(np.float64)
        cos32 = np.matmul(mem64, q.astype(np.float64)[:, None])[:, 0].astype(np.float32)
    # exact: a float32 clipped to [0, 1]; + 0.0 turns a -0.0 into +0.0, as in the stacked path (and the
    # reference), so a row's bytes never depend on which path its call took
    M = min(max(float(cos32.max()), 0.0), 1.0) + 0.0
    rel = (cos32 > thr).tolist()
    n_rel = sum(rel)
    if n_rel < 2:
        return M, 0.5, 0.0, n_rel
    iu, ju = _pairs(S)
    rel_a = np.asarray(rel)
    sims = np.where(rel_a[iu] & rel_a[ju], pairs64[0] if native else np.matmul(mem64, mem64.T)[iu, ju], 0.0)
    n_pairs = n_rel * (n_rel - 1) // 2
    s_bar = np.float32(sims.sum() / n_pairs)
    keep = [j for j in range(S) if rel[j]]
    phi = np.float32(_flagged(texts, keep, S, conflict, analyses, True)) / np.float32(n_pairs)
    w = np.float32(1.0) - phi
    R = min(max(float(s_bar * (w * w)), 0.0), 1.0) + 0.0  # float32 products, clipped exactly; no -0.0
    return M, R, float(phi), n_rel


def _flagged(texts: Sequence[str], keep: list[int], S: int, conflict, analyses: dict, recent: bool) -> int:
    """How many pairs of the memories ``keep`` (indices into ``texts``) the detector flags."""
    if conflict is pair_flags:
        an = []
        for j in keep:
            t = texts[j]
            x = analyses.get(t)
            if x is None:
                x = analyses[t] = recent_analysis(t) if recent else analyse(t)
            an.append(x)
        return sum(analyses_conflict(an[i], an[j]) for i in range(len(an)) for j in range(i + 1, len(an)))
    fl = np.asarray(conflict(list(texts)), bool).reshape(S, S)
    return int(np.count_nonzero(fl[np.ix_(keep, keep)][np.triu_indices(len(keep), 1)]))


ROW_BY_ROW = 4  # calls of at most this many stores take ``_small_row`` per store (the same bits)


def small_signals(q_emb: np.ndarray, stores: Sequence[Sequence[str]], U: np.ndarray,
                  index: Mapping[str, int], conflict: Callable[[list[str]], npt.ArrayLike] = pair_flags,
                  threshold: float = RELEVANCE_THRESHOLD) -> dict[str, np.ndarray]:
    """``aggregate_small`` for many stores at once: stores of one size S are stacked and their dot
    products, relevance tests and pair sums done as whole-array NumPy operations; the lexical flags of
    each store's relevant memories are counted per store: for a call of more than RECENT_CALL stores with
    the default detector, a step's stores in one call of the native detector (``conflict_native``, the
    same flags; the Python one where it is unavailable), else in Python.

    Batch-invariant by construction: the dot products are float64 matmuls, which NumPy runs as one
    BLAS call per row's own (S, d) slice (the same shape and strides whatever the stack), rounded to
    float32 once as in ``aggregate_small``, and every other reduction runs along a row's own axis, so a
    row's bits do not depend on which rows share its call or its step; calls of at most ``ROW_BY_ROW``
    stores run the same products on 2-D arrays (``_small_row``). tests/test_aggregation.py checks a row
    alone against the row in a call, and both against ``aggregate_small``, bit for bit.

    Args:
      q_emb: (B, d) query embeddings.
      stores: B lists of memory texts, each of at most ``SMALL_MEMORIES``.
      U: (n, d) embeddings of the unique memory texts; ``index`` maps a text to its row of ``U``.
      conflict: the lexical detector (``pair_flags``, the default, is called on the relevant memories
        only, each text analysed once per call; any other is called on the whole store).
      threshold: the relevance threshold on cos(e_q, e_m).

    Returns:
      {"M", "R", "phi": (B,) float32, "n_relevant": (B,) int32}.
    """
    B = len(stores)
    out = {"M": np.zeros(B, np.float32), "R": np.full(B, 0.5, np.float32),
           "phi": np.zeros(B, np.float32), "n_relevant": np.zeros(B, np.int32)}
    if not B:
        return out
    sizes = [len(x) for x in stores]
    d = U.shape[1]
    thr = np.float32(threshold)
    zero, one = np.float32(0.0), np.float32(1.0)
    # A few queries (a framework component, the gateway: retrievers return the same documents again)
    # reuse the analyses of recently seen texts; a bulk call keeps its own (most texts are new: an LRU
    # costs more than it saves there, see conflict.analyse). The analyses are the same either way.
    recent = B <= RECENT_CALL
    # A text in several stores of one step is analysed once. A bulk call clears this every step: its
    # analyses (tuples of sets, which the garbage collector traverses) kept for a whole call of 4,096
    # stores made every full collection slower, and the call slower per row than one of 1,000.
    analyses: dict[str, tuple] = {}
    if B <= ROW_BY_ROW:
        for b, texts in enumerate(stores):
            if texts:
                (out["M"][b], out["R"][b], out["phi"][b],
                 out["n_relevant"][b]) = _small_row(q_emb[b], U[[index[t] for t in texts]], texts, conflict,
                                                    thr, analyses)
        return out
    native = _native_dots(q_emb, U)
    distinct = set(sizes)
    sizes_a = np.asarray(sizes) if len(distinct) > 1 else None
    for S in sorted(distinct):
        if S == 0:
            continue  # M = 0, R = 0.5, φ = 0, n = 0
        # one size (the common case): steps are slices, not index arrays
        rows_S = None if sizes_a is None else np.flatnonzero(sizes_a == S)
        n_S = B if rows_S is None else len(rows_S)
        iu, ju = _pairs(S)
        # A step's arrays: with NumPy's products, its (rows, S, d) float64 copies (see SMALL_STEP_ELEMENTS);
        # with the native products and detector, only (rows, S) and (rows, S²) ones, so a step holds d
        # times the rows and its fixed costs (dozens of NumPy calls, one detector call) are spread over
        # them. A row's bits never depend on its step.
        wide = native and not recent and conflict is pair_flags and _native()[1].available()
        step = max(1, SMALL_STEP_ELEMENTS // (S * (S if wide else max(S, d))))
        for a in range(0, n_S, step):
            if not recent:
                analyses.clear()
            rows: slice | np.ndarray
            if rows_S is None:
                rows, rows_l = slice(a, min(a + step, B)), range(a, min(a + step, B))
            else:
                rows = rows_S[a:a + step]
                rows_l = rows.tolist()
            flat = list(itertools.chain.from_iterable(stores[b] for b in rows_l))  # the step's texts
            idx = np.fromiter(map(index.__getitem__, flat), np.intp, len(flat)).reshape(len(rows_l), S)
            if native:  # the products read U by index: no (n, S, d) copies
                cos64, pairs64 = _native()[0].step_dots(U, idx, q_emb[rows])
                cos32 = cos64.astype(np.float32)
            else:
                mem = U[idx].astype(np.float64)  # (n, S, d)
                cos32 = np.matmul(mem, q_emb[rows].astype(np.float64)[:, :, None])[:, :, 0].astype(np.float32)
            out["M"][rows] = np.maximum(np.minimum(cos32.max(1), one), zero) + zero  # clip to [0, 1], no -0.0
            rel = cos32 > thr
            n_rel = rel.sum(1)
            out["n_relevant"][rows] = n_rel
            ok = n_rel >= 2
            many: range | np.ndarray
            if ok.all():  # every row has pairs: no gathers
                many, rel_m, nr = range(len(rows_l)), rel, n_rel
                pairs_m = pairs64 if native else np.matmul(mem, mem.transpose(0, 2, 1))[:, iu, ju]
            else:
                many = np.flatnonzero(ok)
                if not len(many):
                    continue
                rel_m, nr = rel[many], n_rel[many]
                pairs_m = pairs64[many] if native else np.matmul(mem[many], mem[many].transpose(0, 2, 1))[:, iu, ju]
            pair = rel_m[:, iu] & rel_m[:, ju]  # (m, P): both memories relevant, i < j in row-major order
            sims = np.where(pair, pairs_m, 0.0)
            n_pairs = nr * (nr - 1) // 2
            s_bar = (sims.sum(1) / n_pairs).astype(np.float32)
            many_l: list[int] = list(many) if isinstance(many, range) else many.tolist()
            flagged: npt.ArrayLike
            if conflict is pair_flags and not recent and _native()[1].available():
                # every relevant memory of the step's rows, row after row: one native call
                kept = list(itertools.compress(
                    flat if isinstance(many, range) else itertools.chain.from_iterable(stores[rows_l[k]] for k in many_l),
                    rel_m.ravel().tolist()))
                flagged = _native()[1].group_counts(kept, nr)
            else:
                flagged = [_flagged(stores[rows_l[k]], [j for j in range(S) if v[j]], S, conflict, analyses,
                                    recent) for k, v in zip(many_l, rel_m.tolist())]
            phi = np.asarray(flagged, np.float32) / n_pairs.astype(np.float32)
            w = one - phi
            R = np.maximum(np.minimum(s_bar * (w * w), one), zero) + zero  # clip to [0, 1], no -0.0
            if isinstance(many, range):
                out["R"][rows], out["phi"][rows] = R, phi
            else:
                target = many + a if rows_S is None else rows_S[a:a + step][many]
                out["R"][target], out["phi"][target] = R, phi
    return out


def _bucket(n: int, cap: int) -> int:
    """Rows a chunk of n stores is padded to: a power of two (≥ 16), at most ``cap`` — a stream of
    chunks compiles the aggregation for a handful of shapes, not one per chunk length."""
    return min(max(cap, n), max(16, 1 << (n - 1).bit_length()))


# Stores per aggregation step. Each step's arrays (the (batch, S, d) memory vectors, JAX's copy, the
# pass's temporaries) are freed before the next; at 4,096 stores of five 384-d memories they were
# ~32 MB apiece, just under glibc's 32 MB ceiling for returning blocks straight to the system, so
# they went to the heap, which kept ~30 MB more every few dozen steps of a long stream (peak RSS
# 502 → 550 MB over 10^6 queries). At 1,024 the blocks are 8 MB, the heap reuses them (502 → 502
# MB), the results are bit-identical and the pass is no slower (bench_signals).
BATCH = 1024

# The bounds on one row's pairwise work (the (rows, S, S) flags and similarities grow as S²):
#   MAX_MEMORIES  memories per store; more is a ValueError naming the store (the gate's CLI: a bad
#                 row, skipped under --on-bad-row skip). 1,000 memories are 10^6 pairs: ~0.5 M calls
#                 of the lexical detector (about a second) and ~4 MB per (S, S) float32 array.
#   PAIR_BUDGET   rows × S × S elements of one aggregation step (~4.2 M: some 60-80 MB for the flags,
#                 JAX's copy and the pass's S×S temporaries). A step of ``batch`` stores that would
#                 pass it is split into steps of stores of like size, each padded to its own S, so
#                 one wide store no longer pads the 15+ small stores of its step to its width.
MAX_MEMORIES = 1000
PAIR_BUDGET = 1 << 22
assert MAX_MEMORIES * MAX_MEMORIES <= PAIR_BUDGET  # the widest store fits one step alone


def _steps(sizes: Sequence[int], cap: int) -> list[tuple[np.ndarray, int]]:
    # (store indices, rows padded to) per aggregation step of one ``batch`` of stores: the whole
    # batch in order when its padded (rows, S, S) arrays fit PAIR_BUDGET (the common case, and the
    # shapes as before), else stores sorted by size, grouped while they fit.
    n = len(sizes)
    S = max(1, max(sizes, default=0))
    if _bucket(n, cap) * S * S <= PAIR_BUDGET:
        return [(np.arange(n), _bucket(n, cap))]
    order = np.argsort(np.asarray(sizes), kind="stable")
    steps: list[list[int]] = []
    group: list[int] = []
    for j in order:
        S = max(1, sizes[j])
        if group and (len(group) + 1) * S * S > PAIR_BUDGET:
            steps.append(group)
            group = []
        group.append(int(j))
    steps.append(group)
    out = []
    for g in steps:  # rows padded to a power of two where that stays within the budget
        S = max(1, max(sizes[j] for j in g))
        out.append((np.asarray(g), max(len(g), min(1 << (len(g) - 1).bit_length(), PAIR_BUDGET // (S * S)))))
    return out


def _checked_texts(queries: Any, stores: Any) -> tuple[list[str], list[Sequence[str]]]:
    """(queries, stores) as lists, each query a string and each store a list of strings; else a
    ValueError naming the argument and the item (a store given as one string would otherwise be read
    as a store of its characters)."""
    out = []
    for name, seq in (("queries", queries), ("stores", stores)):
        if isinstance(seq, (str, bytes, Mapping)):
            raise ValueError(f"{name}: expected a list, got {type(seq).__name__}")
        try:
            out.append(seq if type(seq) is list else list(seq))
        except TypeError:
            raise ValueError(f"{name}: expected a list, got {type(seq).__name__}") from None
    qs, ss = out
    if not all(type(q) is str for q in qs):
        for b, q in enumerate(qs):
            if not isinstance(q, str):
                raise ValueError(f"queries[{b}]: expected a string, got {type(q).__name__}")
    # the gate's case (lists of strings) in one pass without the ABC checks below
    if not all(type(s) is list and all(type(m) is str for m in s) for s in ss):
        for b, s in enumerate(ss):
            if isinstance(s, (str, bytes, Mapping)) or not isinstance(s, Sequence):
                raise ValueError(f"stores[{b}]: expected a list of memory texts, got {type(s).__name__}")
            for j, m in enumerate(s):
                if not isinstance(m, str):
                    raise ValueError(f"stores[{b}][{j}]: expected a memory text (a string), got {type(m).__name__}")
    return qs, ss


def memory_signals(queries: Sequence[str], stores: Sequence[Sequence[str]], embedder, *,
                   conflict: Callable[[list[str]], npt.ArrayLike] = pair_flags,
                   threshold: float = RELEVANCE_THRESHOLD, batch: int = BATCH,
                   progress: bool = False, timings: dict | None = None,
                   engine: str = "jax", validate: bool = True) -> dict[str, np.ndarray]:
    """M, R, φ and the number of relevant memories for B (query, memory texts) pairs.

    Every query and every unique memory text is embedded once (the embedder batches and caches); stores
    are aggregated ``batch`` at a time so padding memory stays bounded (see ``BATCH``).

    Args:
      queries: B query strings.
      stores: B lists of memory texts (a list may be empty), each of at most ``MAX_MEMORIES``.
      embedder: an object with ``embed(texts, desc=...)`` → (N, d) unit-norm float32 vectors
        (``Embedder``).
      conflict: the lexical detector, texts → their (S, S) contradiction flags (``pair_flags``).
      threshold: the relevance threshold on cos(e_q, e_m).
      batch: stores aggregated per step.
      progress: show a progress bar over the steps.
      timings: if given, accumulates seconds under "embedding", "conflict" (the lexical flags and the
        padding) and "aggregation" (the JAX pass; on the small-store path its flags too).
      engine: "jax" (the default), "native" or "auto" (the module docstring): under the last two a
        store of at most ``SMALL_MEMORIES`` memories takes the NumPy path (``small_signals``) in a call
        of any size.
      validate: check the texts; ``False`` for a caller that checked them already (the gate): the
        texts must then be a list of lists of strings. The vectors' values are checked either way
        (a NaN or infinite one is an error naming the embedder).

    Returns:
      {"M", "R", "phi": (B,) float32, "n_relevant": (B,) int32}.

    Raises:
      ValueError: an unknown engine, a ``batch`` below 1, a ``threshold`` outside [-1, 1] (NaN), or "native" where its C++ parts cannot be built or loaded here
        (saying why); a query that is no string, a store that is no list of strings (one string, say)
        or of more than ``MAX_MEMORIES`` memories, B queries with another number of stores, an embedder
        without ``embed``, vectors of another shape than (N, d), not finite, or rows that are not
        unit-norm (a squared norm off 1 by more than ``UNIT_NORM_TOLERANCE``), a ``conflict`` detector
        whose output is no S×S matrix of booleans or 0/1 — each naming the argument.
    """
    if engine not in ENGINES:
        raise ValueError(f"engine: expected one of {ENGINES}, got {engine!r}")
    if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 1:
        raise ValueError(f"batch: expected an int ≥ 1, got {batch!r}")
    threshold = zero_d_number(threshold)   # a 0-d NumPy or JAX number (jnp.float32(0.3)) is one cosine
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float, np.integer, np.floating)) \
            or not -1.0 <= threshold <= 1.0:  # NaN too: no memory would ever be relevant, silently
        raise ValueError(f"threshold: expected a cosine in [-1, 1], got {threshold!r}")
    if validate:
        queries, stores = _checked_texts(queries, stores)
    if conflict is not pair_flags:   # a user's detector: its flags checked (a NaN or 0.3 read as flagged)
        conflict = checked_conflict(conflict)
    if not callable(getattr(embedder, "embed", None)):
        raise ValueError(f"embedder: expected an object with embed(texts, desc=...) → (N, d) unit-norm "
                         f"vectors (e.g. mdl_jax.signals.embeddings.Embedder()), got {type(embedder).__name__}")
    if engine == "native":
        why = native_why_not()
        if why is not None:
            raise ValueError(f"engine='native' cannot run here: {why}")
    if len(queries) != len(stores):
        raise ValueError(f"stores: expected one memory list per query ({len(queries)}), "
                         f"got {len(stores)}")
    B = len(queries)
    for b, s in enumerate(stores):
        if len(s) > MAX_MEMORIES:
            raise ValueError(f"stores[{b}]: expected at most {MAX_MEMORIES:,} memories (MAX_MEMORIES: "
                             f"the pairwise work grows as their square), got {len(s):,}")
    out = {"M": np.zeros(B, np.float32), "R": np.zeros(B, np.float32),
           "phi": np.zeros(B, np.float32), "n_relevant": np.zeros(B, np.int32)}
    if not B:
        return out
    t = timings if timings is not None else {}
    t0 = time.perf_counter()
    texts = list(dict.fromkeys(itertools.chain.from_iterable(stores)))  # unique, in order (C-level loop)
    # queries and memories in one call: one encoder pass and one cache round trip, not two (for a
    # single request, the gateway's case, that is most of the embedding's fixed cost)
    got = embedder.embed(list(queries) + texts, desc="embedding texts")
    try:
        vecs = np.asarray(got, np.float32)
    except (TypeError, ValueError) as e:  # ragged rows, strings: NumPy's words would not name the embedder
        raise ValueError(f"embedder: expected an (N, d) array of numbers ({e})") from None
    if vecs.ndim != 2 or vecs.shape[0] != B + len(texts) or vecs.shape[1] < 1:
        raise ValueError(f"embedder: expected an (N, d) array for N = {B + len(texts)} texts, got shape "
                         f"{vecs.shape}")
    # Always checked: dot products are cosines only between unit rows (others read as M, R beyond
    # [0, 1], clipped), and a NaN or ±inf anywhere, which reads as M = NaN or 1, makes its row's squared
    # norm NaN or inf, failing the same test. A short call's few norms are compared in Python (the
    # gate's one-row calls; NaN fails a comparison either way).
    norms = np.einsum("ij,ij->i", vecs, vecs)
    lo, hi = 1.0 - UNIT_NORM_TOLERANCE, 1.0 + UNIT_NORM_TOLERANCE
    if not (all(lo <= x <= hi for x in norms.tolist()) if len(norms) <= 64 else
            bool(lo <= norms.min()) and bool(norms.max() <= hi)):
        if not np.isfinite(vecs).all():
            raise ValueError("embedder: returned values that are NaN or infinite (as float32)")
        row = int(np.argmax(np.abs(norms - 1.0) > UNIT_NORM_TOLERANCE))
        raise ValueError(f"embedder: expected unit-norm rows, got a row {row} of norm {float(np.sqrt(norms[row])):.4g} "
                         "(normalise the rows, or give the gate a callable, whose rows it normalises)")
    q_emb = vecs[:B]
    if texts:
        t_emb = (vecs[B:], {x: i for i, x in enumerate(texts)})
    else:
        t_emb = (np.zeros((1, q_emb.shape[1]), np.float32), {})
    t1 = time.perf_counter()
    t["embedding"] = t.get("embedding", 0.0) + t1 - t0
    small = [engine != "jax" and len(s) <= SMALL_MEMORIES for s in stores]
    if not all(small) and any(small):
        # Which path a row takes depends on the row alone (its own number of memories), never on
        # its neighbours in the call: so a row's signals are the same bits whatever it is batched
        # with (the gate's and MemoryGateBatch's promise). A mixed call is split in two.
        out_idx = [np.flatnonzero(np.asarray(small) == k) for k in (True, False)]
        for idx in out_idx:
            picked = idx.tolist()
            part = memory_signals([queries[i] for i in picked], [stores[i] for i in picked], embedder,
                                  conflict=conflict, threshold=threshold, batch=batch, progress=progress,
                                  timings=timings, engine=engine, validate=False)
            for k in out:
                out[k][idx] = part[k]
        return out
    if all(small):
        t0 = time.perf_counter()
        out = small_signals(q_emb, stores, *t_emb, conflict=conflict, threshold=threshold)
        t["conflict"] = t.get("conflict", 0.0)  # the flags are inside the NumPy pass: counted below
        t["aggregation"] = t.get("aggregation", 0.0) + time.perf_counter() - t0
        return out
    from tqdm.auto import tqdm

    # a disabled bar still costs more to build than a one-query call's work (the gateway's, a
    # framework component's), so such a call skips it
    steps = tqdm(range(0, B, batch), desc="aggregating signals") if progress else range(0, B, batch)
    for i in steps:
        n = min(batch, B - i)
        for js, rows in _steps([len(s) for s in stores[i:i + n]], batch):
            t0 = time.perf_counter()
            m = len(js)
            arr = store_arrays([stores[i + j] for j in js], q_emb[i + js], t_emb, conflict=conflict,
                               pad_to=rows, threshold=threshold)
            t1 = time.perf_counter()
            res = aggregate(arr.q, arr.mem, arr.mask, arr.flags, threshold)
            for k, x in zip(("M", "R", "phi", "n_relevant"), res):
                out[k][i + js] = np.asarray(x)[:m]
            t["conflict"] = t.get("conflict", 0.0) + t1 - t0
            t["aggregation"] = t.get("aggregation", 0.0) + time.perf_counter() - t1
    return out
