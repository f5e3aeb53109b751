"""Sweeps across processes and machines through JAX's multi-controller runtime (``jax.distributed``).

Every process runs the same script; each sweeps ITS share of the records on its own local devices
(any engine, the 2-D mesh), and the per-config sums of all processes are combined with one JAX
collective (``multihost_utils.process_allgather``), added in process order, so every process returns
the same ``SweepResult``, equal to one process sweeping all the records (integer sums exactly;
``mean_C_final`` to float32 rounding of its per-pass partial sums).

    # on every host (e.g. one per SLURM task; jax.distributed.initialize() reads SLURM's variables):
    from mdl_jax.controller import distributed
    distributed.initialize()                                    # or (address, num_processes, process_id)
    res = distributed.sweep_parquet("records.parquet", grid)    # row groups split between processes
    res = distributed.sweep(M_mine, R_mine, A_mine, grid, adopt=adopt_mine)   # arrays: each its own rows

Sums travel as raw bytes (int64 and float64 viewed as uint32 words), so they cross processes exactly
without JAX's 64-bit mode. Before the sums, every process says how its own part went in one small
collective (``agree``): where one process met bad input in its rows (a value out of range in its row
groups), every process raises, the others with a ``ValueError`` naming that process and its error,
instead of waiting in a collective it never joins; sums of different sizes (processes that were given
different configs, resamples or weight vectors) are refused the same way.
"""

from __future__ import annotations

import jax
import numpy as np

from mdl_jax.controller import stream as _stream
from mdl_jax.controller import sweep as _sw
from mdl_jax.controller.passes import result_from_state
from mdl_jax.controller.sweep import RECORD_CHUNK, SweepResult


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, **kwargs) -> None:
    """``jax.distributed.initialize`` (arguments as there; None lets JAX read a cluster's environment:
    SLURM, Open MPI, Kubernetes, Cloud TPU), with CPU collectives through gloo so CPU-only processes
    can combine their sums too. Call it first in every process, before any other JAX call."""
    # JAX splits the address at its last ':' and fails with an IndexError on "host" alone.
    if coordinator_address is not None and (
            not isinstance(coordinator_address, str) or not coordinator_address.rpartition(":")[0]
            or not coordinator_address.rpartition(":")[2].isdigit()):
        raise ValueError(f"coordinator_address: expected 'HOST:PORT' (e.g. '10.0.0.1:1234'), "
                         f"got {coordinator_address!r}")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address, num_processes, process_id, **kwargs)


# One process's status in ``agree``: a failed flag, its sums' size in words, and its error's text.
_STATUS_WORDS = 128
_STATUS_ERRORS = (ValueError, TypeError, ImportError, OSError)


def agree(compute):
    """``compute()`` on this process, then one collective in which every process says whether its
    call failed and how large its sums are, so that all go on to ``combine`` or all raise.

    Args:
      compute: the process's own part, returning a tuple whose first item is its reducer state.

    Returns:
      What ``compute`` returned, once every process's part succeeded with sums of one size.

    Raises:
      The process's own error where its part failed; elsewhere a ``ValueError`` naming the first
      failed process and its error, or saying that the processes' sums differ in size.
    """
    from jax.experimental import multihost_utils

    try:
        out, err = compute(), None
    except _STATUS_ERRORS as e:
        out, err = None, e
    status = np.zeros(_STATUS_WORDS, np.uint32)
    text = b"" if err is None else f"{type(err).__name__}: {err}".encode()[:(_STATUS_WORDS - 3) * 4]
    status[0] = err is not None
    status[1] = 0 if err is not None else sum(np.asarray(v).nbytes for v in out[0].values()) // 4
    status[2] = len(text)
    status.view(np.uint8)[12:12 + len(text)] = np.frombuffer(text, np.uint8)
    every = np.asarray(multihost_utils.process_allgather(status, tiled=False)).reshape(-1, _STATUS_WORDS)
    if err is not None:
        raise err
    for p, row in enumerate(every):
        if row[0]:
            said = row.view(np.uint8)[12:12 + int(row[2])].tobytes().decode("utf-8", "replace")
            raise ValueError(f"process {p} of {len(every)} failed on its share, so no process can combine "
                             f"the sums: {said}")
    if len({int(row[1]) for row in every}) != 1:
        raise ValueError("configs: the processes' sums differ in size (processes given different configs, "
                         "bootstrap resamples or weight vectors); every process must pass the same")
    return out


