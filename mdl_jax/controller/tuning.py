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

Parametrisation keeps the paper's invariants at every step (no projection, no clipping):
  σ = softplus(u) + 1e-3                         σ > 0
  s_k = softplus(u_k) + 1e-3;  ε_c = sigmoid(v)·(1 − 1e-3)·min_k s_k    0 ≤ ε_c < min s_k (Theorem 1)
  θ2 = sigmoid(a), θ1 = θ2 + (1−θ2)·sigmoid(b), θ0 = θ1 + (1−θ1)·sigmoid(c)     1 ≥ θ0 ≥ θ1 ≥ θ2 ≥ 0
  n_max = n_min + softplus(w) + 1e-3             n_max > n_min
  gate, g_A coefficients and the bias are free.
Fields outside ``fields`` are not parameters at all: they are the starting config's values, exactly
(also where the free parametrisation could only approach them: ε_c = 0, θ0 = 1, a zero gain), and
the trained fields are constrained around them: gains trained beside a frozen ε_c are
softplus(u_k) + ε_c + 1e-3, n_min trained beside a frozen n_max is n_max − softplus(w) − 1e-3, ε_c
trained beside frozen gains is bounded by their minimum (0 when a gain is 0). The field set is static
per group of runs, so different field sets still train side by side in one program (``tune_many``),
and their gradients are also masked so a frozen parameter's Adam update is exactly 0.

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
and the gradients are summed across them); ``tune`` is a run of one.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable, Sequence
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec

from mdl_jax.controller import decision as _d
from mdl_jax.controller import mesh as _meshes
from mdl_jax.controller.config import NUMERIC_FIELDS, STATIC_FIELDS, MDLConfig
from mdl_jax.controller.validation import ArrayLike, binary_labels, check_unit_interval, common_shape

FIELD_SETS = {"gates": ("gate_coeffs", "thresholds"), "all": NUMERIC_FIELDS}
_EPS = 1e-3
# Fewer records than the "gates" field set has numbers (5) cannot pin them down; `mdl-jax tune` also
# needs one record per fold of its 5-fold cross-validation.
MIN_RECORDS = 5
_DEFAULT_LR = 0.05


