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

Passes are added by ``_Reducer``, which ``sweep`` (arrays), ``stream.sweep_parquet`` (Parquet) and
``distributed`` (processes) share: whatever the source, the same engines and the same exact sums.

Why one module over the house's ~600 lines: about 400 of its lines are code; the rest is the reference
documentation of its five public names (``SweepResult``, ``stack_configs``, ``config_grid``,
``bootstrap_weights``, ``sweep``), which the API docs are generated from, and the comments on why each
pass is laid out as it is. If the code itself grows, the seam to split along is config batches
(``batch_size`` through ``bootstrap_weights``: building and checking a batch) versus the pass machinery
(the program, the engines, ``_Reducer``, ``sweep``), with the public names re-exported here so
``from mdl_jax.controller.sweep import config_grid, sweep`` keeps working.
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Sequence
from typing import NamedTuple, overload

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from mdl_jax.controller import api as _api
from mdl_jax.controller import config as _config
from mdl_jax.controller import decision as _d
from mdl_jax.controller import mesh as _meshes
from mdl_jax.controller.config import NUMERIC_FIELDS, MDLConfig
from mdl_jax.controller.validation import ArrayLike, binary_labels, check_unit_interval, common_shape, plain

# The unbatched rank of each numeric leaf (bias may also be a (D,) vector: rank 1), and the length of
# each vector field, from the fields' declarations.
_BASE_RANK = {f: len(s.shape) for f, s in _config.field_specs().items() if s.leaf}
_SIZES = {f: s.shape[0] for f, s in _config.field_specs().items() if s.leaf and len(s.shape) == 1}
# Fields that may also hold one value per coordinate, (D,) per config (bias).
_OR_D = tuple(f for f, s in _config.field_specs().items() if s.leaf and s.or_d_vector)
# Names for one component of a vector field, so a grid can vary it alone.
COMPONENTS = _config.components()
# Decisions per chunk of the compiled loop (configs per chunk × records): the cache-sized chunk of
# decide's pure-JAX path (see api.CHUNK).
_CHUNK_DECISIONS = 16384


class SweepResult(NamedTuple):
    """Per-config reductions, as float64 NumPy arrays. With ``weights`` of shape (W, N) every field
    has a W axis after K; the K axis is absent for a single unbatched config.

    Attributes:
      accuracy: (K[, W]) share of records (by weight) where 'adopt ⇔ ACTIVE' matches the oracle
        label (binary decision accuracy, paper Section 5.3); None when no labels were given.
      counts: (K[, W], 4) weighted number of records per action, in ``Action`` order (exact
        integers for integer weights with totals < 2^31).
      mean_C_final: (K[, W]) weighted mean of C_final.
      total: ([W]) total weight (the number of records, unweighted); a float64 scalar without a W
        axis.
    """

    accuracy: np.ndarray | None
    counts: np.ndarray
    mean_C_final: np.ndarray
    total: np.ndarray | np.float64


# ------------------------------------------------------------------------------------ config batches

