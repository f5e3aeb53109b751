"""The MDL controller (paper Section 3, eqs. 1-2, Algorithm 1) as pure functions of ONE record.

Stages, in the order of Algorithm 1:
  encode        v(s) = s·1_D + Σ_i exp(-(s - c_i)² / 2σ²) e_i                    (value encoding)
  fuse          v_meta = tanh(g_A W_wm v_wm + W_r v_r + W_a v_a + b),  W_k from eq. (1)
  read_out      C = clip((‖v_meta‖ - n_min)/(n_max - n_min), 0, 1),  α = cos(v_wm, v_meta)   (eq. 2)
  gate + act    C_final = C·(g_a + g_b α) → one of four actions by θ

Everything here is written for scalar M, R, A; ``mdl_jax.controller.api`` vmaps/jits it at the public edge.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from mdl_jax.controller.config import MDLConfig

# Full-precision products: on GPUs JAX's default float32 matmul uses TF32, which moved C_final by ~2e-4
# between CPU and an H200. HIGHEST keeps CPU and GPU within 1e-5.
PRECISION = jax.lax.Precision.HIGHEST


class Action(enum.IntEnum):
    """The four-level action (Section 3.3), ordered from most to least trusting.

    An ``IntEnum``: ``Decision.action`` holds these codes as int32, and the last axis of
    ``soft_decide``'s probabilities is in this order (index 0 is P(Active)).

    Attributes:
      ACTIVE: 0, C_final ≥ θ0: inject the memories.
      SUPP: 1, θ0 > C_final ≥ θ1: inject them with a caution instruction.
      SILENT: 2, θ1 > C_final ≥ θ2: answer without the memories.
      OPT_OUT: 3, C_final < θ2 (or a NaN or ±inf signal): abstain explicitly, no model call.
    """

    ACTIVE = 0    # inject the memories
    SUPP = 1      # inject with a caution instruction
    SILENT = 2    # answer without memories
    OPT_OUT = 3   # abstain explicitly, no model call

    @property
    def label(self) -> str:
        """The paper's spelling, used in every output a person reads: "Active", "Supp", "Silent",
        "Opt-Out". (``name`` stays the enum's: records files and CSV columns keep ``ACTIVE`` etc.)"""
        return ACTION_LABELS[self]


# The paper's spelling of each action (Section 3.3), for everything a person reads.
ACTION_LABELS = {Action.ACTIVE: "Active", Action.SUPP: "Supp", Action.SILENT: "Silent", Action.OPT_OUT: "Opt-Out"}


class Decision(NamedTuple):
    """Controller output; every field has the input's leading shape (``...``).

    The float fields are float32 (float64 for float64 input under x64), as ``decide`` says.

    Attributes:
      action: (...) int32 codes of ``Action`` (the action a of Algorithm 1).
      C: (...) float confidence C in [0, 1] (eq. 2).
      alpha: (...) float directional consistency α = cos(v_wm, v_meta) in [-1, 1] (eq. 2); 0 where
        either vector has zero norm.
      C_final: (...) float gated confidence C_final = C·(g_a + g_b·α), the value the thresholds θ
        compare.
      v_meta: (..., D) float fused representation v_meta (D = 16 by default).
      energies: (..., 3) float ‖Π_k v_meta‖² per subspace (wm, r, a): the Lemma 1 attribution
        interface, summing to ‖v_meta‖² under QR subspaces.
      norm: (...) float raw ‖v_meta‖ (what calibration normalises into C with n_min, n_max).
      g_A: (...) float risk gain g_A applied to the relevance pathway.
    """

    action: jax.Array
    C: jax.Array
    alpha: jax.Array
    C_final: jax.Array
    v_meta: jax.Array
    energies: jax.Array
    norm: jax.Array
    g_A: jax.Array


def centres(cfg: MDLConfig, dtype=jnp.float32) -> jax.Array:
    """Gaussian centres c_i. The paper does not give them; we space D of them evenly over [0, 1] so every
    signal value sits near some peak and v(0), v(1) are mirror images."""
    return jnp.linspace(0.0, 1.0, cfg.D, dtype=dtype)


def encode(s: jax.Array, cfg: MDLConfig) -> jax.Array:
    """Value encoding of one scalar in [0, 1] → (D,). Ablation ``value_encoding=False``: v(s) = s·1."""
    ones = jnp.ones((cfg.D,), dtype=s.dtype)
    if not cfg.value_encoding:
        return s * ones
    c = centres(cfg, s.dtype)
    sigma = jnp.asarray(cfg.sigma, s.dtype)
    return s * ones + jnp.exp(-((s - c) ** 2) / (2.0 * sigma**2))


def weight_matrices(cfg: MDLConfig, dtype=jnp.float32) -> jax.Array:
    """W_k = s_k Π_k + ε_c Σ_{j≠k} Π_j for k = wm, r, a, as a (3, D, D) array (eq. 1)."""
    pi = jnp.asarray(cfg.projectors, dtype)
    gains = jnp.asarray(cfg.gains, dtype)
    eps = jnp.asarray(cfg.eps_c, dtype)
    others = pi.sum(0)[None] - pi
    return gains[:, None, None] * pi + eps * others


def risk_gain(v_a: jax.Array, cfg: MDLConfig) -> jax.Array:
    """g_A = a + b·mean(v_a) (paper a = b = 0.5); 1 under the ``risk_modulation=False`` ablation."""
    if not cfg.risk_modulation:
        return jnp.ones((), v_a.dtype)
    a, b = (jnp.asarray(x, v_a.dtype) for x in cfg.g_A_coeffs)
    return a + b * jnp.mean(v_a)


def fuse(M, R, A, cfg: MDLConfig):
    """The first two stages: encode the signals (risk inverted: s_A = 1 - A) and fuse them. Returns
    (v_meta, v_wm, g_A)."""
    s_a = 1.0 - A if cfg.risk_inversion else A
    v_wm, v_r, v_a = encode(M, cfg), encode(R, cfg), encode(s_a, cfg)
    g_A = risk_gain(v_a, cfg)
    W = weight_matrices(cfg, M.dtype)
    # Σ_k c_k W_k v_k as ONE contraction over (k, j): batched, it is a single (N, 48) × (48, 16) matmul
    # instead of three K = 16 ones plus adds.
    V = jnp.stack([g_A * v_wm, v_r, v_a])
    z = jnp.einsum("kij,kj->i", W, V, precision=PRECISION) + jnp.asarray(cfg.bias, M.dtype)
    return jnp.tanh(z), v_wm, g_A


def safe_norm(v: jax.Array) -> jax.Array:
    """‖v‖ with a finite gradient at v = 0 (the double-where trick), so no NaN reaches grad users."""
    sq = jnp.sum(v * v)
    pos = sq > 0
    return jnp.where(pos, jnp.sqrt(jnp.where(pos, sq, 1.0)), 0.0)


def read_out(v_meta, v_wm, cfg: MDLConfig):
    """Eq. (2): returns (C, alpha, raw norm). α is defined as 0 when either vector has zero norm (the
    direction is undefined there); this is the only place a NaN could otherwise arise."""
    n = safe_norm(v_meta)
    n_wm = safe_norm(v_wm)
    n_min = jnp.asarray(cfg.n_min, v_meta.dtype)
    n_max = jnp.asarray(cfg.n_max, v_meta.dtype)
    C = jnp.clip((n - n_min) / (n_max - n_min), 0.0, 1.0)
    denom = n * n_wm
    ok = denom > 0
    alpha = jnp.where(ok, jnp.dot(v_wm, v_meta, precision=PRECISION) / jnp.where(ok, denom, 1.0), 0.0)
    # Cauchy-Schwarz holds exactly; rounding can overshoot by an ulp, so keep Corollary 1 exact.
    return C, jnp.clip(alpha, -1.0, 1.0), n


def gate(C, alpha, cfg: MDLConfig):
    """C_final = C·(g_a + g_b α); C itself under the ``alpha_gating=False`` ablation."""
    if not cfg.alpha_gating:
        return C
    g_a, g_b = (jnp.asarray(x, C.dtype) for x in cfg.gate_coeffs)
    return C * (g_a + uncontracted(g_b * alpha))


def uncontracted(p):
    """``p`` unchanged (NaN stays NaN), rounded on its own: shared with the fused and native engines."""
    # The product rounded on its own, never fused with the add after it: XLA:CPU contracts a·b + c into
    # one FMA (one rounding) inside a jitted fusion but not between eager ops, so jitted and eager
    # decide_one, the kernels and the sweep put a C_final that lies on θ on different sides of it. A
    # select LLVM cannot fold is not an fmul, so nothing contracts across it (a no-op: p == p unless NaN,
    # and NaN stays NaN). The native and fused kernels round the same product alone too. (Sums that XLA
    # vectorises differently per shape still move C_final by a few ulps: docs/guides/how-decide-runs.md.)
    return jnp.where(p == p, p, jnp.nan)


def act(C_final, cfg: MDLConfig) -> jax.Array:
    """Four-level action: ≥θ0 Active, ≥θ1 Supp, ≥θ2 Silent, else Opt-Out (ties take the higher action)."""
    th = jnp.asarray(cfg.thresholds, C_final.dtype)
    return (3 - (C_final >= th[0]).astype(jnp.int32) - (C_final >= th[1]).astype(jnp.int32)
            - (C_final >= th[2]).astype(jnp.int32)).astype(jnp.int32)


def energies(v_meta, cfg: MDLConfig) -> jax.Array:
    """‖Π_k v_meta‖² for each subspace, (3,). With QR subspaces Π_k = P_k P_kᵀ, so the energy is the
    squared norm of v_meta's coordinates Qᵀ v_meta in the k-th block of the basis (one 16×16 product
    instead of three)."""
    if cfg.subspaces == "identity":
        return jnp.broadcast_to(jnp.sum(v_meta * v_meta), (3,))
    coords = jnp.dot(jnp.asarray(cfg.basis.T, v_meta.dtype), v_meta, precision=PRECISION)
    sq = coords * coords
    edges = np.cumsum((0,) + tuple(cfg.dims))
    return jnp.stack([jnp.sum(sq[a:b]) for a, b in zip(edges[:-1], edges[1:])])


def decide_one(M: jax.Array, R: jax.Array, A: jax.Array, cfg: MDLConfig) -> Decision:
    """Algorithm 1 for one record: the definition every batched path and kernel is tested against.

    Pure and unchecked, for composing with ``jax.vmap`` / ``jax.jit`` / ``jax.grad`` yourself;
    ``decide`` is the checked, batched entry point.

    Args:
      M: () float array, the relevance in [0, 1].
      R: () float array, the reliability in [0, 1].
      A: () float array, the task risk in [0, 1] (inverted to s_A = 1 − A unless
        ``cfg.risk_inversion`` is False).
      cfg: one config (not a batch); its numeric fields may be traced.

    Returns:
      A ``Decision`` of 0-d fields (``v_meta``: (D,), ``energies``: (3,)) in the signals' dtype.
        Values outside [0, 1] are not checked and give an unspecified decision.
    """
    v_meta, v_wm, g_A = fuse(M, R, A, cfg)
    C, alpha, n = read_out(v_meta, v_wm, cfg)
    C_final = gate(C, alpha, cfg)
    # A NaN or ±inf signal is Opt-Out, the safe action, whatever the config: safe_norm reads the NaN
    # v_meta such a signal gives as a norm of 0, so C_final is 0, which a θ2 of 0 would call Silent
    # (and a config whose weights keep an infinite signal's v_meta finite could call it anything).
    finite = jnp.isfinite(M) & jnp.isfinite(R) & jnp.isfinite(A)
    action = jnp.where(finite, act(C_final, cfg), jnp.int32(Action.OPT_OUT))
    return Decision(action, C, alpha, C_final, v_meta, energies(v_meta, cfg), n, g_A)


def soft_action_probs(C_final, cfg: MDLConfig, temperature=0.02) -> jax.Array:
    """Differentiable relaxation of ``act``: P(C_final ≥ θ_k) ≈ sigmoid((C_final - θ_k)/τ), giving
    probabilities (Active, Supp, Silent, Opt-Out) that sum to 1 and tend to the hard action as τ → 0.
    Non-negative because θ0 ≥ θ1 ≥ θ2 makes the sigmoids ordered."""
    th = jnp.asarray(cfg.thresholds, C_final.dtype)
    p = jax.nn.sigmoid((C_final - th) / temperature)  # (3,): P(≥θ0) ≤ P(≥θ1) ≤ P(≥θ2)
    return jnp.stack([p[0], p[1] - p[0], p[2] - p[1], 1.0 - p[2]])


def signal_cube_norm_range(cfg: MDLConfig | None = None, points: int = 41) -> tuple[float, float]:
    """Min and max of ‖v_meta‖ over a points³ grid of the signal cube [0, 1]³.

    An earlier version's default n_min / n_max (1.252-3.281 under the paper's settings); the
    defaults now come from a calibration split (see ``MDLConfig``'s n_min, n_max). Useful as a
    calibration-free range for a config whose fusion fields differ from the defaults.

    Args:
      cfg: the config whose fusion is evaluated (its n_min / n_max are not used); the paper's
        defaults when None.
      points: grid points per axis (41: a step of 0.025), so points³ records are decided.

    Returns:
      (min, max) of the raw norm ‖v_meta‖ over the grid, as Python floats.

    Raises:
      TypeError: ``cfg`` is neither an ``MDLConfig`` nor None.
      ValueError: ``points`` is not an int ≥ 2 (a grid holding both ends of each axis).
    """
    if cfg is not None and not isinstance(cfg, MDLConfig):
        raise TypeError(f"cfg: expected an MDLConfig or None, got {type(cfg).__name__}")
    if isinstance(points, bool) or not isinstance(points, (int, np.integer)) or points < 2:
        raise ValueError(f"points: expected an int ≥ 2 (grid points per axis), got {points!r}")
    cfg = cfg or MDLConfig()
    g = jnp.linspace(0.0, 1.0, points, dtype=jnp.float32)
    M, R, A = (x.ravel() for x in jnp.meshgrid(g, g, g, indexing="ij"))
    norms = jax.jit(jax.vmap(lambda m, r, a: safe_norm(fuse(m, r, a, cfg)[0])))(M, R, A)
    return float(np.min(norms)), float(np.max(norms))