@functools.lru_cache(maxsize=64)
def default_optimizer(steps: int, learning_rate: float = _DEFAULT_LR) -> optax.GradientTransformation:
    """The optimiser ``tune`` uses unless given one: Adam on a warmup-cosine schedule.

    Warmup over the first tenth of ``steps`` (none for a run of one step: optax needs more decay steps
    than warmup steps), then cosine decay to 5% of the peak. The same (steps, learning_rate) gives the
    same object, so repeated runs share one compiled program.

    Args:
      steps: the number of optimisation steps, a positive int.
      learning_rate: the peak learning rate, finite and > 0.

    Returns:
      An ``optax.GradientTransformation``.

    Raises:
      ValueError: ``steps`` not a positive int, or ``learning_rate`` not a finite number > 0.
    """
    _check_steps(steps)
    if not (isinstance(learning_rate, (int, float, np.integer, np.floating))
            and not isinstance(learning_rate, bool) and np.isfinite(learning_rate) and learning_rate > 0):
        raise ValueError(f"learning_rate: expected a finite number > 0, got {learning_rate!r}")
    lr = float(learning_rate)
    warmup = min(max(1, steps // 10), steps - 1)
    opt = optax.adam(optax.warmup_cosine_decay_schedule(0.0, lr, warmup, steps, lr * 0.05))
    _LEARNING_RATE_OF[opt] = learning_rate
    while len(_LEARNING_RATE_OF) > 256:  # bounded: the oldest go first
        del _LEARNING_RATE_OF[next(iter(_LEARNING_RATE_OF))]
    return opt


# The peak learning rate of each default optimiser made, so a warning can name the number to lower.
_LEARNING_RATE_OF: dict = {}


def _check_steps(steps) -> None:
    if not (isinstance(steps, (int, np.integer)) and not isinstance(steps, bool) and steps > 0):
        raise ValueError(f"steps: expected a positive int, got {steps!r}")


@dataclasses.dataclass(frozen=True)
class GeometricTemperature:
    """τ annealed geometrically from ``start`` to ``end`` over ``steps``: an optax schedule (step → τ).

    τ_k = start · (end / start)^(k / (steps − 1)), so τ is ``start`` at step 0 and ``end`` at the last.

    Attributes:
      start: τ at the first step, > 0.
      end: τ at the last step, > 0; the soft/hard disagreement at the end is measured at it.
      steps: the number of steps the schedule spans.

    Raises:
      ValueError: ``start`` or ``end`` not a finite number > 0 (named as ``temperature``).
    """

    start: float = 0.05
    end: float = 0.002
    steps: int = 500

    def __post_init__(self):
        try:
            ok = all(np.isfinite(float(t)) and float(t) > 0 for t in (self.start, self.end))
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise ValueError(f"temperature: expected two positive numbers (start, end), got "
                             f"{(self.start, self.end)!r}")
        _check_steps(self.steps)
        object.__setattr__(self, "start", float(self.start))
        object.__setattr__(self, "end", float(self.end))

    def __call__(self, count):
        return self.start * (self.end / self.start) ** (count / jnp.maximum(self.steps - 1, 1))


@dataclasses.dataclass(frozen=True)
class TuneSettings:
    """How ``tune`` and ``tune_many`` train, as one frozen value (hashable: a key of the compiled program).

    Examples:
      >>> settings = TuneSettings(steps=300, optimizer=optax.adam(1e-2))
      >>> tune(M, R, A, adopt, settings=settings)                     # doctest: +SKIP

    Attributes:
      steps: optimisation steps (full batch), a positive int.
      optimizer: an ``optax.GradientTransformation`` over the free parameters; None is
        ``default_optimizer(steps)``, Adam on a warmup-cosine schedule peaking at 0.05.
      temperature: an optax schedule, step → τ of the soft decision; None is
        ``GeometricTemperature(0.05, 0.002, steps)``. The soft/hard disagreement is measured at the
        last step's τ.
      patience: steps without a better validation accuracy before a run stops moving (only with a
        validation part), an int ≥ 0.
      init_noise: the standard deviation of the noise a seed other than 0 adds to a run's trained free
        parameters, finite and ≥ 0.

    Raises:
      ValueError: a field outside its domain, naming it.
      TypeError: ``optimizer`` not a ``GradientTransformation``, or ``temperature`` not callable.
    """

    steps: int = 500
    optimizer: optax.GradientTransformation | None = None
    temperature: Callable | None = None
    patience: int = 100
    init_noise: float = 0.05

    def __post_init__(self):
        _check_steps(self.steps)
        if self.optimizer is not None and not isinstance(self.optimizer, optax.GradientTransformation):
            raise TypeError(f"optimizer: expected an optax.GradientTransformation, got "
                            f"{type(self.optimizer).__name__}")
        if self.temperature is not None and not callable(self.temperature):
            raise TypeError(f"temperature: expected an optax schedule (a function of the step), got "
                            f"{type(self.temperature).__name__}")
        if not (isinstance(self.patience, (int, np.integer)) and not isinstance(self.patience, bool)
                and self.patience >= 0):
            raise ValueError(f"patience: expected an int ≥ 0, got {self.patience!r}")
        if not (isinstance(self.init_noise, (int, float, np.integer, np.floating))
                and np.isfinite(self.init_noise) and self.init_noise >= 0):
            raise ValueError(f"init_noise: expected a finite number ≥ 0, got {self.init_noise!r}")
        object.__setattr__(self, "patience", int(self.patience))

    def replace(self, **changes) -> TuneSettings:
        """A copy with some fields changed, checked like new settings.

        Args:
          **changes: field=value pairs.

        Returns:
          New ``TuneSettings``.

        Raises:
          TypeError: a keyword that is not a field.
          ValueError: a value outside its field's domain.
        """
        return dataclasses.replace(self, **changes)

    @property
    def resolved_optimizer(self) -> optax.GradientTransformation:
        """``optimizer``, or ``default_optimizer(steps)`` when it is None."""
        return default_optimizer(self.steps) if self.optimizer is None else self.optimizer

    @property
    def resolved_temperature(self) -> Callable:
        """``temperature``, or ``GeometricTemperature(0.05, 0.002, steps)`` when it is None."""
        return GeometricTemperature(steps=self.steps) if self.temperature is None else self.temperature

    def final_temperature(self):
        """τ at the last step (a geometric schedule's ``end`` exactly)."""
        t = self.resolved_temperature
        return t.end if isinstance(t, GeometricTemperature) else t(self.steps - 1)


_SETTING_NAMES = frozenset(f.name for f in dataclasses.fields(TuneSettings))


def _settings(settings: TuneSettings | None, options: dict, who: str) -> tuple[TuneSettings, float | None]:
    """``settings`` with the keyword shorthands applied: (settings, the legacy learning rate or None).

    Keyword shorthands are the settings' own field names (``steps=300``). ``learning_rate`` (replaced by
    ``optimizer``) and a (start, end) ``temperature`` (replaced by a schedule) still work for one
    release, with a DeprecationWarning."""
    if settings is None:
        settings = TuneSettings()
    elif not isinstance(settings, TuneSettings):
        raise TypeError(f"settings: expected TuneSettings, got {type(settings).__name__}")
    options = dict(options)
    lr = options.pop("learning_rate", None)
    unknown = sorted(set(options) - _SETTING_NAMES)
    if unknown:
        raise TypeError(f"{who}() got an unexpected keyword argument {unknown[0]!r}")
    temperature = options.get("temperature")
    if temperature is not None and not callable(temperature):
        warnings.warn(f"{who}: temperature=(start, end) is deprecated; pass a schedule, e.g. "
                      "temperature=GeometricTemperature(start, end, steps)", DeprecationWarning, stacklevel=3)
        try:
            start, end = temperature
        except (TypeError, ValueError):
            raise ValueError(f"temperature: expected two positive numbers (start, end), got {temperature!r}") \
                from None
        steps = options.get("steps", settings.steps)
        _check_steps(steps)
        options["temperature"] = GeometricTemperature(start, end, steps)
    if options:
        settings = settings.replace(**options)
    if lr is not None:
        warnings.warn(f"{who}: learning_rate is deprecated; pass optimizer=default_optimizer(steps, "
                      "learning_rate) or any optax.GradientTransformation", DeprecationWarning, stacklevel=3)
        if settings.optimizer is not None:
            raise ValueError("learning_rate: expected either learning_rate or optimizer, got both")
        settings = settings.replace(optimizer=default_optimizer(settings.steps, lr))
    return settings, lr


class TuneResult(NamedTuple):
    """``config``: the tuned config. ``history``: per-step arrays ("loss", "train_accuracy",
    "val_accuracy", "temperature", and the constrained "sigma", "eps_c", "min_gain", "thresholds",
    "n_min", "n_max" after each step) and scalars ("best_step", "stopped_step", "best_val_accuracy",
    "disagreement": share of training records where soft argmax ≠ hard action at the end).

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
        not finite or broke an invariant and was not applied; −1: never) and ``"disagreement"``
        (float32: share of training records where the soft argmax at the final temperature ≠ the
        hard action, for the kept parameters) and ``"adopt_share"`` (float32: share of training
        records the kept parameters decide Active; 0 or 1 is warned about). After ``stopped_step`` the run no longer moves:
        every later entry scores the same frozen parameters (the accuracies and field values
        repeat; ``"loss"`` still changes because τ keeps annealing), so only steps up to
        ``stopped_step`` describe training.
    """

    config: MDLConfig
    history: dict


# ------------------------------------------------------------------------------- parametrisation

def _softplus_inv(y):
    y = np.asarray(y, np.float64)
    return np.where(y > 20, y, np.log(np.expm1(np.maximum(y, 1e-12))))


def _logit(p):
    p = np.clip(np.asarray(p, np.float64), 1e-4, 1 - 1e-4)
    return np.log(p) - np.log1p(-p)


def to_unconstrained(cfg: MDLConfig, trained: Sequence[str] = NUMERIC_FIELDS) -> dict:
    """The free parameters (float32 arrays, one entry per numeric field) that map back to ``cfg``
    under ``from_unconstrained(u, cfg, trained)`` (up to the clamps at the domain edges: θ exactly
    0, 1 or tied sit 1e-4 inside). Entries of fields outside ``trained`` are not used."""
    t = frozenset(trained)
    g = np.asarray(cfg.gains, np.float64)
    eps = float(cfg.eps_c)
    th = np.asarray(cfg.thresholds, np.float64)
    n_min, n_max = float(cfg.n_min), float(cfg.n_max)
    t2 = th[2]
    b = (th[1] - t2) / max(1 - t2, 1e-12)
    c = (th[0] - th[1]) / max(1 - th[1], 1e-12)
    room = (1 - _EPS) * g.min()
    out = {
        "sigma": _softplus_inv(float(cfg.sigma) - _EPS),
        "gains": _softplus_inv(g - _gain_floor(eps, t)),
        # a zero gain with ε_c = 0 is valid and leaves ε_c no room: its parameter is then unused
        "eps_c": _logit(eps / room if room > 0 else 0.0),
        "g_A_coeffs": np.asarray(cfg.g_A_coeffs, np.float64),
        "gate_coeffs": np.asarray(cfg.gate_coeffs, np.float64),
        "thresholds": np.array([_logit(t2), _logit(b), _logit(c)]),
        "bias": np.asarray(cfg.bias, np.float64),
        "n_min": np.asarray(_softplus_inv(n_max - n_min - _EPS) if "n_min" in t and "n_max" not in t
                            else n_min),
        "n_max": _softplus_inv(n_max - n_min - _EPS),
    }
    # a field with no constrained parametrisation here is its own free parameter
    out.update({f: np.asarray(getattr(cfg, f), np.float64) for f in NUMERIC_FIELDS if f not in out})
    return {k: jnp.asarray(v, jnp.float32) for k, v in out.items()}


def _gain_floor(eps_c, trained: frozenset):
    # Trained gains stay ≥ 1e-3; with ε_c frozen they also stay 1e-3 above it (Theorem 1: ε_c < min s_k).
    return _EPS if "eps_c" in trained else eps_c + _EPS


def from_unconstrained(u: dict, base: MDLConfig, trained: Sequence[str] = NUMERIC_FIELDS) -> MDLConfig:
    """Free parameters → a config (traceable; the invariants hold for any finite ``u``).

    Fields in ``trained`` come from ``u``; every other field is ``base``'s value, exactly, and the
    trained fields are constrained around the frozen ones (gains above a frozen ε_c, n_min below a
    frozen n_max, ...), so a frozen field never moves to make room.
    """
    t = frozenset(trained)

    def fixed(f):
        return jnp.asarray(getattr(base, f), jnp.float32)

    def pick(f, value):
        return value if f in t else fixed(f)

    eps_b = fixed("eps_c")
    gains = pick("gains", jax.nn.softplus(u["gains"]) + _gain_floor(eps_b, t))
    t2 = jax.nn.sigmoid(u["thresholds"][0])
    t1 = t2 + (1 - t2) * jax.nn.sigmoid(u["thresholds"][1])
    t0 = t1 + (1 - t1) * jax.nn.sigmoid(u["thresholds"][2])
    if "n_min" in t and "n_max" not in t:
        n_max = fixed("n_max")
        n_min = n_max - jax.nn.softplus(u["n_min"]) - _EPS
    else:
        n_min = pick("n_min", u["n_min"])
        n_max = pick("n_max", n_min + jax.nn.softplus(u["n_max"]) + _EPS)
    free = {f: pick(f, u[f]) for f in NUMERIC_FIELDS}  # a field with no parametrisation below is free
    return _replace_leaves(base, {
        **free,
        "sigma": pick("sigma", jax.nn.softplus(u["sigma"]) + _EPS), "gains": gains,
        # (1 − 1e-3): sigmoid rounds to exactly 1 in float32 for large inputs; ε_c must stay below
        "eps_c": pick("eps_c", jax.nn.sigmoid(u["eps_c"]) * (1 - _EPS) * jnp.min(gains)),
        "thresholds": pick("thresholds", jnp.stack([t0, t1, t2])), "n_min": n_min, "n_max": n_max})


def _replace_leaves(base: MDLConfig, leaves: dict) -> MDLConfig:
    # MDLConfig.replace would re-run the concrete-value checks on tracers; rebuild through the pytree.
    from mdl_jax.controller import config as _config

    return _config._unflatten(_config._flatten(base)[1], [leaves[f] for f in NUMERIC_FIELDS])


def field_mask(fields: Sequence[str]) -> dict:
    """1.0 for the trained fields, 0.0 for the frozen ones."""
    unknown = [f for f in fields if f not in NUMERIC_FIELDS]
    if unknown or not fields:
        raise ValueError(f"fields: expected a non-empty subset of {list(NUMERIC_FIELDS)}, got "
                         f"{list(fields)!r}")
    return {f: jnp.float32(f in fields) for f in NUMERIC_FIELDS}


# ------------------------------------------------------------------------------------ the program

# Fields that change v_meta (and so ‖v_meta‖ and α). When a run trains none of them, the raw norm and α
# of every record are the same at every step: they are computed once, before the training loop, and
# each step only redoes the read-out normalisation, the gate and the threshold (the "gates" field set).
FUSION_FIELDS = ("sigma", "eps_c", "gains", "g_A_coeffs", "bias")


def _features(M, R, A, cfg):
    """(raw norm, α) of one record: the part of Algorithm 1 before n_min/n_max and the gate."""
    v_meta, v_wm, _ = _d.fuse(M, R, A, cfg)
    _, alpha, n = _d.read_out(v_meta, v_wm, cfg)
    return n, alpha


def _c_final_from_features(n, alpha, cfg):
    n_min = jnp.asarray(cfg.n_min, n.dtype)
    n_max = jnp.asarray(cfg.n_max, n.dtype)
    C = jnp.clip((n - n_min) / (n_max - n_min), 0.0, 1.0)   # eq. (2), as decision.read_out
    return _d.gate(C, alpha, cfg)


def _soft_adopt_logit(M, R, A, cfg, tau):
    # (C_final − θ0)/τ for one record; its sigmoid is P(adopt) = P(ACTIVE).
    C_final = _c_final_from_features(*_features(M, R, A, cfg), cfg)
    th = jnp.asarray(cfg.thresholds, C_final.dtype)
    return (C_final - th[0]) / tau, C_final


class _Carry(NamedTuple):
    params: dict
    opt_state: optax.OptState
    best_params: dict
    best_val: jax.Array
    best_step: jax.Array
    since_best: jax.Array
    stopped: jax.Array
    stopped_step: jax.Array
    diverged_step: jax.Array


def _finite(tree) -> jax.Array:
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))


