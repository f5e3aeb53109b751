"""Gradient tuning of the controller's numeric fields (the paper's future work), still white-box.

    result = tune(M, R, A, adopt, fields=("gate_coeffs", "thresholds"))
    result.config            # an MDLConfig: the same controller, some numbers moved
    result.history           # loss, accuracies, temperature per step; best step; soft/hard disagreement

The objective is the binary decision of Section 5.3 (adopt ⇔ ACTIVE): the soft decision
P(adopt) = sigmoid((C_final − θ0) / τ) against oracle labels, a weighted cross-entropy (optional
per-record weights, e.g. a hallucination at A ≥ 0.70 costing more). τ follows an optax schedule, by
default geometric from 0.05 to 0.002 (``GeometricTemperature``), so at the end the soft controller is
the hard one on the training records; ``history["disagreement"]`` is the share of training records
where the two still differ (soft argmax of the four action probabilities vs ``decide``'s action).

The parametrisation keeps the paper's invariants at every step (no projection, no clipping; the maps
are in ``tune_params``). Fields outside ``fields`` are not parameters at all: they are the starting
config's values, exactly (also where the free parametrisation could only approach them: ε_c = 0,
θ0 = 1, a zero gain), and the trained fields are constrained around them: gains trained beside a
frozen ε_c are softplus(u_k) + ε_c + 1e-3, n_min trained beside a frozen n_max is
n_max − softplus(w) − 1e-3, ε_c trained beside frozen gains is bounded by their minimum (0 when a gain
is 0). The field set is static per group of runs, so different field sets still train side by side in
one program (``tune_many``), and their gradients are also masked so a frozen parameter's Adam update
is exactly 0.

Divergence: a step whose loss, gradients, parameters or config are not finite or break an invariant
(float32 rounding far out, e.g. n_min + 1e-3 == n_min at |n_min| ~ 1e37) is not applied; the run stops
with its last valid parameters, ``history["diverged_step"]`` records the step (−1: never) and
``tune_many`` warns, naming the run, instead of failing later on an invalid field.

Seeds are ints in [0, 2**64); seed s's PRNG key is its two 32-bit halves (what
``jax.random.PRNGKey(s)`` gives for s < 2**32), so distinct seeds never share a start.

Settings are one frozen ``TuneSettings`` value: steps, the optimiser (any optax
GradientTransformation; by default Adam on a warmup-cosine schedule, ``default_optimizer``), the
temperature schedule, patience and the start points' noise. Full batch. Early stopping on a
validation part: the parameters of the best validation accuracy (hard decisions) are kept, and after
``patience`` steps without improvement a run stops moving (its updates are masked), which keeps the loop one ``lax.scan``
that vmaps over runs. ``tune_many`` trains B runs (folds × seeds × field sets, each a pair of
train/validation weight vectors over the same records) in ONE jitted program, on a 2-D (runs,
records) mesh of the local devices (Mesh + NamedSharding): runs sharded first, and records too when
the runs cannot keep every device busy (a single ``tune`` run on 4 devices: each holds N/4 records,
and the gradients are summed across them); ``tune`` is a run of one. The functions below ``tune`` and
``tune_many`` take the settings as that one value, never its fields one by one.

Four modules, one job each: ``tune_settings`` (how to train, as values), ``tune_params`` (free
parameters ↔ a valid config), ``tune_program`` (the compiled training loop) and this one, which
checks the records and runs, lays them out on the device mesh, gathers the results and warns about
runs that learnt nothing. The settings' and the parametrisation's public names, and
``FUSION_FIELDS``, are importable from here too, as before the split.
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from mdl_jax.controller import api as _api
from mdl_jax.controller import mesh as _meshes
from mdl_jax.controller.config import NUMERIC_FIELDS, STATIC_FIELDS, MDLConfig
from mdl_jax.controller.tune_params import field_mask, from_unconstrained, to_unconstrained
from mdl_jax.controller.tune_program import (
    FUSION_FIELDS,
    Records,
    Run,
    constrained_fields,
    head,
    start_points,
    train_groups,
)
from mdl_jax.controller.tune_settings import (
    GeometricTemperature,
    TuneSettings,
    check_temperature,
    default_optimizer,
    learning_rate_of,
    resolve_settings,
)
from mdl_jax.controller.validation import (
    ArrayLike,
    binary_labels,
    check_unit_interval,
    check_weight_values,
    common_shape,
)

__all__ = [
    "FIELD_SETS", "FUSION_FIELDS", "MIN_RECORDS", "GeometricTemperature", "TuneResult", "TuneRuns",
    "TuneSettings", "default_optimizer", "field_mask", "from_unconstrained", "to_unconstrained",
    "train_runs", "tune", "tune_many", "tune_many_settings",
]

FIELD_SETS = {"gates": ("gate_coeffs", "thresholds"), "all": NUMERIC_FIELDS}
# Fewer records than the "gates" field set has numbers (5) cannot pin them down; `mdl-jax tune` also
# needs one record per fold of its 5-fold cross-validation.
MIN_RECORDS = 5


class TuneResult(NamedTuple):
    """``config``: the tuned config. ``history``: per-step arrays ("loss", "train_accuracy",
    "val_accuracy", "temperature", and the constrained "sigma", "eps_c", "min_gain", "thresholds",
    "n_min", "n_max" after each step) and scalars ("best_step", "stopped_step", "best_val_accuracy",
    "diverged_step", "disagreement": share of training records where soft argmax ≠ hard action at the
    end, "adopt_share": share of training records decided Active).

    Attributes:
      config: the tuned ``MDLConfig``: the kept parameters (those of the best validation accuracy,
        or the last step's without a validation part), its trained fields as plain floats / tuples;
        fields outside ``fields`` are the starting config's values, exactly.
      history: a dict of NumPy arrays. Per-step series, shape (steps,) (``thresholds``:
        (steps, 3)): ``"loss"`` (weighted cross-entropy), ``"train_accuracy"`` and
        ``"val_accuracy"`` (hard decisions, adopt ⇔ Active; validation accuracy is 0 without a
        validation part) of the parameters entering step k, before its update; ``"temperature"``
        (τ at step k); ``"sigma"``, ``"eps_c"``, ``"min_gain"`` (min of the gains),
        ``"thresholds"``, ``"n_min"``, ``"n_max"``: the constrained config values after step k's
        update. Scalars, shape (): ``"best_step"`` (int32: the step whose parameters were kept;
        steps − 1 without a validation part), ``"best_val_accuracy"`` (float32, the validation
        accuracy at ``best_step``), ``"stopped_step"`` (int32: the step at which early stopping,
        ``patience`` steps without a better validation accuracy, or divergence stopped the run;
        ``steps`` when it never stopped), ``"diverged_step"`` (int32: the step whose update was
        not finite or broke an invariant and was not applied; −1: never), ``"disagreement"``
        (float32: share of training records where the soft argmax at the final temperature ≠ the
        hard action, for the kept parameters) and ``"adopt_share"`` (float32: share of training
        records the kept parameters decide Active; 0 or 1 is warned about). After
        ``stopped_step`` the run no longer moves: every later entry scores the same frozen
        parameters (the accuracies and field values repeat; ``"loss"`` still changes because τ
        keeps annealing), so only steps up to ``stopped_step`` describe training.
    """

    config: MDLConfig
    history: dict



class TuneRuns(NamedTuple):
    """B runs over the same N records, as one value: what ``train_runs`` trains.

    Attributes:
      train_weights: (B, N) per-record weights of each run's training part (0 = not in it); a fold is
        a pair of weight vectors. Scale-free: each run's weights are divided by their largest (in
        float64) first, so only their ratios count, and uniform weights of any positive scale train
        exactly as unweighted.
      val_weights: (B, N) per-record weights of each run's validation part, scale-free too. It may be
        all zero (then the last step is kept: no early stopping signal).
      field_sets: B tuples of field names to train (e.g. ``FIELD_SETS["gates"]``).
      seeds: B ints in [0, 2**64); a run starts from the config plus N(0, init_noise²) noise on its
        trained free parameters (none for seed 0), so seeds give different starting points.
    """

    train_weights: ArrayLike
    val_weights: ArrayLike
    field_sets: Sequence[Sequence[str]]
    seeds: Sequence[int]


def _check_signals(M, R, A, adopt):
    for n, x in (("M", M), ("R", R), ("A", A)):
        check_unit_interval(n, x)
    shape = common_shape(("M", "R", "A"), (M, R, A))
    if len(shape) != 1 or shape[0] < MIN_RECORDS:
        raise ValueError(f"M: expected 1-d signals of at least {MIN_RECORDS} records to tune on, got "
                         f"shape {shape}")
    N = shape[0]
    y = binary_labels(adopt, N)
    return [jnp.broadcast_to(jnp.asarray(x, jnp.float32), (N,)) for x in (M, R, A)] + \
        [jnp.asarray(y)], N


def _check_weights(name: str, w, B: int, N: int) -> jax.Array:
    """(B, N) weights, checked, each run's divided by its largest in float64: the loss is a weighted
    mean, so only their ratios count, and in float32 a weight of 1e-40 is flushed to zero by XLA and
    a sum of weights of 3e38 overflows. Uniform weights of any positive scale become exactly 1, the
    unweighted run's."""
    w = _float64_weights(name, w)
    if w.shape != (B, N):
        raise ValueError(f"{name}: expected shape ({B}, {N}), got {w.shape}")
    check_weight_values(name, w)
    top = w.max(axis=1, keepdims=True) if N else np.zeros((B, 1))
    return jnp.asarray(np.divide(w, top, out=np.zeros_like(w), where=top > 0).astype(np.float32))



