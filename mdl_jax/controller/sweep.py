"""The sweep engine: every config of a grid × every record, reduced per config in one compiled program.

    configs = config_grid(MDLConfig(), g_a=np.linspace(0, 1, 21), g_b=np.linspace(0, 1, 21))   # K = 441
    res = sweep(M, R, A, configs, adopt=adopt, weights=bootstrap_weights(len(M), 10, seed=0))
    res.accuracy.reshape(21, 21, 10)          # binary decision accuracy per config and resample

A *batch of configs* is an ``MDLConfig`` whose numeric leaves all carry a leading axis K (built by
``config_grid`` or ``stack_configs``); its static fields (dims, QR seed, the five ablations) are
shared. Different ablations are different programs, so ``sweep`` takes a short list of batches for
them and runs one compiled program per entry; numeric fields are never a Python loop.

What a sweep returns is what sweeps need, per config (and per weight vector): binary decision accuracy
against oracle labels (adopt ⇔ ACTIVE; Supp, Silent and Opt-Out count as reject, paper Section 5.3),
weighted action counts and the weighted mean of C_final. It never materialises a (K, N) Decision.

Bootstrap resamples are per-record multiplicity weights (``bootstrap_weights``): a record's decision
does not depend on how often it was drawn, so each (config, record) decision is computed once and
every resample is one weighted sum over it. That is exact (tests check it against explicit
resampling) and makes W resamples cost one pass plus W dot products instead of W passes.

Exact sums. Integer weights (none, or bootstrap multiplicities) with totals < 2^31 are summed as int32
on the device and int64 on the host, so counts and accuracy are exact at any N (float32 sums stop
counting exactly at 2^24). Other weights are scaled per vector by a power of two (exact, and no float32
overflow of finite weights) and summed in float32 within a pass, float64 across passes. Results are
float64 NumPy arrays.

Record passes. The records are walked on the host in equal passes of at most ``record_chunk``
(2^18 by default; the last padded with weight-0 records), each one call of the compiled program, and
the passes' sums are added on the host: memory is bounded by a pass, so N = 5×10^7 sweeps, and the
result equals the unchunked one (integer sums exactly).

How it runs. One jitted program per pass: configs are padded to whole chunks and ``lax.map`` walks the chunks;
inside a chunk, the one-record functions of ``decision`` are vmapped over records and then over
configs, and the per-config reductions are matmuls against the (W, N) weights. The chunk holds a few
configs × all records, sized so the vmapped intermediates ((chunk, N, 16) floats) stay near the cache
sizes that made 8192-record chunks fastest for ``decide``'s pure-JAX path. That program is the
definition ("jax" engine, the default) and runs on any backend; a caller may name a faster engine
that computes the same sums, loaded from ``mdl_jax.engines`` on first use: "native", the multi-config
CPU kernel, or "pallas", the fused kernel on a single GPU; ``engine="auto"`` picks the fastest that can
run the batch here (the command line passes it). With several devices (e.g. XLA_FLAGS=--xla_force_host_platform_device_count=4
on the CPU), the jax engine runs on a 2-D ("configs", "records") mesh of them (Mesh + NamedSharding,
shape from ``mesh.mesh_shape`` or ``mesh_shape=``): the configs of each chunk are split over the first
axis, each pass's records over the second, and the sums over records become cross-device sums; with
one device nothing changes.

Passes are added by ``passes.Reducer``, which ``sweep`` (arrays), ``stream.sweep_parquet`` (Parquet)
and ``distributed`` (processes) share: whatever the source, the same engines and the same exact sums.

Three modules, one job each: ``batches`` builds and checks batches of configs, ``passes`` scores a pass
of records and adds passes exactly, and this module is the ``sweep`` call over arrays in memory with
the memory bound its passes keep. Every public name is importable from here
(``from mdl_jax.controller.sweep import config_grid, sweep``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import overload

import numpy as np

from mdl_jax.controller.batches import (
    COMPONENTS,
    as_batch,
    batch_size,
    bootstrap_weights,
    check_batch,
    config_grid,
    stack_configs,
    with_leaves,
)
from mdl_jax.controller.config import NUMERIC_FIELDS, MDLConfig
from mdl_jax.controller.passes import (
    ENGINES,
    Reducer,
    SweepResult,
    check_pass_options,
    engine_for_mesh,
    pass_layout,
    passes_on_mesh,
    result_from_state,
)
from mdl_jax.controller.validation import (
    ArrayLike,
    binary_labels,
    check_unit_interval,
    check_weight_values,
    common_shape,
    is_real_dtype,
)

__all__ = [
    "COMPONENTS", "ENGINES", "MEMORY_BOUND", "MIN_PASS", "NUMERIC_FIELDS", "RECORD_CHUNK", "SweepResult",
    "as_batch", "batch_size", "bootstrap_weights", "bounded_chunk", "check_batch", "config_grid",
    "stack_configs", "sweep", "sweep_state", "with_leaves",
]


# Records per pass of the compiled program. A pass holds a few (configs, records, 16) float
# intermediates, so memory grows with this, not with N: 2^18 records keep a pass near 100 MB, and
# N = 5×10^7 records (what decide handles) sweep in 191 passes. The host adds the passes' sums.
RECORD_CHUNK = 1 << 18

# Memory bound of a sweep's passes (bytes): the weights one pass holds (W weight vectors × its
# records, in the ~12 four-byte copies that reading, scaling, padding and splitting them by label make)
# plus the per-config sums (K configs × W vectors: the reducer's int64/float64 sums, an engine's output
# and scratch). A pass's records are cut to fit it (at W = 1000 bootstrap resamples, 2^18-record passes
# held 2 × W × 2^18 float32 weights at a time: `mdl-jax sweep --bootstrap 1000` was killed at 7 GB);
# a batch of W > 1 weight vectors whose sums leave no room for MIN_PASS records per pass is a
# ValueError naming the bound. Raise it on a machine with more memory.
MEMORY_BOUND = 1 << 30
MIN_PASS = 256
_PASS_BYTES = 64     # bytes per (record, weight vector) of a pass at its peak (~12 4-byte copies)
_STATE_BYTES = 256   # bytes per (config, weight vector)


def bounded_chunk(record_chunk: int, K: int, W: int, what: str = "weights", reserved: int = 0) -> int:
    """Records per pass for K configs and W weight vectors under ``MEMORY_BOUND`` (``reserved`` bytes
    of it held elsewhere): ``record_chunk`` or fewer; ValueError naming ``what`` and the bound when not
    even ``MIN_PASS`` records fit."""
    state = K * W * _STATE_BYTES + int(reserved)
    fit = (MEMORY_BOUND - state) // (W * _PASS_BYTES)
    if fit < MIN_PASS and W == 1:
        # one weight vector: the sums are one row per config, as they always were (the CLI bounds K
        # by MAX_CONFIGS); only many weight vectors are refused
        return int(record_chunk)
    if fit < MIN_PASS:
        need = state + MIN_PASS * W * _PASS_BYTES
        raise ValueError(f"{what}: {K:,} configs × {W:,} weight vectors need about {need / 2**30:.2f} GiB "
                         f"(per-config sums and a pass of {MIN_PASS} records), over the sweep's memory bound "
                         f"of {MEMORY_BOUND / 2**30:.2f} GiB (mdl_jax.controller.sweep.MEMORY_BOUND); use "
                         "fewer weight vectors (resamples) or fewer configs per sweep")
    return int(min(int(record_chunk), fit))


def _weights(weights, N: int):
    """(weights (W, N) as given or ones, float64 totals (W,), 2-d?), checked: finite, non-negative,
    every vector with a positive total that float64 can hold."""
    if weights is None:
        return np.ones((1, N), np.int32), np.full(1, float(N)), False
    w = np.asarray(weights)
    if w.dtype.kind == "V" and is_real_dtype(w.dtype):   # bfloat16 (ml_dtypes: NumPy kind 'V'), as signals take it
        w = w.astype(np.float32)
    if w.dtype.kind not in "biuf":
        raise ValueError(f"weights: expected real numbers, got dtype {w.dtype}")
    w2d = w.ndim == 2
    w = w.reshape((1, -1) if w.ndim == 1 else tuple(w.shape))   # (tuple(): numpy's stubs misread .shape here)
    if w.ndim != 2 or w.shape[1] != N or w.shape[0] == 0:
        raise ValueError(f"weights: expected shape (W, {N}) with W ≥ 1, or ({N},), got {np.shape(weights)}")
    check_weight_values("weights", w if w2d else w[0])
    with np.errstate(over="ignore"):
        total = w.sum(1, dtype=np.float64)
    if np.any(total <= 0):
        raise ValueError("weights: every weight vector needs a positive total")
    if not np.all(np.isfinite(total)):
        raise ValueError("weights: a weight vector's total overflows float64; scale the weights down")
    return w, total, w2d


@overload
def sweep(M: ArrayLike, R: ArrayLike, A: ArrayLike, configs: MDLConfig, *,
          adopt: ArrayLike | None = None, weights: ArrayLike | None = None,
          record_chunk: int = RECORD_CHUNK, engine: str = "jax",
          mesh_shape: tuple[int, int] | None = None) -> SweepResult: ...
@overload
def sweep(M: ArrayLike, R: ArrayLike, A: ArrayLike, configs: Sequence[MDLConfig], *,
          adopt: ArrayLike | None = None, weights: ArrayLike | None = None,
          record_chunk: int = RECORD_CHUNK, engine: str = "jax",
          mesh_shape: tuple[int, int] | None = None) -> list[SweepResult]: ...


def sweep(M: ArrayLike, R: ArrayLike, A: ArrayLike, configs: MDLConfig | Sequence[MDLConfig], *,
          adopt: ArrayLike | None = None, weights: ArrayLike | None = None,
          record_chunk: int = RECORD_CHUNK, engine: str = "jax",
          mesh_shape: tuple[int, int] | None = None) -> SweepResult | list[SweepResult]:
    """Every config × every record, reduced per config (see the module docstring).

    Examples:
      >>> configs = config_grid(MDLConfig(), g_a=np.linspace(0, 1, 21), g_b=np.linspace(0, 1, 21))
      >>> res = sweep(M, R, A, configs, adopt=adopt, weights=bootstrap_weights(len(M), 10, seed=0))
      >>> res.accuracy.reshape(21, 21, 10)       # doctest: +SKIP

    Args:
      M: (N,) relevance in [0, 1], N ≥ 1 (checked: ValueError naming the argument and first bad
        index; 0-d values broadcast to N).
      R: (N,) reliability, as ``M``.
      A: (N,) task risk, as ``M``.
      configs: a batch of configs (``config_grid``, ``stack_configs``), a single ``MDLConfig`` (a batch
        of one), or a list/tuple of those (e.g. one batch per ablation) → a list of results.
      adopt: optional (N,) binary oracle labels (1 = adopt the memory); gives ``accuracy``.
      weights: optional (W, N) or (N,) finite, non-negative per-record weights (e.g.
        ``bootstrap_weights``), each vector with a positive total; default: every record once.
      record_chunk: records per pass of the compiled program (memory is bounded by it, not by N);
        results do not depend on it beyond float32 rounding of ``mean_C_final``'s partial sums.
      engine: how each pass is computed (``ENGINES``): "jax" (default) is the pure-JAX program on
        any backend; "native" the CPU kernel (``mdl_jax.engines.native``); "pallas" the fused GPU
        kernel (``mdl_jax.engines.fused``; "fused" is its earlier name); "auto" the fastest engine
        that can run the batch here. A named engine that cannot run here is a ValueError saying why.
      mesh_shape: (config shards, record shards) of the jax engine's 2-D device mesh over the first
        a·r local devices; default: chosen from K, the pass size and the device count
        (``mesh.mesh_shape``: configs first, records where K cannot keep every device busy). Given,
        it selects the jax engine (with "auto"; another engine is a ValueError).

    Returns:
      ``SweepResult`` (or a list of them, one per entry of ``configs``) of float64 NumPy arrays;
        leading axis K (absent for a single unbatched config), then W when ``weights`` was 2-d.
        With integer weights (none, or bootstrap multiplicities) whose totals are < 2^31,
        ``counts`` and ``total`` are exact integers and ``accuracy`` the exact ratio; other weights
        are summed in float32 within a pass (scaled so they cannot overflow) and in float64 across
        passes.

    Raises:
      ValueError: a signal outside [0, 1], not 1-d or empty, or shapes that differ; labels that are
        not binary or not (N,); weights of the wrong shape, negative, non-finite, with a zero or
        overflowing total; a config of the batch outside its domain (naming the field and index);
        leaves of one batch with different K; an empty list of configs; ``record_chunk`` not a
        positive int; an unknown ``engine``, or a named one that cannot run here; a ``mesh_shape`` that does not fit the devices, or
        with an engine other than "jax" / "auto".
      TypeError: ``configs`` (or an entry) is not an ``MDLConfig``.
    """
    if isinstance(configs, (list, tuple)):
        if not configs:
            raise ValueError("configs: expected at least one config")
        return [sweep(M, R, A, c, adopt=adopt, weights=weights, record_chunk=record_chunk, engine=engine,
                      mesh_shape=mesh_shape) for c in configs]
    state, w2d, batched, total = sweep_state(M, R, A, configs, adopt=adopt, weights=weights,
                                             record_chunk=record_chunk, engine=engine, mesh_shape=mesh_shape)
    return result_from_state(state, has_adopt=adopt is not None, w2d=w2d, batched=batched, total=total)


def sweep_state(M, R, A, configs, *, adopt, weights, record_chunk, engine, mesh_shape):
    """``sweep``'s checks and passes over in-memory arrays, before the sums become a result (the
    multi-process sweep adds every process's state first).

    Args:
      M, R, A, configs, adopt, weights, record_chunk, engine, mesh_shape: as ``sweep`` (one batch).

    Returns:
      (``Reducer`` state, whether the weights were 2-d, whether ``configs`` was a batch, the weights'
      float64 totals (W,)).

    Raises:
      ValueError, TypeError: as ``sweep``.
    """
    check_pass_options(record_chunk, engine)
    engine = engine_for_mesh(engine, mesh_shape)
    cfg, K, batched = as_batch(configs)
    check_batch(cfg, K)
    for n, x in (("M", M), ("R", R), ("A", A)):
        check_unit_interval(n, x)
    shape = common_shape(("M", "R", "A"), (M, R, A))
    if len(shape) != 1 or shape[0] == 0:
        raise ValueError(f"M: expected 1-d signals with at least one record, got shape {shape}")
    N = shape[0]
    sig = [np.broadcast_to(np.asarray(x, np.float32), (N,)) for x in (M, R, A)]
    lab = np.zeros((N,), bool) if adopt is None else binary_labels(adopt, N)
    w, total, w2d = _weights(weights, N)
    record_chunk = bounded_chunk(record_chunk, K, w.shape[0], "weights" if weights is not None else "configs")
    n_pass, size, mesh = pass_layout(K, N, record_chunk, mesh_shape)
    step = -(-N // n_pass)   # records per pass before rounding up to the record shards
    with passes_on_mesh(mesh):
        red = Reducer(cfg, K, w.shape[0], size, engine)
        for j in range(n_pass):
            part = slice(j * step, min((j + 1) * step, N))
            red.add(*(x[part] for x in sig), lab[part], w[:, part])
    return red.state(), w2d, batched, total