def _valid(c: MDLConfig) -> jax.Array:
    """MDLConfig's invariants on traced float32 values. The parametrisation keeps them for finite
    free parameters in exact arithmetic; far out (|u| ~ 1e37) float32 rounding breaks them
    (n_min + 1e-3 == n_min), which is divergence too."""
    th = jnp.asarray(c.thresholds)
    gmin = jnp.min(c.gains)
    return (_finite([getattr(c, f) for f in NUMERIC_FIELDS]) & (c.sigma > 0) & (gmin >= 0)
            & ((c.eps_c == 0) | ((c.eps_c > 0) & (c.eps_c < gmin)))
            & jnp.all((th >= 0) & (th <= 1)) & (th[0] >= th[1]) & (th[1] >= th[2]) & (c.n_max > c.n_min))


class _Records(NamedTuple):
    """The records every run of a program trains on: (N,) signals, labels, and the base config's
    (raw norm, α) per record when some group trains no fusion field (else None)."""

    M: jax.Array
    R: jax.Array
    A: jax.Array
    y: jax.Array
    feats: tuple | None = None


class _Run(NamedTuple):
    """One run's own arrays: start point, field mask, training and validation weights."""

    u0: dict
    mask: dict
    w_train: jax.Array
    w_val: jax.Array


class _Group(NamedTuple):
    """What a group of runs shares, static: the base config, the trained fields, and whether they
    include a field of FUSION_FIELDS (if not, every step reuses the records' precomputed features)."""

    base: MDLConfig
    trained: tuple
    fused: bool