def tune_many_settings(settings: TuneSettings | None, options: dict, who: str = "tune_many") -> TuneSettings:
    """The settings ``tune_many`` trains with, from its deprecated setting keywords.

    ``tune_many(..., steps=300)`` still trains as ``settings=TuneSettings(steps=300)`` for one release,
    with a DeprecationWarning naming that replacement.

    Args:
      settings: ``TuneSettings``, or None for the defaults.
      options: the setting keywords given ({} when none).
      who: the calling function's name, for the messages.

    Returns:
      ``TuneSettings``.

    Raises:
      TypeError, ValueError: as ``tune``'s settings.

    Warns:
      DeprecationWarning: any setting keyword given.
    """
    resolved = resolve_settings(settings, options, who)
    if options:
        given = ", ".join(f"{k}=..." for k in sorted(options))
        warnings.warn(f"{who}: setting keywords ({given}) are deprecated; pass settings=TuneSettings("
                      f"{given}) instead", DeprecationWarning, stacklevel=3)
    return resolved


def tune_many(M, R, A, adopt, *, train_weights, val_weights, field_sets: Sequence[Sequence[str]],
              seeds: Sequence[int], config: MDLConfig | None = None, settings: TuneSettings | None = None,
              mesh_shape: tuple[int, int] | None = None, **options):
    """B runs in one jitted, vmapped program over the same (N,) records.

    Examples:
      >>> wt = np.stack([np.arange(N) % 5 != f for f in range(5)]).astype(np.float32)   # 5 folds
      >>> configs, history = tune_many(M, R, A, adopt, train_weights=wt, val_weights=1 - wt,
      ...                              field_sets=[FIELD_SETS["gates"]] * 5, seeds=[0] * 5,
      ...                              settings=TuneSettings(steps=300))     # doctest: +SKIP

    Args:
      M: (N,) relevance in [0, 1], as ``tune``.
      R: (N,) reliability, as ``M``.
      A: (N,) task risk, as ``M``.
      adopt: (N,) binary oracle labels, as ``tune``.
      train_weights: (B, N) per-record weights of each run's training part (``TuneRuns``).
      val_weights: (B, N) per-record weights of each run's validation part (``TuneRuns``).
      field_sets: B tuples of field names to train (e.g. ``FIELD_SETS["gates"]``).
      seeds: B ints (``TuneRuns``).
      config: the starting ``MDLConfig``; the paper's defaults when None.
      settings: ``TuneSettings`` (steps, optimizer, temperature, patience, init_noise); the defaults
        when None.
      mesh_shape: (run shards, record shards) of the 2-D device mesh over the first a·r local
        devices; default: chosen from the runs, N and the device count (``mesh.mesh_shape``).
      **options: deprecated, for one release: the settings' fields as keywords (``steps=300``); pass
        ``settings=TuneSettings(steps=300)``.

    Returns:
      (configs: list of B tuned MDLConfigs, history: dict of (B, steps) arrays and (B,) scalars).

    Raises:
      ValueError, TypeError: as ``tune``, and ``seeds`` not one per run.

    Warns:
      RuntimeWarning: as ``tune``. DeprecationWarning: a setting given as a keyword.
    """
    settings = tune_many_settings(settings, options)
    return train_runs(M, R, A, adopt, TuneRuns(train_weights, val_weights, field_sets, seeds),
                      config=config, settings=settings, mesh_shape=mesh_shape)


