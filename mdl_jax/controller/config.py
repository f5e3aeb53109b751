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
import jax.numpy as jnp
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
    """Hyperparameters of the MDL controller (paper, Table 2, and Sections 3.2-3.4).

    Frozen: change fields with ``replace``. Numeric fields are pytree leaves (traceable numbers:
    ``jax.vmap`` / ``jax.grad`` run over them, and a batch of configs, built by ``config_grid`` or
    ``stack_configs``, holds them with a leading axis K); static fields choose shapes and branches
    at trace time and are part of the jit cache key. The defaults are the paper's.

    Examples:
      >>> cfg = MDLConfig().replace(thresholds=(0.7, 0.5, 0.3))
      >>> ablated = MDLConfig(alpha_gating=False)       # Table 7(a): w/o α gating

    Attributes:
      sigma: σ, width of the Gaussian value-encoding peaks (paper: 0.20). Numeric.
      eps_c: ε_c, cross-subspace leakage in W_k = s_k Π_k + ε_c Σ_{j≠k} Π_j (eq. 1; paper: 0.10);
        Theorem 1 needs eps_c < min(gains). Numeric.
      gains: s = (s_wm, s_r, s_a), the principal gains of eq. (1): (1.0, 0.7, 0.5). Numeric, (3,).
      g_A_coeffs: (a, b) of the risk gain g_A = a + b·mean(v_a); paper (0.5, 0.5). Numeric, (2,).
      gate_coeffs: (g_a, g_b), the α gating coefficients of C_final = C·(g_a + g_b·α); paper
        (0.3, 0.7). Numeric, (2,).
      thresholds: θ = (θ0, θ1, θ2), descending; paper (0.6, 0.4, 0.2). C_final ≥ θ0 → Active,
        ≥ θ1 → Supp, ≥ θ2 → Silent, else Opt-Out (a value exactly on a threshold takes the higher
        action). Numeric, (3,).
      bias: the fusion bias b of v_meta = tanh(... + b). The paper writes +b but never gives a value;
        we use the scalar 0 broadcast over D, which keeps the controller parameter-free. Numeric, a
        scalar or (D,).
      n_min: n_min, the lower end of the normalisation of the raw norm ‖v_meta‖ into C (eq. 2). The
        paper takes n_min and n_max from the calibration split: the minimum and maximum of
        ‖v_meta‖ over the calibration questions (Section 3.4). The defaults are computed the
        paper's way: over the signals of the TruthfulQA calibration split (80 questions, split seed
        0) under the other defaults here, by ``mdl_jax.pipeline.defaults.deployed_norm_range`` (no
        LLM needed; a test recomputes and pins them). An earlier version used the range over the
        whole signal cube [0, 1]^3 (``signal_cube_norm_range``: 1.252-3.281), which left an
        uncalibrated controller Active for 64% of the cube; real signals occupy the top of that
        range, so the deployed range is narrower and all four actions occur on ordinary inputs
        (``mdl-jax demo``). Numeric.
      n_max: n_max, the upper end of that normalisation (see ``n_min``). Numeric.
      D: D, the value-vector dimension (16). Static.
      dims: (d_wm, d_r, d_a), the subspace dimensions (5, 5, 6), summing to D. Static.
      qr_seed: seed of the random matrix R_rand whose QR decomposition gives the subspace bases
        (42). The paper does not say which random matrix; we use a standard-normal D×D matrix from
        ``numpy.random.default_rng(qr_seed)`` (stable across NumPy versions) and fix the QR sign so
        that diag(R) > 0, which makes Q unique. Static.
      alpha_gating: ablation switch of Table 7(a): False drops the α gate (C_final = C). Static.
      risk_modulation: ablation switch: False fixes g_A = 1. Static.
      subspaces: "qr" (orthogonal subspaces) or "identity" (ablation: every Π_k is the identity).
        Static.
      risk_inversion: ablation switch: False encodes A itself instead of s_A = 1 − A. Static.
      value_encoding: ablation switch: False encodes a signal as v(s) = s·1 without the Gaussian
        peaks. Static. (The five switches are the five ablations of Table 7(a); the defaults are
        the full controller.)

    Raises:
      ValueError: at construction, naming the field: every concrete numeric field must be a real
        number or array of them (not bool, complex or text), finite, and in its domain: sigma > 0
        (≥ 2^-63), gains ≥ 0, eps_c = 0 or 0 < eps_c < min(gains), thresholds in [0, 1] with
        θ0 ≥ θ1 ≥ θ2, n_max > n_min; dims a tuple of three positive ints summing to D, qr_seed an
        int ≥ 0, subspaces "qr" or "identity", the switches bools. The rules hold elementwise for a
        batch of configs (leaves shaped (K, ...)), and the message names the first bad config's
        index. Traced leaves (inside jit/vmap/grad) cannot be read and are not checked.
    """

    sigma: Any = 0.20
    eps_c: Any = 0.10
    gains: Any = (1.0, 0.7, 0.5)
    g_A_coeffs: Any = (0.5, 0.5)
    gate_coeffs: Any = (0.3, 0.7)
    thresholds: Any = (0.6, 0.4, 0.2)
    bias: Any = 0.0
    n_min: Any = 2.179652452468872
    n_max: Any = 3.1749186515808105
    D: int = 16
    dims: tuple[int, int, int] = (5, 5, 6)
    qr_seed: int = 42
    alpha_gating: bool = True
    risk_modulation: bool = True
    subspaces: str = "qr"
    risk_inversion: bool = True
    value_encoding: bool = True

    def __post_init__(self):
        # Invariants are checked once, here. Numeric ones only where the values are concrete: inside
        # vmap/grad a leaf may be a tracer, and pytree ops rebuild configs without this method.
        if not (_is_int(self.D) and self.D > 0):
            raise ValueError(f"D: expected a positive int, got {self.D!r}")
        # dims is static (part of the jit cache key), so it must be hashable: a tuple, not a list
        if not (isinstance(self.dims, tuple) and len(self.dims) == 3
                and all(_is_int(d) and d > 0 for d in self.dims)):
            raise ValueError(f"dims: expected a tuple of three positive ints, got {self.dims!r}")
        if sum(self.dims) != self.D:
            raise ValueError(f"dims: expected dimensions summing to D={self.D}, got {self.dims!r}")
        if not (_is_int(self.qr_seed) and self.qr_seed >= 0):
            raise ValueError(f"qr_seed: expected a non-negative int, got {self.qr_seed!r}")
        if self.subspaces not in ("qr", "identity"):
            raise ValueError(f"subspaces: expected 'qr' or 'identity', got {self.subspaces!r}")
        for name in ("alpha_gating", "risk_modulation", "risk_inversion", "value_encoding"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}: expected a bool, got {getattr(self, name)!r}")
        _check_numeric(self)

    def replace(self, **changes: Any) -> MDLConfig:
        """A copy with some fields changed (the config is frozen), checked like a new config.

        Args:
          **changes: field=value pairs, e.g. ``thresholds=(0.7, 0.5, 0.3)``.

        Returns:
          A new ``MDLConfig``.

        Raises:
          TypeError: a keyword that is not a field.
          ValueError: a value outside its field's domain (as at construction).
        """
        return dataclasses.replace(self, **changes)

    @property
    def projectors(self) -> np.ndarray:
        """Π_k as a (3, D, D) float64 array: QR-orthogonal, or the identity under the ablation."""
        return _projectors(self.D, self.dims, self.qr_seed, self.subspaces)

    @property
    def basis(self) -> np.ndarray:
        """Q from the QR decomposition, (D, D) float64; columns [0:d_wm], [d_wm:d_wm+d_r], rest span Π_k."""
        return _qr_basis(self.D, self.qr_seed)