def _train_one(run: _Run, data: _Records, group: _Group, settings: TuneSettings):
    """One run: lax.scan over steps. Returns (best params, per-step history, scalars).

    Without a fusion field in the group, ``data.feats`` = (raw norm, α) of every record, computed once
    for the whole program, and a step costs a few flops per record."""
    u0, mask, w_train, w_val = run
    M, R, A, y, feats = data
    base, trained, fused = group
    steps, patience = settings.steps, settings.patience
    opt = settings.resolved_optimizer
    temperature = settings.resolved_temperature
    if fused:
        logits_of = jax.vmap(_soft_adopt_logit, in_axes=(0, 0, 0, None, None))
    else:
        def logits_of(M, R, A, cfg, tau):
            C_final = _c_final_from_features(feats[0], feats[1], cfg)
            return (C_final - jnp.asarray(cfg.thresholds, C_final.dtype)[0]) / tau, C_final
    wt = w_train / jnp.sum(w_train)
    wv_sum = jnp.maximum(jnp.sum(w_val), 1e-12)
    has_val = jnp.sum(w_val) > 0  # without a validation part: no early stopping, keep the last step

    # One flat parameter vector (ravel_pytree), not a dict of nine leaves: the optimiser, the masks
    # and the best-step bookkeeping are then a few ops on one array instead of nine each, which keeps
    # the compiled program small.
    from jax.flatten_util import ravel_pytree

    u0, unravel = ravel_pytree(u0)
    mask = ravel_pytree(jax.tree.map(lambda m, x: jnp.broadcast_to(m, jnp.shape(x)), mask,
                                     unravel(u0)))[0]

    def loss_fn(u, tau):
        z, C_final = logits_of(M, R, A, from_unconstrained(unravel(u), base, trained), tau)
        # cross-entropy of sigmoid(z) against y, stable for large |z|
        per = jnp.where(y, jax.nn.softplus(-z), jax.nn.softplus(z))
        return jnp.sum(wt * per), z

    def step(carry: _Carry, k):
        tau = temperature(k)
        (loss, z), grads = jax.value_and_grad(loss_fn, has_aux=True)(carry.params, tau)
        grads = grads * mask
        updates, opt_state = opt.update(grads, carry.opt_state, carry.params)
        stepped = carry.params + updates
        c = from_unconstrained(unravel(stepped), base, trained)
        # Divergence (a non-finite loss, gradient, parameter or config) stops the run where it is:
        # the update is not applied, so the run keeps finite parameters, and the step is reported.
        diverged = ~(jnp.isfinite(loss) & _finite(grads) & _finite(stepped) & _valid(c)) & ~carry.stopped
        moving = ~carry.stopped & ~diverged
        params = jnp.where(moving, stepped, carry.params)
        hard_correct = ((z >= 0) == y).astype(jnp.float32)   # hard decision of the params scored
        train_acc = jnp.sum(wt * hard_correct)
        val_acc = jnp.sum(w_val * hard_correct) / wv_sum
        better = (val_acc > carry.best_val) & ~carry.stopped
        best_params = jnp.where(better, carry.params, carry.best_params)
        since = jnp.where(better, 0, carry.since_best + 1)
        stop_now = ((since >= patience) & ~carry.stopped & has_val) | diverged
        new = _Carry(params, opt_state, best_params, jnp.where(better, val_acc, carry.best_val),
                     jnp.where(better, k, carry.best_step), since, carry.stopped | stop_now,
                     jnp.where(stop_now, k, carry.stopped_step),
                     jnp.where(diverged, k, carry.diverged_step))
        c = from_unconstrained(unravel(params), base, trained)  # the invariants, step by step (tests check them)
        return new, {"loss": loss, "train_accuracy": train_acc, "val_accuracy": val_acc,
                     "temperature": tau, "sigma": c.sigma, "eps_c": c.eps_c, "min_gain": jnp.min(c.gains),
                     "thresholds": c.thresholds, "n_min": c.n_min, "n_max": c.n_max}

    init = _Carry(u0, opt.init(u0), u0, jnp.float32(-1.0), jnp.int32(0), jnp.int32(0),
                  jnp.bool_(False), jnp.int32(steps), jnp.int32(-1))
    final, hist = jax.lax.scan(step, init, jnp.arange(steps))
    final = final._replace(best_params=unravel(jnp.where(has_val, final.best_params, final.params)),
                           best_step=jnp.where(has_val, final.best_step, steps - 1))
    # soft vs hard on the training records at the final temperature, for the kept parameters (through
    # the same forward as training, so a "gates" group still never recomputes the fusion)
    cfg = from_unconstrained(final.best_params, base, trained)
    C_final = logits_of(M, R, A, cfg, 1.0)[1]
    probs = jax.vmap(_d.soft_action_probs, in_axes=(0, None, None))(C_final, cfg, settings.final_temperature())
    hard = jax.vmap(_d.act, in_axes=(0, None))(C_final, cfg)
    differ = (jnp.argmax(probs, -1) != hard).astype(jnp.float32)
    on_train = w_train > 0
    n_train = jnp.maximum(jnp.sum(on_train), 1)
    disagreement = jnp.sum(jnp.where(on_train, differ, 0.0)) / n_train
    adopt_share = jnp.sum(on_train & (hard == _d.Action.ACTIVE)) / n_train
    scalars = {"best_step": final.best_step, "stopped_step": final.stopped_step,
               "diverged_step": final.diverged_step, "best_val_accuracy": final.best_val,
               "disagreement": disagreement, "adopt_share": adopt_share.astype(jnp.float32)}
    return final.best_params, hist, scalars