def combine(state: dict) -> dict:
    """Every process's reducer state (``passes.Reducer.state``) summed, in process order: the same
    dict on every process. One ``process_allgather`` of the states' bytes."""
    from jax.experimental import multihost_utils

    keys = sorted(state)
    arrays = [np.ascontiguousarray(state[k]) for k in keys]
    words = np.concatenate([a.reshape(-1).view(np.uint32) for a in arrays])
    every = np.asarray(multihost_utils.process_allgather(words, tiled=False)).reshape(-1, words.size)
    out, at = {}, 0
    for k, a in zip(keys, arrays):
        n = a.size * a.itemsize // 4
        parts = [every[p, at:at + n].copy().view(a.dtype).reshape(a.shape) for p in range(len(every))]
        out[k] = sum(parts[1:], parts[0])   # in process order: the same float64 rounding on every process
        at += n
    return out


def sweep(M, R, A, configs, *, adopt=None, weights=None, record_chunk: int = RECORD_CHUNK,
          engine: str = "jax", mesh_shape=None) -> SweepResult:
    """``sweep`` of this process's records (M, R, A, adopt, weights: its own rows; weights (W, n) with
    the same W everywhere), combined over every process: the result of one sweep over all the
    processes' rows, on every process. With one process it is ``sweep``."""
    if isinstance(configs, (list, tuple)):
        raise TypeError("configs: expected one MDLConfig batch; call once per batch")
    state, w2d, batched, _ = agree(lambda: _sw.sweep_state(
        M, R, A, configs, adopt=adopt, weights=weights, record_chunk=record_chunk, engine=engine,
        mesh_shape=mesh_shape))
    return result_from_state(combine(state), has_adopt=adopt is not None, w2d=w2d, batched=batched)


def sweep_parquet(path, configs, *, columns: dict | None = None, bootstrap: int = 0, seed: int = 0,
                  record_chunk: int = RECORD_CHUNK, engine: str = "jax", mesh_shape=None,
                  progress: bool = False) -> SweepResult:
    """``sweep_parquet`` with the file's row groups split between processes (contiguous, about equal
    rows: ``stream.row_group_share``), every process reading only its own; the same result on every
    process, equal to one process's ``sweep_parquet`` (the Poisson bootstrap is keyed by row, so
    the split does not change the weights)."""
    if isinstance(configs, (list, tuple)):
        raise TypeError("configs: expected one MDLConfig batch; call once per batch")

    def mine():
        pf, _ = _stream.open_parquet(path, columns)
        share = _stream.row_group_share(pf, jax.process_index(), jax.process_count())
        return _stream.parquet_state(
            path, configs, columns=columns, bootstrap=bootstrap, seed=seed, record_chunk=record_chunk,
            engine=engine, mesh_shape=mesh_shape, progress=progress, row_groups=share)

    state, w2d, batched, has_adopt = agree(mine)
    state = combine(state)
    _stream.check_resamples(state, bootstrap, columns)
    return _stream.finish(state, has_adopt=has_adopt, w2d=w2d, batched=batched)


def tune_many(M, R, A, adopt, *, train_weights, val_weights, field_sets, seeds, config=None, settings=None,
              mesh_shape=None, **options):
    """``tuning.tune_many`` on a (runs, records) mesh over EVERY process's devices: each device trains
    its runs on its share of the records, and the loss and gradient sums cross processes inside the
    compiled program. Every process passes the same records and arguments (unlike ``sweep``, the
    records are not split by the caller: tuning sets are small, the compute is what is shared) and
    gets the same configs and history. ``mesh_shape`` counts global devices; the setting keywords
    (``steps=...``) are deprecated as there, in favour of ``settings=TuneSettings(...)``."""
    from mdl_jax.controller import tuning as _tuning

    settings = _tuning.tune_many_settings(settings, options, "distributed.tune_many")
    runs = _tuning.TuneRuns(train_weights, val_weights, field_sets, seeds)
    return _tuning.train_runs(M, R, A, adopt, runs, config=config, settings=settings, mesh_shape=mesh_shape,
                              across_processes=True)
