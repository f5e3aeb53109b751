"""Calibration (paper Section 3.4): n_min / n_max and thresholds θ from a held-out split.

n_min, n_max are the minimum and maximum raw norm ‖v_meta‖ over the calibration records. θ0 is chosen
by grid search to maximise agreement with binary oracle labels (adopt ⇔ Active, i.e. C_final ≥ θ0);
θ1 = θ0 - offset and θ2 = θ0 - 2·offset (clipped at 0). The whole grid is scored in one jitted,
vectorised pass: (G thresholds) × (N records) comparisons, no Python loop.

Ties. Agreement is a count over N records, so many θ0 often share the best value (the *tied plateau*:
every grid value between two neighbouring calibration C_final values scores the same, and a split whose
best rule is a constant classifier ties over a long stretch of the grid). The split cannot tell tied
values apart, so the rule that picks one is a choice, and it is stated: ``tie_break="middle"`` (the
default) takes the middle of the widest contiguous run of tied grid values. A contiguous run is the gap
between two neighbouring calibration C_final values, so its middle is the threshold farthest from every
calibration record on either side (the one-dimensional maximum margin): it moves least when the split's
records move a little, and it leans neither toward adopting (the run's lowest θ0: most Active) nor
toward withholding. Equally wide runs go to the lowest. ``"lowest"`` is the
rule of earlier versions (the first maximiser, i.e. the most Active); the configs shipped in
``pipeline/resources/calibrated/`` and the committed runs were calibrated with it and keep it.
``Calibration`` reports the plateau (its ends and count) and the θ0 each rule would take.

Degenerate optima. When the best agreement equals that of a constant classifier (always adopt = the
share of adopt labels; never adopt = the rest), no threshold beats ignoring the signals; calibration
then still returns a config, but ``constant`` names the constant rule and a ``UserWarning`` says so.
``opt_out_possible`` is False when θ2 = max(θ0 − 2·offset, 0) is 0: C_final ≥ 0 always, so such a
config can never choose Opt-Out.
"""

from __future__ import annotations

import math
import os
import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from mdl_jax.controller import api
from mdl_jax.controller.config import MDLConfig
from mdl_jax.controller.validation import ArrayLike, binary_labels, check_unit_interval, common_shape


class Calibration(NamedTuple):
    """What calibration measured. ``config`` is the calibrated config; ``agreement[g]`` is the oracle
    agreement of threshold ``grid[g]``; ``best_agreement`` is the maximum.

    The fields after ``best_agreement`` (defaulted, so code that built or unpacked the first four keeps
    working) describe ties and degenerate optima (module docstring): ``plateau`` is the (lowest, highest)
    tied θ0 and ``n_tied`` how many grid values tie (the tied set can have gaps); ``tie_break`` is the
    rule used, ``theta0_lowest`` / ``theta0_middle`` what each rule picks; ``constant`` is "always adopt"
    or "never adopt" when the best agreement equals that constant classifier's (else None);
    ``adopt_share`` is the share of calibration records the calibrated config makes Active;
    ``opt_out_possible`` is False when θ2 = 0.

    Attributes:
      config: the starting config with n_min, n_max (min / max raw ‖v_meta‖ over the split) and
        thresholds θ = (θ0, θ0 − offset, θ0 − 2·offset), the lower two clipped at 0, replaced.
      grid: (G,) float64, the θ0 candidates, evenly spaced over [0, 1] (G = ``grid_size``).
      agreement: (G,) float, the share of calibration records where "adopt ⇔ C_final ≥ grid[g]"
        matches the oracle label.
      best_agreement: max(agreement), the agreement of the chosen θ0.
      plateau: (lowest, highest) θ0 among the grid values tied at ``best_agreement``.
      n_tied: how many grid values tie at ``best_agreement``.
      tie_break: the rule that picked θ0 among them: "middle" or "lowest".
      theta0_lowest: the θ0 the "lowest" rule picks (the first maximiser: most Active).
      theta0_middle: the θ0 the "middle" rule picks (middle of the widest contiguous tied run).
      constant: "always adopt" or "never adopt" when the best agreement equals that constant
        classifier's (no threshold beats ignoring the signals), else None.
      adopt_share: share of calibration records the calibrated config makes Active.
      opt_out_possible: False when θ2 = 0, so the config can never choose Opt-Out.
    """

    config: MDLConfig
    grid: np.ndarray
    agreement: np.ndarray
    best_agreement: float
    plateau: tuple[float, float] = (float("nan"), float("nan"))
    n_tied: int = 0
    tie_break: str = "middle"
    theta0_lowest: float = float("nan")
    theta0_middle: float = float("nan")
    constant: str | None = None
    adopt_share: float = float("nan")
    opt_out_possible: bool = True