@functools.partial(jax.jit, static_argnames=("base", "kinds", "settings", "mesh"))
def _train_groups(groups, data: _Records, *, base: MDLConfig, kinds: tuple, settings: TuneSettings, mesh=None):
    """Every group of runs (one per distinct field set) in ONE program; each group is vmapped.

    groups: a tuple of ``_Run``s, each array with a leading run axis (a multiple of the mesh's "runs"
    length); kinds: per group, (trained field set, fused). With a 2-D ("runs", "records") mesh each
    device trains its runs on its records: the losses and accuracies are sums over records, so their
    values and gradients become cross-device sums that XLA inserts."""
    out = []
    feats = None
    M, R, A, y = data.M, data.R, data.A, data.y
    if mesh is not None:
        on_records = NamedSharding(mesh, PartitionSpec("records"))
        M, R, A, y = jax.lax.with_sharding_constraint((M, R, A, y), on_records)
    for (u0, masks, w_train, w_val), (tr, fz) in zip(groups, kinds):
        if mesh is not None:
            u0, masks = jax.lax.with_sharding_constraint((u0, masks), NamedSharding(mesh, PartitionSpec("runs")))
            w_train, w_val = jax.lax.with_sharding_constraint(
                (w_train, w_val), NamedSharding(mesh, PartitionSpec("runs", "records")))
        if not fz and feats is None:  # once for every non-fusion group: the base config's (n, α)
            feats = jax.vmap(_features, in_axes=(0, 0, 0, None))(M, R, A, base)
        records = _Records(M, R, A, y, feats)
        group = _Group(base, tr, fz)

        def one(u0, masks, w_train, w_val, records=records, group=group):
            return _train_one(_Run(u0, masks, w_train, w_val), records, group, settings)
        out.append(jax.vmap(one)(u0, masks, w_train, w_val))
    if mesh is not None:  # small results, replicated: every device (and process) can read them whole
        out = jax.lax.with_sharding_constraint(out, NamedSharding(mesh, PartitionSpec()))
    return out


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
    w = np.asarray(w, dtype=np.float64)
    if w.shape != (B, N):
        raise ValueError(f"{name}: expected shape ({B}, {N}), got {w.shape}")
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ValueError(f"{name}: expected finite, non-negative weights")
    top = w.max(axis=1, keepdims=True) if N else np.zeros((B, 1))
    return jnp.asarray(np.divide(w, top, out=np.zeros_like(w), where=top > 0).astype(np.float32))