def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


# Trailing (per-config) shape of each vector field; any leading axes are a batch of configs.
_VECTOR = {"gains": 3, "g_A_coeffs": 2, "gate_coeffs": 2, "thresholds": 3}


def _real(name: str, value) -> np.ndarray | None:
    """The field as a float64 array, or None when any of its leaves is traced (not checkable)."""
    if not _is_concrete(value):
        return None
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError, OverflowError) as e:  # ragged tuples and the like
        raise ValueError(f"{name}: expected a number or an array of real numbers, got "
                         f"{_short(value)} ({e})") from None
    # bool and complex are numbers to NumPy but not a value of any field; bfloat16 has kind 'V'
    if arr.dtype == np.bool_ or not (jnp.issubdtype(arr.dtype, jnp.integer)
                                     or jnp.issubdtype(arr.dtype, jnp.floating)):
        raise ValueError(f"{name}: expected a number or an array of real numbers, got {_short(value)} "
                         f"(dtype {arr.dtype})")
    arr = arr.astype(np.float64)
    if name in _VECTOR and arr.shape[-1:] != (_VECTOR[name],):
        raise ValueError(f"{name}: expected {_VECTOR[name]} values (a trailing axis of "
                         f"{_VECTOR[name]}), got shape {arr.shape}: {_short(value)}")
    return arr


def _fail(name: str, what: str, value, bad: np.ndarray) -> None:
    # ``bad`` holds one flag per config: 0-d for one config, (K, ...) for a batch of configs, so the
    # message can say which config of the batch is the first wrong one.
    if np.any(bad):
        where = "" if np.ndim(bad) == 0 else f" (first at index {_first(bad)})"
        raise ValueError(f"{name}: expected {what}, got {_short(value)}{where}")