def _field_names(fields, name: str) -> tuple:
    """``fields`` as a tuple of names; a str is a ValueError naming ``name`` (its tuple would be a set of
    one-letter fields, reported as unknown ones), and so is anything that is not a collection of strs
    (None, a number, bytes). Any collection of names is one (a list, a set, a NumPy array of str):
    the trained fields are a subset, their order is not used."""
    if isinstance(fields, str):
        raise ValueError(f"{name}: expected a sequence of field names, got the str {fields!r} "
                         f"(one field: ({fields!r},))")
    try:
        names = tuple(fields) if isinstance(fields, Iterable) and not isinstance(fields, bytes) else None
    except TypeError:  # a 0-d NumPy array
        names = None
    if names is None or not all(isinstance(f, str) for f in names):
        raise ValueError(f"{name}: expected a sequence of field names, got {fields!r}")
    return tuple(str(f) for f in names)  # a NumPy str_ as a plain str


def _run_list(values, name: str) -> list:
    """One entry per run (``field_sets``, ``seeds``) as a list; anything but a sequence (None, a number,
    a set, whose order is not the runs') is a ValueError naming ``name``; an iterator (a generator) gives
    its entries in order, so it is one."""
    if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, np.ndarray, Iterator)):
        raise ValueError(f"{name}: expected a sequence with one entry per run, got {type(values).__name__}")
    return list(values)