def _leaf(cfg: MDLConfig, f: str) -> np.ndarray:
    try:
        a = np.asarray(getattr(cfg, f), dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{f}: expected real numbers, got {getattr(cfg, f)!r}") from None
    return a


def batch_size(configs: MDLConfig) -> int | None:
    """K for a batch of configs (every numeric leaf with leading axis K), None for a single config.

    Raises ValueError naming the field when the leaves disagree: some batched, some not, or two
    different leading sizes.
    """
    ranks = {}
    for f in NUMERIC_FIELDS:
        a = _leaf(configs, f)
        extra = a.ndim - _BASE_RANK[f]
        if f in _OR_D and a.ndim >= 1 and a.shape[-1] == configs.D and a.ndim == 2:
            extra = 1  # (K, D): one bias vector per config
        elif f in _OR_D and a.ndim == 1 and a.shape[0] == configs.D:
            extra = -1  # (D,): ambiguous alone; decided by the other leaves below
        ranks[f] = (extra, a.shape)
    batched = {f: s[0] for f, (e, s) in ranks.items() if e == 1}
    if not batched:
        if any(e > 1 for e, _ in ranks.values()):
            f = next(f for f, (e, _) in ranks.items() if e > 1)
            raise ValueError(f"{f}: expected one leading config axis, got shape {ranks[f][1]}")
        return None
    ref_f, K = next(iter(batched.items()))
    for f, (extra, shape) in ranks.items():
        if f in _OR_D and extra == -1 and shape[0] == K:
            continue  # (K,): one scalar bias per config
        if extra != 1 or shape[0] != K:
            raise ValueError(f"{f}: expected a leading config axis of size {K} (the batch size of "
                             f"{ref_f}), got shape {shape}")
    return K


def _check_batch(configs: MDLConfig, K: int) -> None:
    """Every config of the batch finite and inside its domain (ValueError naming field and index)."""
    def bad(f, mask, what):
        idx = np.argwhere(mask)[0]
        k = int(idx[0])
        v = np.asarray(getattr(configs, f))[k]
        shown = plain(v) if np.ndim(v) == 0 else "(" + ", ".join(plain(x) for x in v) + ")"
        raise ValueError(f"{f}: expected {what}; config {k} of the batch has {f} = {shown}")

    # The declared ranges, read once by config.field_violations; each leaf as (K, per-config values)
    values = {f: _leaf(configs, f).reshape(K, -1) for f in NUMERIC_FIELDS}
    values = {f: (v if f in _SIZES else v[:, 0] if v.shape[1] == 1 else v) for f, v in values.items()}
    for f, mask, what, _ in _config.field_violations(values):
        # a per-coordinate field (a (K, D) bias): a config is bad if any of its values is
        bad(f, np.reshape(mask, (K, -1)).any(1), what)


def _as_batch(cfg: MDLConfig) -> tuple[MDLConfig, int, bool]:
    """(batched config, K, was it batched): a single config becomes a batch of one."""
    if not isinstance(cfg, MDLConfig):
        raise TypeError(f"configs: expected an MDLConfig (a batch from config_grid/stack_configs) or a "
                        f"sequence of them, got {type(cfg).__name__}")
    K = batch_size(cfg)
    if K is None:
        return stack_configs([cfg]), 1, False
    return cfg, K, True


def stack_configs(configs: Sequence[MDLConfig]) -> MDLConfig:
    """A batch of configs from single configs that share their static fields.

    Examples:
      >>> batch = stack_configs([MDLConfig(), MDLConfig(sigma=0.3)])     # K = 2
      >>> batch.sigma.shape
      (2,)

    Args:
      configs: K ≥ 1 single ``MDLConfig`` with the same static fields (D, dims, qr_seed, the
        ablations); a scalar and a (D,) bias mix (stored as (K, D)).

    Returns:
      A batch of configs: every numeric leaf a float32 NumPy array with a leading axis
        K = len(configs); static fields from ``configs[0]``.

    Raises:
      ValueError: no configs; static fields that differ (naming the index); a field whose shape
        differs between configs.
      TypeError: an entry that is not an ``MDLConfig`` (naming the index).
    """
    configs = list(configs)
    if not configs:
        raise ValueError("configs: expected at least one MDLConfig")
    first = configs[0]
    for i, c in enumerate(configs):
        if not isinstance(c, MDLConfig):
            raise TypeError(f"configs[{i}]: expected an MDLConfig, got {type(c).__name__}")
        if _config._flatten(c)[1] != _config._flatten(first)[1]:
            raise ValueError(f"configs[{i}]: static fields (D, dims, qr_seed, ablations) differ from "
                             "configs[0]; sweep them as separate batches")
    leaves = {}
    for f in NUMERIC_FIELDS:
        vals = [_leaf(c, f) for c in configs]
        if f in _OR_D:  # scalar and (D,) biases mix: store (K, D) when any is a vector
            if any(v.ndim for v in vals):
                vals = [np.broadcast_to(v, (first.D,)) for v in vals]
        shapes = {v.shape for v in vals}
        if len(shapes) != 1:
            raise ValueError(f"{f}: expected the same shape in every config, got {sorted(shapes)}")
        leaves[f] = np.stack(vals).astype(np.float32)
    return _with_leaves(first, leaves)


def _with_leaves(template: MDLConfig, leaves: dict) -> MDLConfig:
    # Same static fields, new numeric leaves (arrays), without re-running the single-config checks.
    return _config._unflatten(_config._flatten(template)[1], [leaves[f] for f in NUMERIC_FIELDS])


def config_grid(base: MDLConfig | None = None, **axes: ArrayLike) -> MDLConfig:
    """The Cartesian product of named value lists, as a batch of K = ∏ len(values) configs.

    Keywords are numeric fields (``sigma=[...]``, ``eps_c``, ``n_min``, ``n_max``, ``bias``; vector
    fields take a list of tuples, e.g. ``gate_coeffs=[(0.3, 0.7), (0.1, 0.9)]``) or one component of a
    vector field (``g_a``, ``g_b``, ``g_A_a``, ``g_A_b``, ``s_wm``, ``s_r``, ``s_a``, ``theta0``,
    ``theta1``, ``theta2``). Order is C order: the first keyword varies slowest, so results reshape to
    ``(len(axis1), len(axis2), ...)``. Other fields come from ``base`` (the paper defaults when None).
    Every config is checked (finite, σ > 0, 0 ≤ ε_c < min gains, θ descending in [0, 1],
    n_max > n_min): a bad value is a ValueError naming the field and the config's index.

    Examples:
      >>> grid = config_grid(g_a=np.linspace(0, 1, 21), g_b=np.linspace(0, 1, 21))   # K = 441
      >>> sweep(M, R, A, grid, adopt=adopt).accuracy.reshape(21, 21)                 # doctest: +SKIP

    Args:
      base: the single config the other fields come from; the paper's defaults when None.
      **axes: field or component name = a non-empty list of values (scalars; tuples for a whole
        vector field; scalars or D-vectors for ``bias``).

    Returns:
      A batch of K configs (numeric leaves float32 with a leading axis K, ``base``'s static fields).

    Raises:
      ValueError: no keywords; an unknown name; a list that is empty, not real numbers, of the wrong
        rank or tuple length, or not finite (naming the keyword and index); a config of the product
        outside its domain (naming the field and the config's index); a batched ``base``.
      TypeError: ``base`` is not an ``MDLConfig``.
    """
    base = base if base is not None else MDLConfig()
    if not isinstance(base, MDLConfig):
        raise TypeError(f"base: expected an MDLConfig, got {type(base).__name__}")
    if batch_size(base) is not None:
        raise ValueError("base: expected a single config, got a batch")
    if not axes:
        raise ValueError("axes: expected at least one field=values keyword")
    names, values = [], []
    for name, vals in axes.items():
        if name not in NUMERIC_FIELDS and name not in COMPONENTS:
            raise ValueError(f"{name}: not a numeric config field or component; expected one of "
                             f"{list(NUMERIC_FIELDS) + list(COMPONENTS)}")
        try:
            arr = np.asarray(vals, dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"{name}: expected a list of real numbers, got {vals!r}") from None
        field = COMPONENTS[name][0] if name in COMPONENTS else name
        want = 1 + (0 if name in COMPONENTS else _BASE_RANK[field])
        if field in _OR_D and name == field and arr.ndim == 2:
            want = 2
        if arr.ndim != want or arr.shape[0] == 0:
            raise ValueError(f"{name}: expected a non-empty list of "
                             f"{'scalars' if want == 1 else 'tuples'}, got shape {arr.shape}")
        if name in _OR_D and arr.ndim == 2 and arr.shape[1] != base.D:   # else a bare NumPy broadcast error
            raise ValueError(f"{name}: expected scalars or vectors of D = {base.D} values, got shape {arr.shape}")
        if field in _SIZES and name not in COMPONENTS and arr.shape[1] != _SIZES[field]:
            raise ValueError(f"{name}: expected tuples of {_SIZES[field]} values, got shape {arr.shape}")
        if not np.all(np.isfinite(arr)):
            i = int(np.argwhere(~np.isfinite(arr.reshape(len(arr), -1)).all(1))[0][0])
            raise ValueError(f"{name}: expected finite values; {name}[{i}] = {vals[i]!r}")
        names.append(name)
        values.append(arr)
    K = int(np.prod([len(v) for v in values]))
    leaves = {f: np.broadcast_to(_leaf(base, f), (K,) + _leaf(base, f).shape).copy()
              for f in NUMERIC_FIELDS}
    for f in _OR_D:  # a vector bias anywhere (the grid's or the base's): every config's as (D,)
        if f in names and (values[names.index(f)].ndim == 2 or leaves[f].ndim == 2):
            leaves[f] = np.broadcast_to(leaves[f].reshape(K, -1), (K, base.D)).copy()
    idx = np.stack(np.meshgrid(*[np.arange(len(v)) for v in values], indexing="ij"), -1).reshape(K, -1)
    for j, (name, arr) in enumerate(zip(names, values)):
        field, c = COMPONENTS.get(name, (name, slice(None)))
        picked = arr[idx[:, j]]
        if leaves[field].ndim == 2 and picked.ndim == 1 and name not in COMPONENTS:
            picked = picked[:, None]  # one scalar bias per config over a vector bias
        if leaves[field].ndim == 1:
            leaves[field][:] = picked
        else:
            leaves[field][:, c] = picked
    out = _with_leaves(base, {f: v.astype(np.float32) for f, v in leaves.items()})
    _check_batch(out, K)
    return out


def bootstrap_weights(n: int, n_resamples: int, seed: int = 0) -> np.ndarray:
    """Bootstrap resamples as per-record multiplicity weights for ``sweep(..., weights=...)``.

    A record's decision does not depend on how often it was drawn, so ``sweep`` decides each
    (config, record) once and scores every resample exactly as one weighted sum.

    Args:
      n: the number of records N, a positive int.
      n_resamples: the number of resamples W, a positive int.
      seed: seed of ``numpy.random.default_rng`` (any value it takes).

    Returns:
      (n_resamples, n) float32 array: row w holds how often each record was drawn in n draws with
        replacement from n records (integers summing to n).

    Raises:
      ValueError: ``n`` or ``n_resamples`` not a positive int (naming it).
    """
    if not (isinstance(n, (int, np.integer)) and n > 0):
        raise ValueError(f"n: expected a positive int, got {n!r}")
    if not (isinstance(n_resamples, (int, np.integer)) and n_resamples > 0):
        raise ValueError(f"n_resamples: expected a positive int, got {n_resamples!r}")
    rng = np.random.default_rng(seed)
    return rng.multinomial(n, np.full(n, 1.0 / n), size=n_resamples).astype(np.float32)


# ------------------------------------------------------------------------------------ the program

def _c_final_and_action(M, R, A, cfg: MDLConfig):
    # Algorithm 1 for one record without the attribution outputs (v_meta, energies) a sweep discards.
    v_meta, v_wm, _ = _d.fuse(M, R, A, cfg)
    C, alpha, _ = _d.read_out(v_meta, v_wm, cfg)
    C_final = _d.gate(C, alpha, cfg)
    return C_final, _d.act(C_final, cfg)


_over_records = jax.vmap(_c_final_and_action, in_axes=(0, 0, 0, None))


def _reduce_one_config(M, R, A, adopt, weights, cfg):
    """One config × a chunk of records → raw weighted sums (correct (W,), counts (W, 4), C_final (W,)).

    With integer weights (int32) the counts and the number correct are exact integer sums; C_final is
    summed in float32. The host adds the chunks in int64 / float64 and divides by the totals."""
    C_final, action = _over_records(M, R, A, cfg)
    hi = jax.lax.Precision.HIGHEST
    dt = weights.dtype
    onehot = (action[:, None] == jnp.arange(4)[None, :]).astype(dt)   # (n, 4)
    counts = jnp.einsum("wn,na->wa", weights, onehot, precision=hi, preferred_element_type=dt)
    correct = ((action == 0) == adopt).astype(dt)
    n_correct = jnp.einsum("wn,n->w", weights, correct, precision=hi, preferred_element_type=dt)
    cf = jnp.einsum("wn,n->w", weights.astype(jnp.float32), C_final.astype(jnp.float32), precision=hi)
    return n_correct, counts, cf


def _program(M, R, A, adopt, weights, cfg_chunks, chunk_sharding=None):
    # cfg_chunks: leaves (n_chunks, chunk, ...). lax.map walks the chunks; a chunk is vmapped. With a
    # 2-D mesh the records (M, R, A, adopt, weights' second axis) arrive sharded over "records" and the
    # chunk's configs over "configs": each device decides its configs × its records, and the sums over
    # records in _reduce_one_config become a cross-device sum that XLA inserts (integer sums stay exact).
    per_chunk = jax.vmap(_reduce_one_config, in_axes=(None, None, None, None, None, 0))

    def body(cfg_chunk):
        if chunk_sharding is not None:
            cfg_chunk = jax.lax.with_sharding_constraint(cfg_chunk, chunk_sharding)
        return per_chunk(M, R, A, adopt, weights, cfg_chunk)

    return jax.lax.map(body, cfg_chunks)


_program_jit = jax.jit(_program, static_argnames=("chunk_sharding",))

# The (configs, records) mesh shape of the sweep in progress: ``sweep`` chooses it (or takes the
# caller's) and the jax engine reads it here, so the engine's signature stays (cfg, K, size) for every
# engine. (1, 1): one device, nothing sharded.
_MESH_SHAPE: contextvars.ContextVar[tuple[int, int]] = contextvars.ContextVar("mesh_shape", default=(1, 1))


def _chunk_size(K: int, size: int, a: int, r: int) -> int:
    """Configs per chunk: a multiple of the config shards a, each device holding about
    _CHUNK_DECISIONS (config, record) pairs of its own."""
    per_dev = max(1, _CHUNK_DECISIONS // max(-(-size // r), 1))
    return min(per_dev, -(-K // a)) * a


def _config_chunks(cfg: MDLConfig, K: int, n: int):
    """The batch padded to whole chunks of configs: (chunked leaves, chunk size, chunk count, mesh, sharding)."""
    a, r = _MESH_SHAPE.get()
    mesh = _meshes.make_mesh((a, r), ("configs", "records"))
    chunk = _chunk_size(K, n, a, r)
    n_chunks = -(-K // chunk)
    pad = n_chunks * chunk - K

    def to_chunks(x):
        x = np.asarray(x, np.float32)
        if pad:  # repeat the last config; its rows are dropped below
            x = np.concatenate([x, np.repeat(x[-1:], pad, axis=0)])
        return x.reshape((n_chunks, chunk) + x.shape[1:])

    chunks = jax.tree.map(to_chunks, cfg)
    sharding = None
    if mesh is not None:
        sharding = NamedSharding(mesh, PartitionSpec("configs"))
        placed = NamedSharding(mesh, PartitionSpec(None, "configs"))
        chunks = jax.tree.map(lambda x: jax.device_put(x, placed), chunks)
    return chunks, chunk, n_chunks, mesh, sharding


# ------------------------------------------------------------------------------------ engines
# An engine computes one pass: (M, R, A (n,) float32, adopt (n,) bool, w (W, n) int32 or float32) →
# raw weighted sums (n_correct (K, W), counts (K, W, 4), C_final (K, W)) as NumPy arrays, integer sums
# exact. ``sweep`` adds the passes on the host. "jax" (the default) is the definition (the program
# above, on any backend); "pallas" the fused kernel of ``mdl_jax.engines.fused`` (one GPU; Pallas
# interpret mode elsewhere with MDL_JAX_FUSED=interpret, for tests); "native" the CPU kernel
# (``mdl_jax.engines.native``); "auto" the fastest engine that can run the batch here. "fused" is the
# earlier name of "pallas", kept as an alias. The engines' modules are imported by name, on first use.
ENGINES = ("jax", "native", "pallas", "auto", "fused")


def _jax_engine(cfg: MDLConfig, K: int, size: int):
    chunks, chunk, n_chunks, mesh, sharding = _config_chunks(cfg, K, size)
    if mesh is None:
        place = jnp.asarray
        place_w = jnp.asarray
    else:  # the pass's records split over the "records" axis (size is a multiple of its length)
        on_records = NamedSharding(mesh, PartitionSpec("records"))
        w_on_records = NamedSharding(mesh, PartitionSpec(None, "records"))
        place = functools.partial(jax.device_put, device=on_records)
        place_w = functools.partial(jax.device_put, device=w_on_records)

    def run_pass(M, R, A, adopt, w):
        out = _program_jit(place(M), place(R), place(A), place(adopt), place_w(w), chunks,
                           chunk_sharding=sharding)
        return tuple(np.asarray(x).reshape((n_chunks * chunk,) + x.shape[2:])[:K] for x in out)

    return run_pass


def _engine(name: str, cfg: MDLConfig, K: int, size: int):
    """The pass function for ``engine=name`` (``ENGINES``); a named engine that cannot run the batch
    here is a ValueError saying why."""
    name = "pallas" if name == "fused" else name
    if name == "jax":
        return _jax_engine(cfg, K, size)
    if name == "pallas" or (name == "auto" and _api.engine_module("pallas").sweep_usable(cfg)):
        fused = _api.engine_module("pallas")
        why = fused.sweep_why_not(cfg, K)
        if why is not None:
            raise _api.cannot_run("pallas", why)
        return fused.sweep_engine(cfg, K, size, fallback=lambda: _jax_engine(cfg, K, size))
    if name == "native" or (name == "auto" and _api._backend() == "cpu"):
        native = _api.engine_module("native")
        why = native.sweep_why_not(cfg, K)
        if why is None:
            return native.sweep_engine(cfg, K, size)
        if name == "native":
            raise _api.cannot_run("native", why)
    if name == "auto":
        return _jax_engine(cfg, K, size)
    raise ValueError(f"engine: expected one of {ENGINES}, got {name!r}")


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
    if w.dtype.kind not in "biuf":
        raise ValueError(f"weights: expected real numbers, got dtype {w.dtype}")
    w2d = w.ndim == 2
    w = w.reshape((1, -1) if w.ndim == 1 else tuple(w.shape))   # (tuple(): numpy's stubs misread .shape here)
    if w.ndim != 2 or w.shape[1] != N:
        raise ValueError(f"weights: expected shape (W, {N}) or ({N},), got {np.shape(weights)}")
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ValueError("weights: expected finite, non-negative weights")
    with np.errstate(over="ignore"):
        total = w.sum(1, dtype=np.float64)
    if np.any(total <= 0):
        raise ValueError("weights: every weight vector needs a positive total")
    if not np.all(np.isfinite(total)):
        raise ValueError("weights: a weight vector's total overflows float64; scale the weights down")
    return w, total, w2d


def _device_weights(w: np.ndarray):
    """One pass's (W, n) weights as the engines take them: (device weights, per-row scale, exact?).

    Integer weights (bootstrap multiplicities, none at all) whose pass totals fit int32 stay integers,
    so counts and the number correct are exact however large N is; below 2^24 every partial sum is an
    integer float32 holds exactly, and the float matmul (fast on every backend) gives the same integers.
    Other weights are scaled per row by a power of two so the largest is in [1, 2), which keeps float32
    sums finite (finite float64 weights whose float32 total overflowed gave NaN before) and is undone
    exactly on the host. Scaling per pass or per sweep gives the same sums: powers of two commute
    with float32 rounding."""
    W = w.shape[0]
    if w.dtype.kind in "biu" or np.all(w == np.floor(w)):
        tot = w.sum(1, dtype=np.float64)
        if tot.max(initial=0) < 2**24:
            return w.astype(np.float32), np.ones(W), True
        if tot.max() < 2**31:
            return w.astype(np.int32), np.ones(W), True
    w = w.astype(np.float64)
    top = w.max(1)
    scale = np.where(top > 0, 2.0 ** -np.floor(np.log2(np.where(top > 0, top, 1.0))), 1.0)   # exact
    return (w * scale[:, None]).astype(np.float32), scale, False


class _Reducer:
    """Adds passes of records into per-config sums: the machinery ``sweep`` (arrays),
    ``sweep_parquet`` (a stream) and the multi-process sweep (``distributed``) share.

    Each ``add`` is one call of the engine's pass function on ``size`` records (fewer are padded with
    weight-0 records, which add nothing). Integer-weight passes are added in int64 (exact), others in
    float64 after undoing their power-of-two scale; ``state`` is the plain sums, which processes can
    add in any grouping (integers exactly) before ``finish`` turns them into a ``SweepResult``."""

    def __init__(self, cfg: MDLConfig, K: int, W: int, size: int, engine: str):
        self.K, self.W, self.size = K, W, size
        self.run_pass = _engine(engine, cfg, K, size)
        self.s = {"int_correct": np.zeros((K, W), np.int64), "int_counts": np.zeros((K, W, 4), np.int64),
                  "float_correct": np.zeros((K, W)), "float_counts": np.zeros((K, W, 4)),
                  "cf": np.zeros((K, W)), "wsum": np.zeros(W), "total": np.zeros(W)}

    def add(self, M, R, A, lab, w) -> None:
        """One pass: (n,) float32 signals in [0, 1], (n,) bool labels, (W, n) weights; n ≤ size."""
        n = len(M)
        wd, scale, exact = _device_weights(w)
        self.s["total"] += w.sum(1, dtype=np.float64)
        if n < self.size:
            pad = self.size - n
            M, R, A = (np.concatenate([x, np.full(pad, 0.5, np.float32)]) for x in (M, R, A))
            lab = np.concatenate([lab, np.zeros(pad, bool)])
            wd = np.concatenate([wd, np.zeros((self.W, pad), wd.dtype)], axis=1)
        c, k, m = self.run_pass(M, R, A, lab, wd)
        s = self.s
        if exact:
            s["int_correct"] += np.asarray(c).astype(np.int64)
            s["int_counts"] += np.asarray(k).astype(np.int64)
        else:
            s["float_correct"] += np.asarray(c, np.float64) / scale
            s["float_counts"] += np.asarray(k, np.float64) / scale[:, None]
        s["cf"] += np.asarray(m, np.float64) / scale
        # the weights as the device summed them (float32-rounded), so ratios divide like by like
        s["wsum"] += wd.astype(np.float64).sum(1) / scale

    def state(self) -> dict:
        return self.s


def _finish(s: dict, *, has_adopt: bool, w2d: bool, batched: bool, total=None) -> SweepResult:
    """A SweepResult from summed reducer states (``total``: the weights' float64 totals, if known)."""
    n_correct = s["int_correct"] + s["float_correct"]
    counts = s["int_counts"] + s["float_counts"]
    with np.errstate(invalid="ignore", divide="ignore"):
        acc = np.minimum(n_correct / s["wsum"], 1.0)
        mean_cf = s["cf"] / s["wsum"]
    total = s["total"] if total is None else total
    if not w2d:
        acc, counts, mean_cf, total = acc[:, 0], counts[:, 0], mean_cf[:, 0], total[0]
    if not batched:
        acc, counts, mean_cf = acc[0], counts[0], mean_cf[0]
    return SweepResult(acc if has_adopt else None, counts, mean_cf,
                       total if w2d else np.float64(total))


def _check_common(record_chunk, engine):
    if isinstance(record_chunk, bool) or not isinstance(record_chunk, (int, np.integer)) or record_chunk < 1:
        raise ValueError(f"record_chunk: expected a positive int, got {record_chunk!r}")
    if engine not in ENGINES:
        raise ValueError(f"engine: expected one of {ENGINES}, got {engine!r}")


def _engine_for_mesh(engine: str, mesh_shape) -> str:
    """An explicit ``mesh_shape`` asks for the jax engine (the only one on a device mesh): "auto" then
    means "jax", and another engine is a ValueError."""
    if mesh_shape is None:
        return engine
    if engine not in ("auto", "jax"):
        raise ValueError(f"mesh_shape: only the jax engine runs on a device mesh, got engine={engine!r}")
    return "jax"


def _pass_layout(K: int, N: int, record_chunk: int, mesh_shape) -> tuple[int, int, tuple[int, int]]:
    """(passes, records per pass, (config shards, record shards)) for N records: equal passes (one
    compilation), each a multiple of the record shards so the records axis splits evenly."""
    n_dev = len(jax.local_devices())
    n_pass = -(-N // int(record_chunk))
    size = -(-N // n_pass)
    if mesh_shape is None:
        shape = _meshes.mesh_shape(n_dev, K, size)
    else:
        shape = _meshes.check_mesh_shape(mesh_shape, n_dev)
    r = shape[1]
    return n_pass, -(-size // r) * r, shape


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
    state, w2d, batched, total = _sweep_state(M, R, A, configs, adopt=adopt, weights=weights,
                                              record_chunk=record_chunk, engine=engine, mesh_shape=mesh_shape)
    return _finish(state, has_adopt=adopt is not None, w2d=w2d, batched=batched, total=total)


def _sweep_state(M, R, A, configs, *, adopt, weights, record_chunk, engine, mesh_shape):
    """``sweep``'s checks and passes over in-memory arrays → (reducer state, 2-d weights?, batched?,
    float64 totals)."""
    _check_common(record_chunk, engine)
    engine = _engine_for_mesh(engine, mesh_shape)
    cfg, K, batched = _as_batch(configs)
    _check_batch(cfg, K)
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
    n_pass, size, mesh = _pass_layout(K, N, record_chunk, mesh_shape)
    step = -(-N // n_pass)   # records per pass before rounding up to the record shards
    token = _MESH_SHAPE.set(mesh)
    try:
        red = _Reducer(cfg, K, w.shape[0], size, engine)
        for j in range(n_pass):
            part = slice(j * step, min((j + 1) * step, N))
            red.add(*(x[part] for x in sig), lab[part], w[:, part])
    finally:
        _MESH_SHAPE.reset(token)
    return red.state(), w2d, batched, total
