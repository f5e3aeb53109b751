"""Batches of configs: building them (``config_grid``, ``stack_configs``), measuring them
(``batch_size``) and checking every config of one against the fields' declared ranges.

A *batch of configs* is an ``MDLConfig`` whose numeric leaves all carry a leading axis K; its static
fields (dims, QR seed, the five ablations) are shared. This module is its own job, apart from the pass
machinery that scores a batch (``passes``) and the ``sweep`` call that drives both: a batch is a value
any caller may build, check and hand to ``sweep``, ``sweep_parquet`` or ``jax.vmap`` alike. The public
names are re-exported by ``mdl_jax.controller.sweep``, where they were first defined.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from mdl_jax.controller import config as _config
from mdl_jax.controller.config import NUMERIC_FIELDS, MDLConfig
from mdl_jax.controller.validation import ArrayLike, plain

# The unbatched rank of each numeric leaf (bias may also be a (D,) vector: rank 1), and the length of
# each vector field, from the fields' declarations.
_BASE_RANK = {f: len(s.shape) for f, s in _config.field_specs().items() if s.leaf}
_SIZES = {f: s.shape[0] for f, s in _config.field_specs().items() if s.leaf and len(s.shape) == 1}
# Fields that may also hold one value per coordinate, (D,) per config (bias).
_OR_D = tuple(f for f, s in _config.field_specs().items() if s.leaf and s.or_d_vector)
# Names for one component of a vector field, so a grid can vary it alone.
COMPONENTS = _config.components()


# Bytes per config that config_grid holds at its peak (float64 leaves broadcast, indices, the float32
# batch: about 340 measured); the batch it returns keeps about 60.
_GRID_BYTES = 400


def _physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def _leaf(cfg: MDLConfig, f: str) -> np.ndarray:
    try:
        return np.asarray(getattr(cfg, f), dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{f}: expected real numbers, got {getattr(cfg, f)!r}") from None


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


def check_batch(configs: MDLConfig, K: int) -> None:
    """Every config of a batch finite and inside its field's declared range.

    Args:
      configs: a batch of K configs (numeric leaves with a leading axis K).
      K: its batch size (``batch_size(configs)``).

    Raises:
      ValueError: naming the field, what was expected and the first bad config's index.
    """
    # Each leaf's per-config shape, as the field declares it (a (K, 2) thresholds would otherwise be
    # read as two thresholds and a default, or fail deep inside the program)
    leaves = {f: _leaf(configs, f) for f in NUMERIC_FIELDS}
    for f, a in leaves.items():
        want = (_SIZES[f],) if f in _SIZES else ()
        if a.shape[1:] != want and not (f in _OR_D and a.shape[1:] == (configs.D,)):
            said = f"{want[0]} values" if want else "one value" + (f" or D = {configs.D}" if f in _OR_D else "")
            raise ValueError(f"{f}: expected {said} per config of the batch, got shape {a.shape} for {K} configs")
    # The declared ranges, read once by config.field_violations; each leaf as (K, per-config values)
    values = {f: a.reshape(K, -1) for f, a in leaves.items()}
    values = {f: (v if f in _SIZES else v[:, 0] if v.shape[1] == 1 else v) for f, v in values.items()}
    for f, mask, what, _ in _config.field_violations(values):
        # the first bad config (field_violations lists only rules some config breaks); a per-coordinate
        # field (a (K, D) bias): a config is bad if any of its values is
        k = int(np.argmax(np.reshape(mask, (K, -1)).any(1)))
        v = np.asarray(getattr(configs, f))[k]
        shown = plain(v) if np.ndim(v) == 0 else "(" + ", ".join(plain(x) for x in v) + ")"
        raise ValueError(f"{f}: expected {what}; config {k} of the batch has {f} = {shown}")


def as_batch(cfg: MDLConfig) -> tuple[MDLConfig, int, bool]:
    """A sweep's ``configs`` as a batch: a single config becomes a batch of one.

    Args:
      cfg: a single ``MDLConfig`` or a batch of them.

    Returns:
      (the batch, K, whether ``cfg`` was already a batch).

    Raises:
      TypeError: ``cfg`` is not an ``MDLConfig``.
      ValueError: leaves of the batch that disagree on K (as ``batch_size``).
    """
    if not isinstance(cfg, MDLConfig):
        raise TypeError(f"configs: expected an MDLConfig (a batch from config_grid/stack_configs) or a "
                        f"sequence of them, got {type(cfg).__name__}")
    K = batch_size(cfg)
    if K is None:
        return stack_configs([cfg]), 1, False
    # every leaf as one array: a Python list is a pytree of many leaves to JAX's tree functions
    leaves = {f: getattr(cfg, f) for f in NUMERIC_FIELDS}
    if any(isinstance(v, (list, tuple)) for v in leaves.values()):
        cfg = with_leaves(cfg, {f: np.asarray(v, np.float32) if isinstance(v, (list, tuple)) else v
                                for f, v in leaves.items()})
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
      ValueError: no configs; a batch among them or static fields that differ (naming the index); a
        field whose shape differs between configs.
      TypeError: an entry that is not an ``MDLConfig`` (naming the index).
    """
    configs = list(configs)
    if not configs:
        raise ValueError("configs: expected at least one MDLConfig")
    first = configs[0]
    for i, c in enumerate(configs):
        if not isinstance(c, MDLConfig):
            raise TypeError(f"configs[{i}]: expected an MDLConfig, got {type(c).__name__}")
        if batch_size(c) is not None:
            raise ValueError(f"configs[{i}]: expected a single config, got a batch of {batch_size(c)}; "
                             "stack single configs (a list of batches sweeps as they are: sweep(..., [b1, b2]))")
        if _config.flatten(c)[1] != _config.flatten(first)[1]:
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
    return with_leaves(first, leaves)