def _float64_weights(name: str, w) -> np.ndarray:
    """Weights as a float64 array, or a ValueError naming ``name`` (text, a ragged list, None)."""
    try:
        a = np.asarray(w, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name}: expected finite, non-negative weights ({e})") from None
    return a


def train_runs(M, R, A, adopt, runs: TuneRuns, *, config: MDLConfig | None = None,
               settings: TuneSettings | None = None, mesh_shape: tuple[int, int] | None = None,
               across_processes: bool = False) -> tuple[list[MDLConfig], dict]:
    """``tune_many``'s work, its runs and settings as two values.

    Args:
      M: (N,) relevance, as ``tune_many``.
      R: (N,) reliability, as ``tune_many``.
      A: (N,) task risk, as ``tune_many``.
      adopt: (N,) binary oracle labels, as ``tune_many``.
      runs: the B runs (``TuneRuns``).
      config: the starting ``MDLConfig``; the paper's defaults when None.
      settings: ``TuneSettings``; the defaults when None.
      mesh_shape: as ``tune_many``.
      across_processes: the mesh spans every process's devices (``distributed.tune_many``); every
        process passes the same records and runs.

    Returns:
      As ``tune_many``.

    Raises:
      ValueError, TypeError: as ``tune_many``.

    Warns:
      RuntimeWarning: as ``tune``.
    """
    settings = resolve_settings(settings, {}, "train_runs")
    base = config if config is not None else MDLConfig()
    if isinstance(base, (str, os.PathLike)):  # decide and calibrate take a path; say what to do here
        raise TypeError(f"config: expected an MDLConfig, got the path {os.fspath(base)!r}; tuning takes no "
                        "config file: pass load_config(path)")
    if not isinstance(base, MDLConfig):
        raise TypeError(f"config: expected an MDLConfig, got {type(base).__name__}")
    _api.resolve_config(base)  # a batch of configs: a ValueError naming the field, as decide's and calibrate's
    records, N = _check_signals(M, R, A, adopt)
    check_temperature(settings)
    field_sets = [_field_names(fs, f"field_sets[{b}]") for b, fs in enumerate(_run_list(runs.field_sets, "field_sets"))]
    seeds = _run_list(runs.seeds, "seeds")
    B = len(field_sets)
    if B == 0:
        raise ValueError("field_sets: expected at least one run, got none")
    if len(seeds) != B:
        raise ValueError(f"seeds: expected {B} seeds (one per run), got {len(seeds)}")
    wt = _check_weights("train_weights", runs.train_weights, B, N)
    wv = _check_weights("val_weights", runs.val_weights, B, N)
    _check_labels(records[3], wt)
    prng = np.stack([_seed_key(s, "seeds" if B > 1 else "seed") for s in seeds])
    noise = np.array([settings.init_noise * (int(s) != 0) for s in seeds], np.float32)
    for fs in field_sets:
        field_mask(fs)  # an unknown or empty field set fails here, naming it
    chex.assert_shape(records, (N,))
    # Runs grouped by field set (static: whether the fusion must be recomputed every step).
    keys = list(dict.fromkeys(tuple(sorted(fs)) for fs in field_sets))
    members = [[b for b, fs in enumerate(field_sets) if tuple(sorted(fs)) == k] for k in keys]
    # Across processes (distributed.tune_many) the mesh holds every process's devices and every
    # process passes the same records: each device trains its runs on its records, and the
    # cross-device sums of the loss and gradients go between processes too.
    n_dev = jax.device_count() if across_processes else len(jax.local_devices())
    shape = (_meshes.mesh_shape(n_dev, [len(i) for i in members], N) if mesh_shape is None
             else _meshes.check_mesh_shape(mesh_shape, n_dev))
    mesh = _meshes.make_mesh(shape, ("runs", "records"), across_processes)
    fused = tuple(any(f in FUSION_FIELDS for f in k) for k in keys)
    static = _static_base(base)
    with jax.enable_x64(False):  # float32 throughout, as without x64: the frozen fields' constants too
        data, groups = _placed(records, _Layout(base, field_sets, keys, members, prng, noise, wt, wv), shape, mesh)
        res = train_groups(tuple(groups), data, base=static, kinds=tuple(zip(keys, fused)),
                           settings=settings, mesh=mesh)
        configs, history = _gathered(res, base, field_sets, keys, members)
    _warn_about_runs(history, field_sets, seeds, settings)
    return configs, history


