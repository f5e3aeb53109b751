"""How tuning trains, as values: ``TuneSettings`` (steps, an optax optimiser, an optax temperature
schedule, patience, the start points' noise), ``default_optimizer`` and ``GeometricTemperature``.

Its own module because the settings are what callers build and pass (``tune``, ``tune_many``, the
command line), and a key of the compiled training program (frozen, hashable), apart from the
program (``tune_program``) that reads them.
``mdl_jax.controller.tuning`` re-exports every public name here.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from mdl_jax.controller.validation import plain

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


def learning_rate_of(optimizer: optax.GradientTransformation) -> float | None:
    """The peak learning rate of an optimiser ``default_optimizer`` made, or None for any other (what a
    divergence warning names as the number to lower)."""
    return _LEARNING_RATE_OF.get(optimizer)


# The training loop counts steps in int32 (optax's step count, the history's step numbers).
MAX_STEPS = 2**31 - 1


def _check_steps(steps) -> None:
    if not (isinstance(steps, (int, np.integer)) and not isinstance(steps, bool) and 0 < steps <= MAX_STEPS):
        raise ValueError(f"steps: expected a positive int (at most 2**31 - 1), got {steps!r}")


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
        # optax passes the step as an int32 count: cast it to the float the exponent is (what JAX's
        # int / int division did implicitly), so the schedule also traces under strict dtype promotion
        frac = jnp.asarray(count, jnp.float32) / jnp.float32(max(self.steps - 1, 1))
        return self.start * (self.end / self.start) ** frac


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
                and not isinstance(self.init_noise, (bool, np.bool_))
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


def resolve_settings(settings: TuneSettings | None, options: dict, who: str) -> TuneSettings:
    """``settings`` with keyword shorthands applied.

    Keyword shorthands are the settings' own field names (``steps=300``). ``learning_rate`` (replaced by
    ``optimizer``) and a (start, end) ``temperature`` (replaced by a schedule) still work for one
    release, with a DeprecationWarning.

    Args:
      settings: ``TuneSettings``, or None for the defaults.
      options: {setting name: value} shorthands, plus the deprecated ``learning_rate``.
      who: the calling function's name, for the messages.

    Returns:
      The ``TuneSettings`` the call means.

    Raises:
      TypeError: ``settings`` not ``TuneSettings``, or a keyword that is not a setting.
      ValueError: a value outside its setting's domain; both ``learning_rate`` and ``optimizer``.
    """
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
    return settings


def check_temperature(settings: TuneSettings) -> None:
    """A given temperature schedule's τ at every step is finite and > 0, else a ValueError naming
    ``temperature`` and the first bad step: the soft decision divides by τ, so τ = 0 or NaN would stop
    the run at once as a "divergence" blamed on the step size, and τ < 0 would train toward the
    opposite decisions without any sign of it. A ``GeometricTemperature`` is checked when built."""
    schedule = settings.temperature
    if schedule is None or isinstance(schedule, GeometricTemperature):
        return
    try:
        with jax.numpy_dtype_promotion("standard"):   # optax's own promotion, as in the training loop
            taus = np.asarray(jax.vmap(schedule)(jnp.arange(settings.steps)), np.float32)  # τ as trained
    except Exception as e:  # noqa: BLE001 - whatever a user's schedule raises, said with its name
        raise ValueError(f"temperature: the schedule failed on the steps 0 .. {settings.steps - 1} "
                         f"({type(e).__name__}: {e})") from None
    # one τ a step, however the schedule shapes it (a 0-d constant, a (1,) array per step)
    taus = np.broadcast_to(taus, (settings.steps,)) if taus.ndim == 0 else taus
    taus = taus.reshape(settings.steps) if taus.size == settings.steps else taus
    if taus.shape != (settings.steps,):
        raise ValueError(f"temperature: expected a schedule giving one τ per step, got shape "
                         f"{taus.shape} for {settings.steps} steps")
    bad = ~(np.isfinite(taus) & (taus > 0))
    if bad.any():
        k = int(np.argmax(bad))
        raise ValueError(f"temperature: expected a schedule of finite values > 0, got τ = {plain(taus[k])} "
                         f"at step {k}")
