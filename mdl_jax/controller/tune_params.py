"""The tuning parametrisation: free parameters ↔ a config that keeps the paper's invariants.

    σ = softplus(u) + 1e-3                         σ > 0
    s_k = softplus(u_k) + 1e-3;  ε_c = sigmoid(v)·(1 − 1e-3)·min_k s_k    0 ≤ ε_c < min s_k (Theorem 1)
    θ2 = sigmoid(a), θ1 = θ2 + (1−θ2)·sigmoid(b), θ0 = θ1 + (1−θ1)·sigmoid(c)     1 ≥ θ0 ≥ θ1 ≥ θ2 ≥ 0
    n_max = n_min + softplus(w) + 1e-3             n_max > n_min

Its own module because it is the one statement of how a trained config stays valid: the training
program (``tune_program``) differentiates through ``from_unconstrained``, and tests and callers map
a config to its free parameters and back with the same two functions. ``mdl_jax.controller.tuning``
re-exports them.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from mdl_jax.controller.batches import with_leaves
from mdl_jax.controller.config import NUMERIC_FIELDS, MDLConfig

# The margin every constrained field keeps from its bound.
_EPS = 1e-3


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
    # MDLConfig.replace would re-run the concrete-value checks on tracers: rebuilt through the pytree
    return with_leaves(base, {
        **free,
        "sigma": pick("sigma", jax.nn.softplus(u["sigma"]) + _EPS), "gains": gains,
        # (1 − 1e-3): sigmoid rounds to exactly 1 in float32 for large inputs; ε_c must stay below
        "eps_c": pick("eps_c", jax.nn.sigmoid(u["eps_c"]) * (1 - _EPS) * jnp.min(gains)),
        "thresholds": pick("thresholds", jnp.stack([t0, t1, t2])), "n_min": n_min, "n_max": n_max})


def field_mask(fields: Sequence[str]) -> dict:
    """1.0 for the trained fields, 0.0 for the frozen ones."""
    unknown = [f for f in fields if f not in NUMERIC_FIELDS]
    if unknown or not fields:
        raise ValueError(f"fields: expected a non-empty subset of {list(NUMERIC_FIELDS)}, got "
                         f"{list(fields)!r}")
    return {f: jnp.float32(f in fields) for f in NUMERIC_FIELDS}