class _Layout(NamedTuple):
    """The runs as ``train_runs`` checked them: the base config, each run's field set, the distinct
    field sets (sorted) with their runs' indices, the runs' PRNG keys, start-point noise scales and
    normalised weights."""

    base: MDLConfig
    field_sets: list
    keys: list
    members: list
    prng: np.ndarray
    noise: np.ndarray
    wt: jax.Array
    wv: jax.Array


def _check_labels(y, wt) -> None:
    y_np = np.asarray(y)
    B = len(wt)
    for b in range(B):
        on = np.asarray(wt[b]) > 0
        if not on.any():
            raise ValueError("train_weights: expected at least one training record (a weight > 0), got none"
                             + (f" in run {b}" if B > 1 else ""))
        if np.all(y_np[on]) or not np.any(y_np[on]):
            which = "adopt (1)" if y_np[on][0] else "reject (0)"
            raise ValueError(f"adopt: expected both labels among the training records, got {int(on.sum())} "
                             f"that are all {which}" + (f" (run {b})" if B > 1 else "")
                             + "; there is nothing to separate")


def _placed(records, layout: _Layout, shape: tuple[int, int], mesh):
    """The records and each group's runs, padded to whole shards of the (runs, records) mesh and placed
    on it: (``Records``, one ``Run`` per group).

    Each group is padded to whole run shards by repeating its last run, and the records to whole record
    shards by weight-0 records (in neither part of any run: they change no sum), both dropped from the
    results. Everything per run is built in a couple of vectorised calls, not B rounds of small eager
    JAX ops, whose dispatch would outweigh the training of a small field set."""
    base, field_sets, keys, members, prng, noise, wt, wv = layout
    masks = {f: np.array([f in fs for fs in field_sets], np.float32) for f in NUMERIC_FIELDS}
    N = len(records[0])
    a, r = shape
    pad_n = -(-N // r) * r - N
    # host arrays from here: a mesh across processes is filled from each process's (equal) NumPy copy
    M, R, A, y = (np.asarray(x) for x in records)
    if pad_n:
        M, R, A = (np.concatenate([x, np.full(pad_n, 0.5, np.float32)]) for x in (M, R, A))
        y = np.concatenate([y, np.zeros(pad_n, y.dtype)])
    groups = []
    for key, idx in zip(keys, members):
        take = np.array(idx + [idx[-1]] * (-(-len(idx) // a) * a - len(idx)))
        # the start point's free parameters depend on the field set (trained fields are constrained
        # around the frozen ones), so each group maps the base config its own way
        m = {f: x[take] for f, x in masks.items()}
        u0 = start_points(to_unconstrained(base, key), m, prng[take], noise[take])
        wt_g, wv_g = (np.pad(np.asarray(x)[take], ((0, 0), (0, pad_n))) for x in (wt, wv))
        g = Run(jax.tree.map(np.asarray, u0), {f: np.asarray(x) for f, x in m.items()}, wt_g, wv_g)
        chex.assert_tree_shape_prefix(g, (len(take),))
        if mesh is not None:
            runs = NamedSharding(mesh, PartitionSpec("runs"))
            w_sh = NamedSharding(mesh, PartitionSpec("runs", "records"))
            g = Run(jax.device_put(g.u0, runs), jax.device_put(g.mask, runs),
                    jax.device_put(g.w_train, w_sh), jax.device_put(g.w_val, w_sh))
        groups.append(g)
    if mesh is not None:
        M, R, A, y = jax.device_put((M, R, A, y), NamedSharding(mesh, PartitionSpec("records")))
    return Records(M, R, A, y), groups


def _gathered(res, base: MDLConfig, field_sets: list, keys: list, members: list) -> tuple[list[MDLConfig], dict]:
    """Every group's results, padding runs dropped, back in run order: (configs, history)."""
    static = _static_base(base)
    B = len(field_sets)
    # drop the padding runs (each group's first len(idx) rows are its own runs)
    res = [jax.tree.map(functools.partial(head, n=len(idx)), g) for idx, g in zip(members, res)]
    fields = {f: np.zeros((B,) + np.shape(getattr(base, f)), np.float64) for f in NUMERIC_FIELDS}
    history: dict[str, np.ndarray] = {}
    for key, idx, (bp, hist, scalars) in zip(keys, members, res):
        take = np.array(idx)
        for f, v in constrained_fields(bp, base=static, trained=key).items():  # one call per group
            fields[f][take] = np.asarray(v)
        for k, v in {**hist, **scalars}.items():
            arr = history.setdefault(k, np.zeros((B,) + np.shape(v)[1:], np.asarray(v).dtype))
            arr[take] = np.asarray(v)
    # Fields a run does not train are the starting config's values, exactly (not a float32 round trip)
    configs = [_concrete_from(base, {f: x[b] for f, x in fields.items()}, field_sets[b]) for b in range(B)]
    return configs, history


def _warn_about_runs(history: dict, field_sets: list, seeds: list, settings: TuneSettings) -> None:
    """A RuntimeWarning for each run that diverged or learnt a constant controller, naming the number
    to lower: the learning rate of a default optimiser, else the optimiser's own step size."""
    lr = learning_rate_of(settings.resolved_optimizer)
    step_size = f"learning_rate ({lr!r})" if lr is not None else "the optimizer's step size"
    the_step_size = step_size if lr is None else "the " + step_size
    # stacklevel 4: the line that called tune or tune_many (through train_runs)
    for b in np.flatnonzero(history["diverged_step"] >= 0).tolist():
        warnings.warn(f"tune: run {b} (fields {', '.join(field_sets[b])}, seed {seeds[b]}) diverged at "
                      f"step {int(history['diverged_step'][b])} (a non-finite loss or parameter); it "
                      f"stopped there and keeps its last finite parameters. Lower {step_size}.",
                      RuntimeWarning, stacklevel=4)
    for b in np.flatnonzero((history["diverged_step"] < 0)
                            & ((history["adopt_share"] == 0) | (history["adopt_share"] == 1))).tolist():
        # The labels hold both classes (checked above): a controller that decides every training record
        # alike learnt nothing, and far too large a step lands there without a non-finite value (the
        # thresholds' sigmoids saturate at 0 or 1, where their gradient vanishes).
        which = "every" if history["adopt_share"][b] == 1 else "no"
        warnings.warn(f"tune: run {b} (fields {', '.join(field_sets[b])}, seed {seeds[b]}) adopts {which} "
                      f"training record: the tuned controller is a constant, no better than the majority "
                      f"label. Either its start decides alike and {settings.steps} steps did not move it, or "
                      f"{the_step_size} is too large: its steps saturate the thresholds.",
                      RuntimeWarning, stacklevel=4)


def _seed_key(seed, name: str) -> np.ndarray:
    """A seed's PRNG key. Seeds are ints in [0, 2**64): the key is the seed's two 32-bit halves, so no
    two seeds share a key (jax.random.PRNGKey folds seeds modulo 2**32 without x64) and every seed
    below 2**32 keeps the key PRNGKey gave it."""
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) or not 0 <= int(seed) < 2**64:
        raise ValueError(f"{name}: expected an int in [0, 2**64), got {seed!r}")
    s = int(seed)
    return np.array([s >> 32, s & 0xFFFFFFFF], np.uint32)



def _plain(v):
    """A numeric field as a plain float or tuple of floats (hashable, and what a config file holds)."""
    a = np.asarray(v, np.float64)
    return float(a) if a.ndim == 0 else tuple(float(x) for x in a)


def _static_base(base: MDLConfig) -> MDLConfig:
    # The base is a static argument of the jitted program (its static fields choose branches; its
    # numbers are replaced by the trained leaves), so it must be hashable: plain floats and tuples.
    return base.replace(**{f: _plain(getattr(base, f)) for f in NUMERIC_FIELDS})


def _concrete_from(base: MDLConfig, values: dict, trained: Sequence[str]) -> MDLConfig:
    """A config of ``base``'s static fields, the numeric ``values`` (NumPy rows) of the ``trained``
    fields as plain floats, and ``base``'s own values of the others."""
    return MDLConfig(**{f: _plain(values[f] if f in trained else getattr(base, f)) for f in NUMERIC_FIELDS},
                     **{f: getattr(base, f) for f in STATIC_FIELDS})


def tune(M: ArrayLike, R: ArrayLike, A: ArrayLike, adopt: ArrayLike, *,
         fields: Sequence[str] = FIELD_SETS["gates"], config: MDLConfig | None = None,
         weights: ArrayLike = None, val: ArrayLike = None, seed: int = 0,
         settings: TuneSettings | None = None, **options) -> TuneResult:
    """Tune ``fields`` of ``config`` (paper defaults when None) on (N,) signals and binary labels.

    The objective and the parametrisation that keeps the paper's invariants are in the module
    docstring; one run, jitted (``tune_many`` trains many in one program).

    Examples:
      >>> res = tune(M, R, A, adopt, fields=("gate_coeffs", "thresholds"), val=val_mask)
      >>> res.config.thresholds, res.history["best_step"]           # doctest: +SKIP
      >>> res.history["val_accuracy"][: int(res.history["stopped_step"]) + 1]   # doctest: +SKIP
      >>> tune(M, R, A, adopt, steps=300, optimizer=optax.sgd(0.1),                # doctest: +SKIP
      ...      temperature=optax.linear_schedule(0.05, 0.002, 300))

    Args:
      M: (N,) relevance in [0, 1], N ≥ ``MIN_RECORDS`` (5).
      R: (N,) reliability, as ``M``.
      A: (N,) task risk, as ``M``.
      adopt: (N,) binary oracle labels (bool, or numbers all 0 or 1): 1 where the memory should be
        adopted (the target is Active).
      fields: the numeric ``MDLConfig`` fields to train, a non-empty subset of
        ``NUMERIC_FIELDS``; default ``FIELD_SETS["gates"]`` = ("gate_coeffs", "thresholds"),
        ``FIELD_SETS["all"]`` trains every numeric field.
      config: the starting ``MDLConfig`` (a single config); the paper's defaults when None.
      weights: optional (N,) non-negative per-record weights of the training loss; only their
        ratios count (uniform weights of any positive scale, 1e-40 or 3e38, train exactly as none).
      val: optional (N,) validation mask/weights over the same records (early stopping); records
        with validation weight > 0 are left out of training. Scale-free too.
      seed: an int in [0, 2**64); 0 starts at ``config`` itself, any other from a jittered point of its own.
      settings: how to train, one ``TuneSettings`` value: ``steps`` (500), ``optimizer`` (an
        ``optax.GradientTransformation``; default ``default_optimizer(steps)``: Adam on a
        warmup-cosine schedule peaking at 0.05), ``temperature`` (an optax schedule, step → τ; default
        ``GeometricTemperature(0.05, 0.002, steps)``), ``patience`` (100: steps without a better
        validation accuracy before the run stops moving, only with a validation part); the defaults
        when None.
      **options: shorthands for fields of ``settings``: ``steps=300``, ``optimizer=...``,
        ``temperature=...``, ``patience=...``; each replaces that field of ``settings``
        (``tune(..., steps=10, settings=TuneSettings(steps=5))`` trains 10 steps). Deprecated, for one release (DeprecationWarning):
        ``learning_rate=x`` (use ``optimizer=default_optimizer(steps, x)``) and
        ``temperature=(start, end)`` (use ``GeometricTemperature(start, end, steps)``).

    Returns:
      A ``TuneResult``: the tuned config and the per-step history (layout in ``TuneResult``).

    Raises:
      ValueError: naming the argument: signals outside [0, 1], not 1-d or of different lengths,
        fewer than ``MIN_RECORDS`` (5) records; labels that are not binary, or of one class only
        among the training records; ``weights`` or ``val`` not of shape (N,), or negative or
        non-finite (the first such entry named), or no training record left
        (every weight 0, or every record in ``val``);
        an unknown or empty ``fields``; ``steps`` not a positive int, ``learning_rate`` not finite
        and > 0, ``temperature`` not two positive numbers or a schedule whose τ at some step is not
        finite and > 0; ``fields``, ``weights`` or ``val`` of the wrong kind (None, text); a batched ``config``, ``patience`` not an int ≥ 0, ``seed``
        outside [0, 2**64).
      TypeError: ``config`` is not an ``MDLConfig`` (a config file path is not taken here:
        ``load_config`` it first); ``settings`` not ``TuneSettings``; a keyword that is not a
        setting; ``optimizer`` not a ``GradientTransformation`` or ``temperature`` not callable.

    Warns:
      RuntimeWarning: a diverged run; it keeps its last finite parameters
        (``history["diverged_step"]``). A run whose tuned controller decides every training record
        alike (``history["adopt_share"]`` 0 or 1): what too large a ``learning_rate`` leads to without
        a non-finite value (the thresholds saturate).
      DeprecationWarning: ``learning_rate`` or a (start, end) ``temperature`` given.

    Fields outside ``fields`` come back exactly as in ``config``.
    """
    settings = resolve_settings(settings, options, "tune")
    _, N = _check_signals(M, R, A, adopt)
    # float64 until the weights are normalised (_check_weights): only their ratios count
    w = np.ones(N, np.float64) if weights is None else _float64_weights("weights", weights)
    if w.shape != (N,):
        raise ValueError(f"weights: expected shape ({N},), got {w.shape}")
    v = np.zeros(N, np.float64) if val is None else _float64_weights("val", val)
    if v.shape != (N,):
        raise ValueError(f"val: expected shape ({N},), got {v.shape}")
    check_weight_values("weights", w)
    check_weight_values("val", v)
    w_train = np.where(v > 0, 0.0, w)
    if not np.any(w_train > 0):
        raise ValueError("weights, val: expected at least one training record (weight > 0, not in val), got none")
    configs, hist = train_runs(M, R, A, adopt, TuneRuns(w_train[None], v[None], [_field_names(fields, "fields")], [seed]),
                               config=config, settings=settings)
    return TuneResult(configs[0], {k: x[0] for k, x in hist.items()})
