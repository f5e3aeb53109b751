"""Calibration (paper Section 3.4): n_min / n_max and thresholds θ from a held-out split.

n_min, n_max are the minimum and maximum raw norm ‖v_meta‖ over the calibration records. θ0 is chosen
by grid search to maximise agreement with binary oracle labels (adopt ⇔ Active, i.e. C_final ≥ θ0);
θ1 = θ0 - offset and θ2 = θ0 - 2·offset (clipped at 0). The whole grid is scored in one jitted,
vectorised pass: (G thresholds) × (N records) comparisons, no Python loop.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from mdl_jax.controller import api
from mdl_jax.controller.config import MDLConfig
from mdl_jax.controller.validation import binary_labels, check_unit_interval, common_shape


class Calibration(NamedTuple):
    """What calibration measured. ``config`` is the calibrated config; ``agreement[g]`` is the oracle
    agreement of threshold ``grid[g]``; ``best_agreement`` is the maximum."""

    config: MDLConfig
    grid: np.ndarray
    agreement: np.ndarray
    best_agreement: float


@jax.jit
def grid_agreement(C_final: jax.Array, adopt: jax.Array, grid: jax.Array) -> jax.Array:
    """Agreement of 'adopt iff C_final ≥ θ' with the labels, for every θ in ``grid``: (G,)."""
    pred = C_final[None, :] >= grid[:, None]
    return jnp.mean(pred == adopt[None, :].astype(bool), axis=1)


def calibrate(M, R, A, adopt, config: MDLConfig | None = None, *, offset: float = 0.2,
              grid_size: int = 1001) -> Calibration:
    """Calibrate n_min, n_max and θ on a calibration split.

    Args:
      M, R, A: (N,) signals of the calibration questions, in [0, 1].
      adopt: (N,) binary oracle labels: 1 (or True) where the memory should be adopted (Active),
        0 (or False) otherwise.
      config: the starting config (paper defaults when None); its other fields are kept.
      offset: θ1 = θ0 - offset, θ2 = θ0 - 2·offset (the paper's defaults are spaced by 0.2).
      grid_size: number of evenly spaced θ0 candidates in [0, 1].

    Ties between equally good thresholds go to the smallest θ0 (the first maximiser).
    """
    cfg = api._config(config)
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
    if isinstance(grid_size, bool) or not isinstance(grid_size, (int, np.integer)) or grid_size < 2:
        raise ValueError(f"grid_size: expected an int ≥ 2, got {grid_size!r}")

    # M, R, A were checked above: decide need not check them again
    raw = api.decide(M, R, A, cfg, validate=False).norm
    n_min, n_max = float(jnp.min(raw)), float(jnp.max(raw))
    if not n_max > n_min:
        # A degenerate split (all records identical) cannot define a range; widen it symmetrically so
        # C stays finite (it is 0.5 for every calibration record).
        n_min, n_max = n_min - 0.5, n_max + 0.5
    cfg = cfg.replace(n_min=n_min, n_max=n_max)
    c_final = api.decide(M, R, A, cfg, validate=False).C_final
    grid = np.linspace(0.0, 1.0, grid_size)  # float64, so θ0 is an exact grid value like 0.6
    # scored in at least float32: in bfloat16 neighbouring grid values 0.001 apart would coincide
    c_final = c_final.astype(jnp.promote_types(c_final.dtype, jnp.float32))
    agreement = grid_agreement(c_final, jnp.asarray(labels), jnp.asarray(grid, c_final.dtype))
    best = int(jnp.argmax(agreement))
    theta0 = float(grid[best])
    thresholds = (theta0, max(theta0 - offset, 0.0), max(theta0 - 2 * offset, 0.0))
    return Calibration(cfg.replace(thresholds=thresholds), grid, np.asarray(agreement),
                       float(agreement[best]))
