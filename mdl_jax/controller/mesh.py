"""Device meshes for the sweep and tuning programs: a 2-D mesh (batch axis × records axis).

A sweep has K configs and N records, a tuning run B runs and N records. Sharding the batch axis needs
no communication (each device owns whole configs or runs); sharding the records axis turns each
per-config sum over records into a cross-device sum that XLA inserts (a small all-reduce per pass or
step). So the records axis is split only where the batch axis cannot keep every device busy: K = 1
config on 4 devices runs as a (1, 4) mesh, 441 configs as (4, 1).

    mesh_shape(n_dev=4, n_batch=441, n_records=2**18)   # (4, 1)
    mesh_shape(n_dev=4, n_batch=1, n_records=2**18)     # (1, 4)
    mesh_shape(n_dev=4, n_batch=6, n_records=2**18)     # (2, 2): 3 configs × N/2 records per device
"""

from __future__ import annotations

import functools

import jax
import numpy as np
from jax.sharding import Mesh

# A shape whose per-device work is within this share of the best one is taken if it shards the batch
# axis more: the cross-device sums of a records split are cheap but not free.
_SLACK = 0.05


def mesh_shape(n_dev: int, n_batch, n_records: int) -> tuple[int, int]:
    """(batch shards, record shards) with product ``n_dev`` that minimises the padded work per device,
    Σ_groups ceil(n_batch / a) · ceil(n_records / r); near-ties go to the larger batch split.

    ``n_batch``: the batch size, or the sizes of groups run one after another, each padded to whole
    batch shards (tuning's field-set groups)."""
    groups = [int(n_batch)] if np.ndim(n_batch) == 0 else [int(g) for g in n_batch]
    shapes = [(a, n_dev // a) for a in range(1, n_dev + 1) if n_dev % a == 0]
    cost = {s: sum(-(-g // s[0]) for g in groups) * -(-max(n_records, 1) // s[1]) for s in shapes}
    best = min(cost.values())
    return max(s for s in shapes if cost[s] <= best * (1 + _SLACK))


def check_mesh_shape(shape, n_dev: int, name: str = "mesh_shape") -> tuple[int, int]:
    """A caller's (batch shards, record shards): two positive ints whose product is at most the number
    of local devices (the mesh takes the first a·r of them). ValueError naming ``name`` otherwise."""
    try:
        a, r = (int(x) for x in shape)
        ok = all(float(x) == int(x) and not isinstance(x, bool) for x in shape)
    except (TypeError, ValueError):
        ok = False
    if not ok or a < 1 or r < 1:
        raise ValueError(f"{name}: expected two positive ints (batch shards, record shards), got {shape!r}")
    if a * r > n_dev:
        raise ValueError(f"{name}: {a} × {r} = {a * r} devices, but only {n_dev} local device"
                         f"{'s are' if n_dev != 1 else ' is'} available")
    return a, r


@functools.cache
def make_mesh(shape: tuple[int, int], names: tuple[str, str], across_processes: bool = False) -> Mesh | None:
    """The mesh of the first a·r local devices (None for one device: nothing to shard).

    Local devices by default, not ``jax.devices()``: under ``jax.distributed`` every process sweeps
    its own share of the records on its own devices and the processes' sums are combined afterwards
    (``mdl_jax.controller.distributed``). ``across_processes``: every process's devices (a tuning run
    that spans processes, ``distributed.tune_many``)."""
    a, r = shape
    if a * r == 1 and not across_processes:
        return None
    devs = (jax.devices() if across_processes else jax.local_devices())[: a * r]
    return Mesh(np.array(devs).reshape(a, r), names)