def _short(value) -> str:
    # one line, bounded: a batch of configs can hold thousands of values. NumPy scalars print as the
    # number a user wrote (0.5, not np.float32(0.5)).
    if isinstance(value, np.generic):
        text = str(value)
    elif isinstance(value, (tuple, list)) and any(isinstance(x, np.generic) for x in value):
        inner = ", ".join(str(x) if isinstance(x, np.generic) else repr(x) for x in value)
        text = f"({inner})" if isinstance(value, tuple) else f"[{inner}]"
    else:
        text = " ".join(repr(value).split())
    return text if len(text) <= 200 else text[:200] + " ..."


def _first(bad: np.ndarray) -> tuple:
    return tuple(int(i) for i in np.unravel_index(int(np.argmax(bad)), np.shape(bad)))


def _broadcast(names: str, *arrays) -> tuple:
    try:
        return np.broadcast_arrays(*arrays)
    except ValueError:
        raise ValueError(f"{names}: expected batch axes that broadcast together, got shapes "
                         f"{[np.shape(a) for a in arrays]}") from None


# The smallest σ: 2^-63, the square root of float32's smallest normal number (see _check_numeric).
SIGMA_MIN = 2.0 ** -63


def _check_numeric(cfg: MDLConfig) -> None:
    """Every rule of a field in one mask per config, so the index named is the first config that
    is wrong for any reason (as ``decide`` names the first bad record)."""
    v = {f: _real(f, getattr(cfg, f)) for f in _NUMERIC}

    def per_config(name, bad):  # vector fields: a config is bad if any component is
        return bad.any(axis=-1) if name in _VECTOR else bad

    def finite(name):
        return ~np.isfinite(v[name])

    for name in ("bias", "g_A_coeffs", "gate_coeffs", "n_min"):
        if v[name] is not None:
            _fail(name, "finite values", getattr(cfg, name), per_config(name, finite(name)))
    if v["sigma"] is not None:
        # σ ≥ 2^-63 keeps σ² a normal float32: below it XLA flushes σ² to 0 and the pure-JAX path's
        # (s - c)²/(2σ²) is 0/0 = NaN at a centre, while the native kernel's 1/(2σ²) overflows (the two
        # paths then disagree); every σ from 2^-63 up is a finite, matching decision.
        _fail("sigma", f"a finite width > 0 (at least 2^-63 ≈ {SIGMA_MIN:.4g}, so σ² is a normal float32)",
              cfg.sigma, finite("sigma") | ~(v["sigma"] >= SIGMA_MIN))
    if v["gains"] is not None:
        # ≥ 0: a zero gain switches a pathway off (all zero with eps_c = 0 gives v_meta = tanh(b))
        _fail("gains", "finite gains ≥ 0", cfg.gains, per_config("gains", finite("gains") | ~(v["gains"] >= 0)))
    if v["eps_c"] is not None:
        bad = finite("eps_c") | ~(v["eps_c"] >= 0)
        what = "a finite leakage ≥ 0"
        if v["gains"] is not None:
            # Theorem 1's condition; eps_c = 0 (no leakage) keeps every pathway monotone for any gains
            eps, low = _broadcast("eps_c, gains", v["eps_c"], v["gains"].min(axis=-1))
            bad = bad | ((eps > 0) & (eps >= low))
            what += f", either 0 or < min(gains) (Theorem 1; gains={_short(cfg.gains)})"
        _fail("eps_c", what, cfg.eps_c, bad)
    th = v["thresholds"]
    if th is not None:
        bad = per_config("thresholds", ~((th >= 0) & (th <= 1)))  # NaN fails too
        bad = bad | (np.diff(th, axis=-1) > 0).any(axis=-1)
        _fail("thresholds", "finite values in [0, 1] with θ0 ≥ θ1 ≥ θ2", cfg.thresholds, bad)
    if v["n_max"] is not None:
        bad, what = finite("n_max"), "a finite value"
        if v["n_min"] is not None:
            lo, hi = _broadcast("n_min, n_max", v["n_min"], v["n_max"])
            bad, what = ~np.isfinite(hi) | ~(hi > lo), f"a finite value > n_min={_short(cfg.n_min)}"
        _fail("n_max", what, cfg.n_max, bad)


def _is_concrete(x) -> bool:
    return not any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(x))


@functools.cache
def _qr_basis(D: int, seed: int) -> np.ndarray:
    rand = np.random.default_rng(seed).standard_normal((D, D))
    q, r = np.linalg.qr(rand)
    q = q * np.sign(np.diag(r))[None, :]  # unique QR: positive diagonal of R
    q.setflags(write=False)
    return q


@functools.cache
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