def tune_many(M, R, A, adopt, *, train_weights, val_weights, field_sets: Sequence[Sequence[str]],
              seeds: Sequence[int], config: MDLConfig | None = None, settings: TuneSettings | None = None,
              mesh_shape: tuple[int, int] | None = None, _across_processes: bool = False, **options):
    """B runs in one jitted, vmapped program over the same (N,) records.

    Args:
      M: (N,) relevance in [0, 1], as ``tune``.
      R: (N,) reliability, as ``M``.
      A: (N,) task risk, as ``M``.
      adopt: (N,) binary oracle labels, as ``tune``.
      train_weights: (B, N) per-record weights of each run's training part (0 = not in it); a fold
        is a pair of weight vectors. Scale-free: each run's weights are divided by their largest (in
        float64) first, so only their ratios count, and uniform weights of any positive scale train
        exactly as unweighted.
      val_weights: (B, N) per-record weights of each run's validation part, scale-free too. It may be
        all zero (then the last step is kept: no early stopping signal).
      field_sets: B tuples of field names to train (e.g. ``FIELD_SETS["gates"]``).
      seeds: B ints; a run starts from ``config`` plus N(0, init_noise²) noise on its trained free
        parameters, so seeds give different starting points.
      config: the starting ``MDLConfig``; the paper's defaults when None.
      settings: ``TuneSettings`` (steps, optimizer, temperature, patience, init_noise); the defaults
        when None.
      **options: shorthands for fields of ``settings`` (``steps=300``), as ``tune``.
      mesh_shape: (run shards, record shards) of the 2-D device mesh over the first a·r local
        devices; default: chosen from the runs, N and the device count (``mesh.mesh_shape``).
    Returns:
      (configs: list of B tuned MDLConfigs, history: dict of (B, steps) arrays and (B,) scalars).

    Raises:
      ValueError, TypeError: as ``tune``, and ``seeds`` not one per run.

    Warns:
      RuntimeWarning: as ``tune``. DeprecationWarning: as ``tune``.
    """
    settings, lr = _settings(settings, options, "tune_many")
    base = config if config is not None else MDLConfig()
    if not isinstance(base, MDLConfig):
        raise TypeError(f"config: expected an MDLConfig, got {type(base).__name__}")
    (M, R, A, y), N = _check_signals(M, R, A, adopt)
    B = len(field_sets)
    if len(seeds) != B:
        raise ValueError(f"seeds: expected {B} seeds (one per run), got {len(seeds)}")
    wt = _check_weights("train_weights", train_weights, B, N)
    wv = _check_weights("val_weights", val_weights, B, N)
    if np.any(np.asarray(wt).sum(1) <= 0):
        raise ValueError("train_weights: every run needs training records")
    y_np = np.asarray(y)
    for b in range(B):
        on = np.asarray(wt[b]) > 0
        if np.all(y_np[on]) or not np.any(y_np[on]):
            which = "adopt (1)" if y_np[on][0] else "reject (0)"
            raise ValueError(f"adopt: expected both labels among the training records, got {int(on.sum())} "
                             f"that are all {which}" + (f" (run {b})" if B > 1 else "")
                             + "; there is nothing to separate")
    keys_data = [_seed_key(s, "seeds" if B > 1 else "seed") for s in seeds]
    for fs in field_sets:
        field_mask(fs)  # an unknown or empty field set fails here, naming it
    # Everything per run is built in a couple of vectorised calls, not B rounds of small eager JAX ops,
    # whose dispatch would outweigh the training of a small field set.
    masks = {f: np.array([f in fs for fs in field_sets], np.float32) for f in NUMERIC_FIELDS}
    prng = np.stack(keys_data)
    noise = np.array([settings.init_noise * (int(s) != 0) for s in seeds], np.float32)
    chex.assert_shape([M, R, A, y], (N,))
    # Runs grouped by field set (static: whether the fusion must be recomputed every step).
    keys = list(dict.fromkeys(tuple(sorted(fs)) for fs in field_sets))
    members = [[b for b, fs in enumerate(field_sets) if tuple(sorted(fs)) == k] for k in keys]
    # The (runs, records) mesh: runs first, records where the groups cannot keep every device busy
    # (mesh.mesh_shape); each group is padded to whole run shards by repeating its last run, and the
    # records to whole record shards by weight-0 records (in neither part of any run: they change
    # no sum), both dropped from the results.
    # Across processes (distributed.tune_many) the mesh holds every process's devices and every
    # process passes the same records: each device trains its runs on its records, and the
    # cross-device sums of the loss and gradients go between processes too.
    n_dev = jax.device_count() if _across_processes else len(jax.local_devices())
    shape = (_meshes.mesh_shape(n_dev, [len(i) for i in members], N) if mesh_shape is None
             else _meshes.check_mesh_shape(mesh_shape, n_dev))
    mesh = _meshes.make_mesh(shape, ("runs", "records"), _across_processes)
    a, r = shape
    pad_n = -(-N // r) * r - N
    # host arrays from here: a mesh across processes is filled from each process's (equal) NumPy copy
    M, R, A, y = (np.asarray(x) for x in (M, R, A, y))
    if pad_n:
        M, R, A = (np.concatenate([x, np.full(pad_n, 0.5, np.float32)]) for x in (M, R, A))
        y = np.concatenate([y, np.zeros(pad_n, y.dtype)])
    groups = []
    for key, idx in zip(keys, members):
        take = np.array(idx + [idx[-1]] * (-(-len(idx) // a) * a - len(idx)))
        # the start point's free parameters depend on the field set (trained fields are constrained
        # around the frozen ones), so each group maps the base config its own way
        m = {f: x[take] for f, x in masks.items()}
        u0 = _start_points(to_unconstrained(base, key), m, prng[take], noise[take])
        wt_g, wv_g = (np.pad(np.asarray(x)[take], ((0, 0), (0, pad_n))) for x in (wt, wv))
        g = _Run(jax.tree.map(np.asarray, u0), {f: np.asarray(x) for f, x in m.items()}, wt_g, wv_g)
        chex.assert_tree_shape_prefix(g, (len(take),))
        if mesh is not None:
            runs = NamedSharding(mesh, PartitionSpec("runs"))
            w_sh = NamedSharding(mesh, PartitionSpec("runs", "records"))
            g = _Run(jax.device_put(g.u0, runs), jax.device_put(g.mask, runs),
                     jax.device_put(g.w_train, w_sh), jax.device_put(g.w_val, w_sh))
        groups.append(g)
    if mesh is not None:
        M, R, A, y = jax.device_put((M, R, A, y), NamedSharding(mesh, PartitionSpec("records")))
    fused = tuple(any(f in FUSION_FIELDS for f in k) for k in keys)
    static = _static_base(base)
    res = _train_groups(tuple(groups), _Records(M, R, A, y), base=static, kinds=tuple(zip(keys, fused)),
                        settings=settings, mesh=mesh)
    # drop the padding runs (each group's first len(idx) rows are its own runs)
    res = [jax.tree.map(functools.partial(_head, n=len(idx)), g) for idx, g in zip(members, res)]
    fields = {f: np.zeros((B,) + np.shape(getattr(base, f)), np.float64) for f in NUMERIC_FIELDS}
    history: dict[str, np.ndarray] = {}
    for key, idx, (bp, hist, scalars) in zip(keys, members, res):
        take = np.array(idx)
        for f, v in _constrained(bp, base=static, trained=key).items():  # one call per group
            fields[f][take] = np.asarray(v)
        for k, v in {**hist, **scalars}.items():
            arr = history.setdefault(k, np.zeros((B,) + np.shape(v)[1:], np.asarray(v).dtype))
            arr[take] = np.asarray(v)
    # the number a user can lower: the learning rate of a default optimiser, else the optimiser's own
    lr = lr if lr is not None else _LEARNING_RATE_OF.get(settings.resolved_optimizer)
    step_size = f"learning_rate ({lr!r})" if lr is not None else "the optimizer's step size"
    the_step_size = step_size if lr is None else "the " + step_size
    for b in np.flatnonzero(history["diverged_step"] >= 0).tolist():
        warnings.warn(f"tune: run {b} (fields {', '.join(field_sets[b])}, seed {seeds[b]}) diverged at "
                      f"step {int(history['diverged_step'][b])} (a non-finite loss or parameter); it "
                      f"stopped there and keeps its last finite parameters. Lower {step_size}.",
                      RuntimeWarning, stacklevel=2)
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
                      RuntimeWarning, stacklevel=2)
    # Fields a run does not train are the starting config's values, exactly (not a float32 round trip)
    configs = [_concrete_from(base, {f: x[b] for f, x in fields.items()}, field_sets[b]) for b in range(B)]
    return configs, history


def _seed_key(seed, name: str) -> np.ndarray:
    """A seed's PRNG key. Seeds are ints in [0, 2**64): the key is the seed's two 32-bit halves, so no
    two seeds share a key (jax.random.PRNGKey folds seeds modulo 2**32 without x64) and every seed
    below 2**32 keeps the key PRNGKey gave it."""
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) or not 0 <= int(seed) < 2**64:
        raise ValueError(f"{name}: expected an int in [0, 2**64), got {seed!r}")
    s = int(seed)
    return np.array([s >> 32, s & 0xFFFFFFFF], np.uint32)


@jax.jit
def _start_points(start: dict, masks: dict, keys, noise):
    """Each run's starting free parameters, (B, ...) per leaf: seed 0 (noise 0) starts exactly at
    ``start``; another seed adds N(0, init_noise²) to its run's trained leaves (its own key per leaf)."""
    def one(key, scale, mask):
        leaves, tree = jax.tree.flatten(start)
        ks = jax.random.split(key, len(leaves))
        noisy = jax.tree.unflatten(tree, [x + scale * jax.random.normal(k, x.shape)
                                          for x, k in zip(leaves, ks)])
        return jax.tree.map(lambda n, x, m: jnp.where(m > 0, n, x), noisy, start, mask)
    return jax.vmap(one)(keys, noise, masks)


@functools.partial(jax.jit, static_argnames=("base", "trained"))
def _constrained(u: dict, *, base: MDLConfig, trained: tuple) -> dict:
    """A group's best free parameters (leading run axis) → the config fields, in one call."""
    def one(p):
        c = from_unconstrained(p, base, trained)
        return {f: getattr(c, f) for f in NUMERIC_FIELDS}
    return jax.vmap(one)(u)


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
        ``temperature=...``, ``patience=...``. Deprecated, for one release (DeprecationWarning):
        ``learning_rate=x`` (use ``optimizer=default_optimizer(steps, x)``) and
        ``temperature=(start, end)`` (use ``GeometricTemperature(start, end, steps)``).

    Returns:
      A ``TuneResult``: the tuned config and the per-step history (layout in ``TuneResult``).

    Raises:
      ValueError: naming the argument: signals outside [0, 1], not 1-d or of different lengths,
        fewer than ``MIN_RECORDS`` (5) records; labels that are not binary, or of one class only
        among the training records; ``weights`` or ``val`` not of shape (N,), or negative or
        non-finite (reported as ``train_weights`` / ``val_weights``), or no training record left;
        an unknown or empty ``fields``; ``steps`` not a positive int, ``learning_rate`` not finite
        and > 0, ``temperature`` not two positive numbers, ``patience`` not an int ≥ 0, ``seed``
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
    settings, _ = _settings(settings, options, "tune")
    (Mj, _, _, _), N = _check_signals(M, R, A, adopt)
    # float64 until the weights are normalised (_check_weights): only their ratios count
    w = np.ones(N, np.float64) if weights is None else np.asarray(weights, np.float64)
    if w.shape != (N,):
        raise ValueError(f"weights: expected shape ({N},), got {np.shape(weights)}")
    v = np.zeros(N, np.float64) if val is None else np.asarray(val, np.float64)
    if v.shape != (N,):
        raise ValueError(f"val: expected shape ({N},), got {np.shape(val)}")
    w_train = np.where(v > 0, 0.0, w)
    configs, hist = tune_many(M, R, A, adopt, train_weights=w_train[None], val_weights=v[None],
                              field_sets=[tuple(fields)], seeds=[seed], config=config, settings=settings)
    return TuneResult(configs[0], {k: x[0] for k, x in hist.items()})


def _head(x, n: int):
    """The first ``n`` rows of a leaf (a named function, not a lambda in a loop: it binds ``n`` now)."""
    return x[:n]