# The θ0 grid's bound (16 bytes a candidate): float32 C_final values near 1 lie 6e-8 apart, so a grid
# finer than 10^7 candidates adds only ties.
MAX_GRID_SIZE = 10**7


@jax.jit
def grid_counts(C_final: jax.Array, adopt: jax.Array, grid: jax.Array) -> jax.Array:
    """How many records 'adopt iff C_final ≥ θ' agrees with the labels on, for every θ in ``grid``.

    Args:
      C_final: (N,) the records' C_final.
      adopt: (N,) binary oracle labels.
      grid: (G,) thresholds θ.

    Returns:
      (G,) int32 counts (int64 under x64; exact below 2**31 records).
    """
    # Counted from one sort instead of a (G, N) comparison matrix (3.9 GB more at N = 10^6, G = 1001):
    # records with C_final < θ are a prefix of the sorted order, found by searchsorted; the adopt labels'
    # cumulative count over that order splits the prefix by label. Memory is O(N + G), and the counts
    # are exactly the matrix's.
    order = jnp.argsort(C_final)
    lab = adopt.astype(bool)[order].astype(jnp.int32)
    below = jnp.searchsorted(C_final[order], grid.astype(C_final.dtype), side="left")   # #{C_final < θ}
    adopt_below = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(lab)])[below]
    return (jnp.sum(lab) - adopt_below) + (below - adopt_below)   # adopt ∧ ≥ θ, plus ¬adopt ∧ < θ


@jax.jit
def _share(counts: jax.Array, n: int) -> jax.Array:
    dt = jnp.mean(jnp.zeros((1,), bool)).dtype                    # what the mean of booleans was
    return counts.astype(dt) / jnp.asarray(n, dt)


def grid_agreement(C_final: jax.Array, adopt: jax.Array, grid: jax.Array) -> jax.Array:
    """Agreement of 'adopt iff C_final ≥ θ' with the labels, for every θ in ``grid``: (G,), the
    ``grid_counts`` over N as the mean of the comparison matrix would give it (float32 without x64,
    where counts over 2**24 records apart can round to one value: compare ``grid_counts``)."""
    return _share(grid_counts(C_final, adopt, grid), C_final.shape[0])


TIE_BREAKS = ("middle", "lowest")


