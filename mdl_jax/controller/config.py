"""The controller's frozen configuration: Table 2 of the paper, zero trained parameters.

Numeric fields are pytree leaves, so ``jax.vmap`` and ``jax.grad`` run over them (sensitivity sweeps,
gradient-tuned gates). Structural fields (dimensions, QR seed, ablation switches) are static: they choose
shapes and branches at trace time and take part in the jit cache key.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import numpy as np

# Fields that are pytree leaves (traceable numbers) versus static aux data.
_NUMERIC = (
    "sigma", "eps_c", "gains", "g_A_coeffs", "gate_coeffs", "thresholds", "bias", "n_min", "n_max",
)
_STATIC = (
    "D", "dims", "qr_seed", "alpha_gating", "risk_modulation", "subspaces", "risk_inversion",
    "value_encoding",
)


@dataclasses.dataclass(frozen=True)
class MDLConfig:
    """Hyperparameters of the MDL controller (paper, Table 2).

    Numeric fields (pytree leaves):
      sigma: width of the Gaussian value-encoding peaks (paper: 0.20).
      eps_c: cross-subspace leakage in W_k = s_k Π_k + ε_c Σ_{j≠k} Π_j (paper: 0.10); Theorem 1 needs
        eps_c < min(gains).
      gains: principal gains (s_wm, s_r, s_a) = (1.0, 0.7, 0.5).
      g_A_coeffs: (a, b) of the risk gain g_A = a + b·mean(v_a); paper (0.5, 0.5).
      gate_coeffs: (g_a, g_b) of C_final = C·(g_a + g_b·α); paper (0.3, 0.7).
      thresholds: θ = (θ0, θ1, θ2), descending; paper (0.6, 0.4, 0.2). C_final ≥ θ0 → Active,
        ≥ θ1 → Supp, ≥ θ2 → Silent, else Opt-Out (a value exactly on a threshold takes the higher action).
      bias: the fusion bias b. The paper writes +b but never gives a value; we use the scalar 0 broadcast
        over D, which keeps the controller parameter-free.
      n_min, n_max: normalisation of the raw norm ‖v_meta‖ into C. The paper takes them from the
        calibration split (see ``calibrate``); before any calibration it gives no value, so the defaults are
        the minimum and maximum of ‖v_meta‖ over the whole signal cube [0, 1]^3 on a 41^3 grid under the
        default settings (computed by ``signal_cube_norm_range``, pinned by a test). Then C spans [0, 1]
        over every possible input instead of clipping.

    Static fields:
      D: value-vector dimension (16). dims: subspace dimensions (d_wm, d_r, d_a) = (5, 5, 6), summing to D.
      qr_seed: seed of the random matrix whose QR decomposition gives the subspace bases (42). The paper
        does not say which random matrix; we use a standard-normal D×D matrix from
        ``numpy.random.default_rng(qr_seed)`` (stable across NumPy versions) and fix the QR sign so that
        diag(R) > 0, which makes Q unique.
      alpha_gating, risk_modulation, subspaces ("qr" | "identity"), risk_inversion, value_encoding: the five
        ablations of Table 7(a); the defaults are the full controller.
    """

    sigma: Any = 0.20
    eps_c: Any = 0.10
    gains: Any = (1.0, 0.7, 0.5)
    g_A_coeffs: Any = (0.5, 0.5)
    gate_coeffs: Any = (0.3, 0.7)
    thresholds: Any = (0.6, 0.4, 0.2)
    bias: Any = 0.0
    n_min: Any = 1.2522579431533813
    n_max: Any = 3.2805850505828857
    D: int = 16
    dims: tuple[int, int, int] = (5, 5, 6)
    qr_seed: int = 42
    alpha_gating: bool = True
    risk_modulation: bool = True
    subspaces: str = "qr"
    risk_inversion: bool = True
    value_encoding: bool = True

    def __post_init__(self):
        # Structural invariants are checked once, here; numeric ones only when the values are concrete
        # (they may be tracers inside vmap/grad).
        if not (isinstance(self.D, int) and self.D > 0):
            raise ValueError(f"D: expected a positive int, got {self.D!r}")
        if len(self.dims) != 3 or any((not isinstance(d, int)) or d <= 0 for d in self.dims):
            raise ValueError(f"dims: expected three positive ints, got {self.dims!r}")
        if sum(self.dims) != self.D:
            raise ValueError(f"dims: expected dimensions summing to D={self.D}, got {self.dims!r}")
        if self.subspaces not in ("qr", "identity"):
            raise ValueError(f"subspaces: expected 'qr' or 'identity', got {self.subspaces!r}")
        for name in ("alpha_gating", "risk_modulation", "risk_inversion", "value_encoding"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}: expected a bool, got {getattr(self, name)!r}")
        if _is_concrete(self.sigma) and not float(np.min(self.sigma)) > 0:
            raise ValueError(f"sigma: expected > 0, got {self.sigma!r}")
        if _is_concrete(self.thresholds):
            th = np.asarray(self.thresholds, dtype=np.float64)
            if th.shape[-1:] != (3,):
                raise ValueError(f"thresholds: expected three values (θ0, θ1, θ2), got shape {th.shape}")
            if np.any(np.diff(th, axis=-1) > 0):
                raise ValueError(f"thresholds: expected θ0 ≥ θ1 ≥ θ2, got {self.thresholds!r}")
        if _is_concrete(self.n_min) and _is_concrete(self.n_max):
            if not np.all(np.asarray(self.n_max) > np.asarray(self.n_min)):
                raise ValueError(f"n_max: expected > n_min={self.n_min!r}, got {self.n_max!r}")
        for name, size in (("gains", 3), ("g_A_coeffs", 2), ("gate_coeffs", 2)):
            v = getattr(self, name)
            if _is_concrete(v) and np.shape(v)[-1:] != (size,):
                raise ValueError(f"{name}: expected {size} values, got {v!r}")

    def replace(self, **changes) -> "MDLConfig":
        """A copy with some fields changed (the config is frozen)."""
        return dataclasses.replace(self, **changes)

    @property
    def projectors(self) -> np.ndarray:
        """Π_k as a (3, D, D) float64 array: QR-orthogonal, or the identity under the ablation."""
        return _projectors(self.D, self.dims, self.qr_seed, self.subspaces)

    @property
    def basis(self) -> np.ndarray:
        """Q from the QR decomposition, (D, D) float64; columns [0:d_wm], [d_wm:d_wm+d_r], rest span Π_k."""
        return _qr_basis(self.D, self.qr_seed)


def _is_concrete(x) -> bool:
    return not any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(x))


@functools.lru_cache(maxsize=None)
def _qr_basis(D: int, seed: int) -> np.ndarray:
    rand = np.random.default_rng(seed).standard_normal((D, D))
    q, r = np.linalg.qr(rand)
    q = q * np.sign(np.diag(r))[None, :]  # unique QR: positive diagonal of R
    q.setflags(write=False)
    return q


@functools.lru_cache(maxsize=None)
def _projectors(D: int, dims: tuple[int, int, int], seed: int, subspaces: str) -> np.ndarray:
    if subspaces == "identity":
        # Ablation "w/o orthogonal subspaces": every Π_k is the identity, so eq. (1) gives
        # W_k = (s_k + 2 ε_c) I and Lemma 1 no longer holds (each 'energy' is the full ‖v‖²).
        out = np.broadcast_to(np.eye(D), (3, D, D)).copy()
    else:
        q = _qr_basis(D, seed)
        edges = np.cumsum((0,) + tuple(dims))
        out = np.stack([q[:, a:b] @ q[:, a:b].T for a, b in zip(edges[:-1], edges[1:])])
    out.setflags(write=False)
    return out


def _flatten(cfg: MDLConfig):
    return tuple(getattr(cfg, f) for f in _NUMERIC), tuple(getattr(cfg, f) for f in _STATIC)


def _unflatten(aux, children) -> MDLConfig:
    obj = object.__new__(MDLConfig)  # skip __post_init__: leaves may be tracers or placeholders
    for f, v in zip(_NUMERIC, children):
        object.__setattr__(obj, f, v)
    for f, v in zip(_STATIC, aux):
        object.__setattr__(obj, f, v)
    return obj


jax.tree_util.register_pytree_node(MDLConfig, _flatten, _unflatten)

NUMERIC_FIELDS = _NUMERIC
STATIC_FIELDS = _STATIC
