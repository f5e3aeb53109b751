"""The sweep's pass machinery: one pass of records through an engine, and the exact sums of passes.

A pass is one call of a compiled program (or a named engine's kernel) on at most a pass's worth of
records against every config of a batch; ``Reducer`` adds passes into per-config sums and
``result_from_state`` turns the sums into a ``SweepResult``. Its own module because three callers
drive it from different sources (``sweep``: arrays in memory, ``stream.sweep_parquet``: a Parquet
file, ``distributed``: processes that add their sums), and whatever the source, the engines, the
device mesh and the exact integer sums must be the same code. ``mdl_jax.controller.sweep`` re-exports
``SweepResult`` and ``ENGINES``.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Iterator
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from mdl_jax.controller import api as _api
from mdl_jax.controller import decision as _d
from mdl_jax.controller import mesh as _meshes
from mdl_jax.controller.config import MDLConfig

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
    onehot = (action[:, None] == jnp.arange(4, dtype=action.dtype)[None, :]).astype(dt)   # (n, 4); int64 under x64
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


@contextlib.contextmanager
def passes_on_mesh(shape: tuple[int, int]) -> Iterator[None]:
    """The (config shards, record shards) mesh that the jax engine of every ``Reducer`` made inside
    this block runs on (``pass_layout``'s third value); (1, 1) outside any block.

    Args:
      shape: (a, r), a·r ≤ the local devices.
    """
    token = _MESH_SHAPE.set(tuple(shape))  # type: ignore[arg-type]
    try:
        yield
    finally:
        _MESH_SHAPE.reset(token)


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
    """(the engine that runs, as a checkpoint names it: "jax", "pallas" or "native-<ISA variant>", its
    pass function) for ``engine=name`` (``ENGINES``; "auto" resolved); a named engine that cannot run
    the batch here is a ValueError saying why."""
    asked = name  # the error names the engine as the caller wrote it
    name = "pallas" if name == "fused" else name
    if name == "jax":
        return "jax", _jax_engine(cfg, K, size)
    if name == "pallas" or (name == "auto" and _api.engine_module("pallas").sweep_usable(cfg)):
        fused = _api.engine_module("pallas")
        why = fused.sweep_why_not(cfg, K, warn=name == "auto")
        if why is not None:
            raise _api.cannot_run(asked, why)
        return "pallas", fused.sweep_engine(cfg, K, size, fallback=lambda: _jax_engine(cfg, K, size))
    if name == "native" or (name == "auto" and _api.default_backend() == "cpu"):
        native = _api.engine_module("native")
        why = native.sweep_why_not(cfg, K, warn=name == "auto")
        if why is None:
            return f"native-{native.status().get('isa', 'unknown')}", native.sweep_engine(cfg, K, size)
        if name == "native":
            raise _api.cannot_run("native", why)
    if name == "auto":
        return "jax", _jax_engine(cfg, K, size)
    raise ValueError(f"engine: expected one of {ENGINES}, got {name!r}")


# Records per pass of the compiled program. A pass holds a few (configs, records, 16) float


def _device_weights(w: np.ndarray):
    """One pass's (W, n) weights as the engines take them: (device weights, per-row power-of-two
    exponent they were scaled by, exact?).

    Integer weights (bootstrap multiplicities, none at all) whose pass totals fit int32 stay integers,
    so counts and the number correct are exact however large N is; below 2^24 every partial sum is an
    integer float32 holds exactly, and the float matmul (fast on every backend) gives the same integers.
    Other weights are scaled per row by a power of two so the largest is in [1, 2), which keeps float32
    sums finite (finite float64 weights whose float32 total overflowed gave NaN before) and is undone
    exactly on the host. Scaling per pass or per sweep gives the same sums: powers of two commute
    with float32 rounding. The scale is kept as an exponent and applied with ``ldexp``: as a float,
    2^1030 (the scale of weights near 1e-310) is inf."""
    W = w.shape[0]
    none = np.zeros(W, np.int64)
    if w.dtype.kind in "biu" or np.all(w == np.floor(w)):
        with np.errstate(over="ignore"):   # an inf total is no int32 one (and the result refuses it)
            tot = w.sum(1, dtype=np.float64)
        if tot.max(initial=0) < 2**24:
            return w.astype(np.float32), none, True
        if tot.max() < 2**31:
            return w.astype(np.int32), none, True
    w = w.astype(np.float64)
    top = w.max(1)
    _, exponent = np.frexp(np.where(top > 0, top, 1.0))   # top = m·2^e, m in [0.5, 1)
    shift = (1 - exponent).astype(np.int64)
    return np.ldexp(w, shift[:, None]).astype(np.float32), shift, False   # exact


class Reducer:
    """Adds passes of records into per-config sums: the machinery ``sweep`` (arrays),
    ``sweep_parquet`` (a stream) and the multi-process sweep (``distributed``) share.

    Made inside ``passes_on_mesh`` (its jax engine places the batch on that mesh once, here).

    Each ``add`` is one call of the engine's pass function on ``size`` records (fewer are padded with
    weight-0 records, which add nothing). Integer-weight passes are added in int64 (exact), others in
    float64 after undoing their power-of-two scale; ``state`` is the plain sums, which processes can
    add in any grouping (integers exactly) before ``result_from_state`` turns them into a ``SweepResult``."""

    def __init__(self, cfg: MDLConfig, K: int, W: int, size: int, engine: str):
        self.K, self.W, self.size = K, W, size
        self.engine, self.run_pass = _engine(engine, cfg, K, size)
        self.s = {"int_correct": np.zeros((K, W), np.int64), "int_counts": np.zeros((K, W, 4), np.int64),
                  "float_correct": np.zeros((K, W)), "float_counts": np.zeros((K, W, 4)),
                  "cf": np.zeros((K, W)), "wsum": np.zeros(W), "total": np.zeros(W)}

    def add(self, M, R, A, lab, w) -> None:
        """One pass: (n,) float32 signals in [0, 1], (n,) bool labels, (W, n) weights; n ≤ size."""
        n = len(M)
        wd, shift, exact = _device_weights(w)
        with np.errstate(over="ignore"):
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
            s["cf"] += np.asarray(m, np.float64)
            s["wsum"] += wd.astype(np.float64).sum(1)
            return
        # float weights whose total passes float64's range (a stream's weight column, checked only
        # as it is read) end in inf sums, which the result's check refuses by name: no warning here
        with np.errstate(over="ignore"):
            s["float_correct"] += np.ldexp(np.asarray(c, np.float64), -shift)
            s["float_counts"] += np.ldexp(np.asarray(k, np.float64), -shift[:, None])
            s["cf"] += np.ldexp(np.asarray(m, np.float64), -shift)
            # the weights as the device summed them (float32-rounded), so ratios divide like by like
            s["wsum"] += np.ldexp(wd.astype(np.float64).sum(1), -shift)

    def state(self) -> dict:
        return self.s


def result_from_state(s: dict, *, has_adopt: bool, w2d: bool, batched: bool, total=None) -> SweepResult:
    """A ``SweepResult`` from (summed) ``Reducer`` states.

    Args:
      s: a ``Reducer.state()``, or the sum of several (``distributed.combine``).
      has_adopt: labels were given (else ``accuracy`` is None).
      w2d: the caller's weights had a W axis (else it is dropped).
      batched: the caller's configs were a batch (else the K axis is dropped).
      total: the weights' float64 totals (W,), when known; else the state's own.

    Returns:
      A ``SweepResult`` of float64 NumPy arrays.
    """
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


def check_pass_options(record_chunk, engine) -> None:
    """ValueError naming ``record_chunk`` (not a positive int) or ``engine`` (not one of ``ENGINES``)."""
    if isinstance(record_chunk, bool) or not isinstance(record_chunk, (int, np.integer)) or record_chunk < 1:
        raise ValueError(f"record_chunk: expected a positive int, got {record_chunk!r}")
    if engine not in ENGINES:
        raise ValueError(f"engine: expected one of {ENGINES}, got {engine!r}")


def engine_for_mesh(engine: str, mesh_shape) -> str:
    """An explicit ``mesh_shape`` asks for the jax engine (the only one on a device mesh): "auto" then
    means "jax", and another engine is a ValueError."""
    if mesh_shape is None:
        return engine
    if engine not in ("auto", "jax"):
        raise ValueError(f"mesh_shape: only the jax engine runs on a device mesh, got engine={engine!r}")
    return "jax"


def pass_layout(K: int, N: int, record_chunk: int, mesh_shape) -> tuple[int, int, tuple[int, int]]:
    """(passes, records per pass, (config shards, record shards)) for N records: equal passes (one
    compilation), each a multiple of the record shards so the records axis splits evenly.

    Args:
      K: configs in the batch.
      N: records to sweep.
      record_chunk: the most records per pass.
      mesh_shape: the caller's (a, r), or None to choose one (``mesh.mesh_shape``).

    Returns:
      (passes, records per pass, (a, r)).

    Raises:
      ValueError: a ``mesh_shape`` that does not fit the local devices.
    """
    n_dev = len(jax.local_devices())
    n_pass = -(-N // int(record_chunk))
    size = -(-N // n_pass)
    if mesh_shape is None:
        shape = _meshes.mesh_shape(n_dev, K, size)
    else:
        shape = _meshes.check_mesh_shape(mesh_shape, n_dev)
    r = shape[1]
    return n_pass, -(-size // r) * r, shape
