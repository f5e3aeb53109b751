"""The native engine of ``sweep``: a batch of configs × records scored in one kernel call per pass.

Its own module because the sweep's work is not ``decide``'s: the kernel's ``mdl_sweep_f32`` returns
per-config weighted sums, not decisions, on every thread, and two exact structures make it cheap.
Configs that share their fusion numbers (σ, ε_c, gains, g_A, bias) share ‖v_meta‖ and α per record, so
a grid over gates, thresholds or n_min/n_max costs one fusion per record plus a few SIMD lines per
config; and records with the same (M, R, A) are decided once, carrying the sums of their weights by
label (``DEDUP``). ``mdl_jax.engines.native`` re-exports the engine contract's names from here.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from mdl_jax.controller.config import MDLConfig
from mdl_jax.engines import kernel, packing

# Fold records with the same (M, R, A) into one (see _split_weights). Off only to measure it.
DEDUP = True
# How the kernel sums the weights (decide_cpu.cc: kIntegral, kInt32, kDouble).
_INTEGRAL, _INT32, _DOUBLE = 0, 1, 2
# Configs packed at a time by sweep_engine (memory: this many (1085,) float32 rows and weight matrices).
_PACK_CHUNK = 4096


def sweep_why_not(cfg: MDLConfig, K: int, *, warn: bool = True) -> str | None:
    """Why ``sweep`` cannot run this batch of K configs on the engine here, else None (``warn``: as
    ``native.why_not``'s)."""
    why = kernel.unavailable(warn)
    if why is None and not packing.sweep_supports(cfg, K):
        why = "the kernel takes D = 16 and a concrete batch of configs"
    return why


def sweep_available(cfg: MDLConfig, K: int) -> bool:
    """May ``sweep(engine="auto")`` use the native engine? Switch on, CPU backend, batch supported,
    library built and loaded (a failed build warns once and answers False)."""
    return sweep_why_not(cfg, K) is None


def _sweep_call(M, R, A, w2, groups, readout, start, flags: int, mode: int, target: str = kernel.SWEEP_TARGET):
    K, W = readout.shape[0], w2.shape[1]
    # (K, W, 6) float64 sums travel as int32 pairs: without x64, JAX has no float64 arrays.
    return jax.ffi.ffi_call(target, jax.ShapeDtypeStruct((K, W, 12), jnp.int32))(
        M, R, A, w2, groups, readout, start, flags=np.int64(flags), mode=np.int64(mode))


_sweep_jit = jax.jit(_sweep_call, static_argnames=("flags", "mode", "target"))


def _weight_mode(w2: np.ndarray) -> int:
    """int32 weights: int32 lane sums. float32 integers whose (adopt + other) row totals are < 2^24
    (bootstrap multiplicities as sweep passes them): float32 lane sums, exact and fastest. Other
    floats: float64."""
    if w2.dtype == np.int32:
        return _INT32
    if np.all(w2.sum((0, 2), dtype=np.float64) < 2**24) and np.array_equal(w2, np.floor(w2)):
        return _INTEGRAL
    return _DOUBLE


def _split_weights(M, R, A, adopt, w, dedup: bool):
    """The kernel's inputs: records and (2, W, n') weights, [0] on records labelled adopt, [1] on the
    others. A decision depends on (M, R, A) and the config only, so records with the same triple
    (paired designs: the 3,600 pooled B1/B2/B3 records of paper-scale-200x3 hold 400 distinct ones)
    are decided once, carrying the sums of their weights by label: exact for integer weights (sums
    of integers stay below the row totals), float32 rounding of the sums for other weights."""
    lab = np.asarray(adopt, bool)
    if dedup and len(M) > 1:
        trip = np.ascontiguousarray(np.stack([M, R, A], 1), np.float32)
        _, first, inv = np.unique(trip.view(np.dtype((np.void, 12))).ravel(), return_index=True,
                                  return_inverse=True)
        U = len(first)
        if U <= 0.75 * len(M):
            inv = inv.reshape(-1)
            w2 = np.empty((2, w.shape[0], U), w.dtype)
            for j, keep in enumerate((lab, ~lab)):
                for i in range(w.shape[0]):
                    w2[j, i] = np.bincount(inv, weights=np.where(keep, w[i], 0).astype(np.float64), minlength=U)
            return M[first], R[first], A[first], w2
    zero = np.zeros((), w.dtype)
    return M, R, A, np.stack([np.where(lab, w, zero), np.where(lab, zero, w)])


def sweep_engine(cfg: MDLConfig, K: int, size: int, variant: str | None = None):
    """The "native" pass function of ``sweep`` (see sweep.py's engine contract).

    Configs whose fusion numbers (σ, ε_c, gains, g_A, bias) are equal form one group, whose ‖v_meta‖
    and α the kernel computes once per record; the rest of each config is its read-out row.

    Args:
      cfg: a batch of K configs (leaves with leading axis K), D = 16, concrete.
      K: the batch's size.
      size: records per pass (unused: the kernel takes any).
      variant: run that ISA variant's kernel (``kernel.load_variant``) instead of the process's own.

    Returns:
      ``run_pass(M, R, A, adopt, w)`` → raw weighted sums as float64 NumPy arrays (n_correct (K, W),
      counts (K, W, 4), Σ w·C_final (K, W)); integer weights give exact integers.

    Raises:
      ValueError: the engine cannot run this batch here (``sweep_why_not`` says why).
    """
    why = sweep_why_not(cfg, K)
    if why is not None:
        raise ValueError(f"engine='native' cannot run here: {why}")
    target = kernel.SWEEP_TARGET if variant is None else kernel.load_variant(variant)["sweep"]
    # Packed a chunk of configs at a time: the full (K, 1085) params of a 10^6-config gate grid were
    # 4 GB (and their (K, 3, 16, 16) weight matrices 3 GB more) where the kernel needs one fusion row
    # per group and an 8-float read-out row per config. Group by the fusion numbers' bytes (a dict:
    # np.unique(axis=0) would sort the 803-float rows, a cost that grows with K).
    ids: dict = {}
    group = np.empty(K, np.int64)
    fusion_rows = []
    # read-out rows: n_min, n_max, g_a, g_b, θ0-θ2, padding (decide_cpu.cc: struct Readout)
    ro = np.zeros((K, 8), np.float32)
    for a in range(0, K, _PACK_CHUNK):
        b = min(a + _PACK_CHUNK, K)
        params = packing.pack_batch(jax.tree.map(lambda x, a=a, b=b: np.asarray(x)[a:b], cfg), b - a)
        for i, row in enumerate(np.ascontiguousarray(params[:, :packing.FUSION_END])):
            n = len(ids)
            group[a + i] = ids.setdefault(row.tobytes(), n)
            if group[a + i] == n:                            # ids count up in order of first appearance
                fusion_rows.append(params[i].copy())
        g, t = packing.GATE_AT, packing.THRESHOLDS_AT
        ro[a:b, 0], ro[a:b, 1] = params[:, packing.N_MIN_AT], params[:, packing.N_MAX_AT]
        ro[a:b, 2:4], ro[a:b, 4:7] = params[:, g:g + 2], params[:, t:t + 3]
    order = np.argsort(group, kind="stable")             # configs sorted by group
    inverse = np.empty_like(order)
    inverse[order] = np.arange(K)
    G = len(fusion_rows)
    groups = jax.device_put(np.stack(fusion_rows))
    start = jax.device_put(np.searchsorted(group[order], np.arange(G + 1)).astype(np.int32))
    readout = jax.device_put(ro[order])
    flags_ = packing.flags(cfg)

    def run_pass(M, R, A, adopt, w):
        w = np.asarray(w)
        if w.dtype != np.int32:
            w = w.astype(np.float32)
        sig = [np.asarray(x, np.float32) for x in (M, R, A)]
        # folding duplicates costs a sort of the records: worth it once a few configs share it
        *sig, w2 = _split_weights(*sig, adopt, w, dedup=DEDUP and K >= 4)
        out = _sweep_jit(*sig, w2, groups, readout, start, flags=flags_, mode=_weight_mode(w2), target=target)
        sums = np.asarray(out).view(np.float64)[inverse]   # (K, W, 6), the caller's config order
        return sums[..., 4], sums[..., 0:4], sums[..., 5]

    return run_pass