def tied_plateau(agreement, tie_break: str = "middle") -> tuple[int, np.ndarray]:
    """(index of the chosen θ0, indices of every grid value tied at the best agreement).

    ``agreement`` (G,) over an ascending grid, compared exactly (``calibrate`` passes the counts). "middle":
    the middle (lower middle for an even count) of the widest run of consecutive tied indices, the
    lowest such run when several are equally wide; "lowest": the first tied index."""
    agreement = np.asarray(agreement)
    tied = np.flatnonzero(agreement == agreement.max())
    if tie_break == "lowest":
        return int(tied[0]), tied
    runs = np.split(tied, np.flatnonzero(np.diff(tied) > 1) + 1)
    widest = max(runs, key=len)  # max keeps the first of equally long runs: the lowest
    return int(widest[(len(widest) - 1) // 2]), tied


def calibrate(M: ArrayLike, R: ArrayLike, A: ArrayLike, adopt: ArrayLike,
              config: MDLConfig | str | os.PathLike | None = None, *, offset: float = 0.2,
              grid_size: int = 1001, tie_break: str = "middle", engine: str = "jax") -> Calibration:
    """Calibrate n_min, n_max and θ on a calibration split (paper Section 3.4).

    Examples:
      >>> cal = calibrate(M, R, A, adopt)        # (N,) signals and labels of the calibration split
      >>> cal.config.thresholds, cal.best_agreement, cal.constant   # doctest: +SKIP

    Args:
      M: (N,) relevance of the calibration questions, real numbers in [0, 1], N ≥ 2 (1-d: a scalar
        does not broadcast here).
      R: (N,) reliability, as ``M``.
      A: (N,) task risk, as ``M``.
      adopt: (N,) binary oracle labels (bool, or numbers that are all 0 or 1): 1 (or True) where the
        memory should be adopted (Active), 0 (or False) otherwise.
      config: the starting config (an ``MDLConfig`` or a config file path; paper defaults when None);
        its other fields are kept.
      offset: θ1 = θ0 - offset, θ2 = θ0 - 2·offset, clipped at 0 (the paper's defaults are spaced by
        0.2); a finite number ≥ 0.
      grid_size: number of evenly spaced θ0 candidates in [0, 1], an int in [2, ``MAX_GRID_SIZE``].
      tie_break: "middle" (default: the middle of the widest run of tied θ0) or "lowest" (the smallest
        tied θ0, the earlier versions' rule); see the module docstring for why.
      engine: the engine that decides the split's records (``decide``'s ``engine``): "jax" (default),
        "native", "pallas" or "auto".

    Returns:
      A ``Calibration``: the calibrated config, the grid and its agreement, and how θ0 was chosen.

    Raises:
      ValueError: a signal outside [0, 1] (naming it and the first bad index), not 1-d, fewer than
        2 records or shapes that differ; labels that are not binary; ``offset``, ``grid_size`` or
        ``tie_break`` outside their domains (each named); a batched or unreadable config; an
        unknown ``engine``, or a named one that cannot run here.
      TypeError: ``config`` is neither an ``MDLConfig``, a path nor None.

    Warns:
      UserWarning: when the best agreement is a constant classifier's (``constant``).
    """
    cfg = api.resolve_config(config)
    api.check_engine(engine)
    for n, x in (("M", M), ("R", R), ("A", A)):
        check_unit_interval(n, x)
    labels = binary_labels(adopt)
    for n, x in (("M", M), ("R", R), ("A", A), ("adopt", labels)):
        # a split is N records: scalars do not broadcast here (a scalar label is a mistake)
        if np.ndim(x) != 1:
            raise ValueError(f"{n}: expected a 1-d calibration split of N ≥ 2 records, got shape "
                             f"{np.shape(x)}")
    shape = common_shape(("M", "R", "A", "adopt"), (M, R, A, labels))
    if shape[0] < 2:
        raise ValueError(f"M: expected a 1-d calibration split of at least 2 records, got shape {shape}")
    if isinstance(offset, bool) or not isinstance(offset, (int, float, np.integer, np.floating)) \
            or not (math.isfinite(offset) and offset >= 0):
        raise ValueError(f"offset: expected a finite number ≥ 0, got {offset!r}")
    if (isinstance(grid_size, bool) or not isinstance(grid_size, (int, np.integer))
            or not 2 <= grid_size <= MAX_GRID_SIZE):
        raise ValueError(f"grid_size: expected an int in [2, {MAX_GRID_SIZE:,}], got {grid_size!r}")
    if tie_break not in TIE_BREAKS:
        raise ValueError(f"tie_break: expected one of {', '.join(map(repr, TIE_BREAKS))}, "
                         f"got {tie_break!r}")

    # M, R, A were checked above: decide need not check them again
    raw = api.decide(M, R, A, cfg, validate=False, engine=engine).norm
    n_min, n_max = float(jnp.min(raw)), float(jnp.max(raw))
    if not n_max > n_min:
        # A degenerate split (all records identical) cannot define a range; widen it symmetrically so
        # C stays finite (it is 0.5 for every calibration record).
        n_min, n_max = n_min - 0.5, n_max + 0.5
    cfg = cfg.replace(n_min=n_min, n_max=n_max)
    c_final = api.decide(M, R, A, cfg, validate=False, engine=engine).C_final
    grid = np.linspace(0.0, 1.0, grid_size)  # float64, so θ0 is an exact grid value like 0.6
    # scored in at least float32: in bfloat16 neighbouring grid values 0.001 apart would coincide
    c_final = c_final.astype(jnp.promote_types(c_final.dtype, jnp.float32))
    counts = grid_counts(c_final, jnp.asarray(labels), jnp.asarray(grid, c_final.dtype))
    agreement = np.asarray(_share(counts, c_final.shape[0]))
    # θ0 and its ties are chosen on the exact counts: above 2**24 records two counts can share a float32
    counts = np.asarray(counts)
    best, tied = tied_plateau(counts, tie_break)
    theta0 = float(grid[best])
    thresholds = (theta0, max(theta0 - offset, 0.0), max(theta0 - 2 * offset, 0.0))
    lab = np.asarray(labels).astype(bool).ravel()
    n_rec = lab.size
    best_count = int(counts[best])
    constant = ("always adopt" if best_count == int(lab.sum()) else
                "never adopt" if best_count == n_rec - int(lab.sum()) else None)
    adopt_share = float(np.mean(np.asarray(c_final) >= np.asarray(theta0, np.asarray(c_final).dtype)))
    if constant is not None:
        warnings.warn(f"calibrate: the best agreement ({agreement[best]:.3f}) equals the constant "
                      f"classifier '{constant}': no threshold beats ignoring the signals on this split "
                      f"({_tied_msg(tied, grid)})", UserWarning, stacklevel=2)
    return Calibration(cfg.replace(thresholds=thresholds), grid, agreement, float(agreement[best]),
                       plateau=(float(grid[tied[0]]), float(grid[tied[-1]])), n_tied=int(len(tied)),
                       tie_break=tie_break, theta0_lowest=float(grid[tied[0]]),
                       theta0_middle=float(grid[tied_plateau(counts, "middle")[0]]),
                       constant=constant,
                       adopt_share=adopt_share, opt_out_possible=bool(thresholds[2] > 0))


def _tied_msg(tied, grid) -> str:
    return f"{len(tied)} grid values of θ0 tie, from {grid[tied[0]]:.3f} to {grid[tied[-1]]:.3f}"