def with_leaves(template: MDLConfig, leaves: dict) -> MDLConfig:
    """``template``'s static fields with new numeric leaves, without the single-config checks (the
    leaves may be a batch; ``check_batch`` checks one).

    Args:
      template: the config whose static fields are kept.
      leaves: {numeric field: value or array}, every field of ``NUMERIC_FIELDS``.

    Returns:
      An ``MDLConfig``.
    """
    return _config.unflatten(_config.flatten(template)[1], [leaves[f] for f in NUMERIC_FIELDS])


def config_grid(base: MDLConfig | None = None, **axes: ArrayLike) -> MDLConfig:
    """The Cartesian product of named value lists, as a batch of K = ∏ len(values) configs.

    Keywords are numeric fields (``sigma=[...]``, ``eps_c``, ``n_min``, ``n_max``, ``bias``; vector
    fields take a list of tuples, e.g. ``gate_coeffs=[(0.3, 0.7), (0.1, 0.9)]``) or one component of a
    vector field (``g_a``, ``g_b``, ``g_A_a``, ``g_A_b``, ``s_wm``, ``s_r``, ``s_a``, ``theta0``,
    ``theta1``, ``theta2``). Order is C order: the first keyword varies slowest, so results reshape to
    ``(len(axis1), len(axis2), ...)``. Other fields come from ``base`` (the paper defaults when None).
    Every config is checked by ``MDLConfig``'s rules (finite, σ ≥ 2^-63, gains ≥ 0, ε_c = 0 or
    0 < ε_c < min gains, θ descending in [0, 1], n_max > n_min): a bad value is a ValueError naming the
    field and the config's index.

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
        outside its domain (naming the field and the config's index); a batched ``base``; a
        component beside its whole field (``g_a`` and ``gate_coeffs``); a grid whose build (about
        400 bytes a config) would not fit in this machine's memory.
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
        if np.any(np.abs(arr) > np.finfo(np.float32).max):   # the batch is float32: it would be inf
            i = int(np.argwhere((np.abs(arr) > np.finfo(np.float32).max).reshape(len(arr), -1).any(1))[0][0])
            raise ValueError(f"{name}: expected values a float32 holds (|v| ≤ 3.4e38, the configs' dtype); "
                             f"{name}[{i}] = {vals[i]!r}")
        names.append(name)
        values.append(arr)
    for name in names:   # a component beside its whole field: one axis would silently set the other
        if name in COMPONENTS and COMPONENTS[name][0] in names:
            raise ValueError(f"{name}, {COMPONENTS[name][0]}: a component and its whole field in one grid; "
                             f"vary {name} alone or {COMPONENTS[name][0]} alone")
    K = int(np.prod([len(v) for v in values], dtype=np.float64))
    need, have = K * _GRID_BYTES, _physical_memory()
    if have and need > have:   # it would be killed for memory part-way, not fail
        raise ValueError(f"axes: {K:,} configs (the product of the axes' lengths) need about "
                         f"{need / 2**30:.1f} GiB to build, over this machine's {have / 2**30:.1f} GiB of "
                         "memory; split the grid over several sweeps")
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
    out = with_leaves(base, {f: v.astype(np.float32) for f, v in leaves.items()})
    check_batch(out, K)
    return out


def bootstrap_weights(n: int, n_resamples: int, seed: int = 0, *, groups=None) -> np.ndarray:
    """Bootstrap resamples as per-record multiplicity weights for ``sweep(..., weights=...)``.

    A record's decision does not depend on how often it was drawn, so ``sweep`` decides each
    (config, record) once and scores every resample exactly as one weighted sum.

    Args:
      n: the number of records N, a positive int.
      n_resamples: the number of resamples W, a positive int.
      seed: seed of ``numpy.random.default_rng`` (any value it takes).
      groups: None, or (n,) labels of the records' groups (a question id, say): then whole groups are
        drawn, G draws with replacement from the G groups, and each record weighs what its group was
        drawn (the cluster bootstrap). Records that share a question are not independent: resampled
        one by one, they give intervals too narrow.

    Returns:
      (n_resamples, n) float32 array: row w holds how often each record was drawn in n draws with
        replacement from n records (integers summing to n); with ``groups``, how often its group was.

    Raises:
      ValueError: ``n`` or ``n_resamples`` not a positive int, a ``seed`` ``default_rng`` refuses, or
        ``groups`` not n labels (naming it).
    """
    if not (isinstance(n, (int, np.integer)) and n > 0):
        raise ValueError(f"n: expected a positive int, got {n!r}")
    if not (isinstance(n_resamples, (int, np.integer)) and n_resamples > 0):
        raise ValueError(f"n_resamples: expected a positive int, got {n_resamples!r}")
    try:
        rng = np.random.default_rng(seed)
    except (TypeError, ValueError) as e:  # -1, 1.5, "x": NumPy's words would not name the argument
        raise ValueError(f"seed: expected a seed numpy.random.default_rng takes (an int ≥ 0), got {seed!r} "
                         f"({e})") from None
    if groups is not None:
        # as objects: NumPy would turn [1, "1"] into two equal strings
        labels = groups if isinstance(groups, np.ndarray) else np.array(list(groups) + [None], object)[:-1]
        if labels.shape != (n,):
            raise ValueError(f"groups: expected {n} labels (one per record), got shape {labels.shape}")
        if labels.dtype == object and len(kinds := {type(x).__name__ for x in labels}) > 1:
            raise ValueError(f"groups: expected labels of one type, got {', '.join(sorted(kinds))}")
        if labels.dtype.kind in "fcO" and (nan := np.flatnonzero([x != x for x in labels.tolist()])).size:
            raise ValueError(f"groups: expected a label for every record, got NaN at index {int(nan[0])}")
        try:
            _, inverse = np.unique(labels, return_inverse=True)
        except TypeError as e:  # labels of a type that does not order
            raise ValueError(f"groups: expected labels that can be ordered ({e})") from None
        G = int(inverse.max()) + 1
        return rng.multinomial(G, np.full(G, 1.0 / G), size=n_resamples).astype(np.float32)[:, inverse.ravel()]
    return rng.multinomial(n, np.full(n, 1.0 / n), size=n_resamples).astype(np.float32)
