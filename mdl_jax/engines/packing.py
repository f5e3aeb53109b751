"""A config as the kernel's float32 ``params`` buffer (``_native/decide_cpu.cc``: struct Params).

Its own module because the layout is a contract with the C++ source that three callers read: the
native engine's ``decide`` (one config), its sweep (a batch of configs, one row each) and the fused GPU
kernel (``engines.fused``), which takes its numbers in the same arithmetic. The numbers are computed in
float32 in the same order of operations as ``decision.weight_matrices`` / ``encode``, so every engine
sees the W, centres and basis the pure-JAX definition sees.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from mdl_jax.controller import config as _config
from mdl_jax.controller import decision as _decision
from mdl_jax.controller.config import MDLConfig

PARAMS = 1085  # floats in one packed config (decide_cpu.cc: Params)
# What the fusion reads comes first (centres, 1/(2σ²), W, bias, g_A coefficients); the read-out numbers
# (g_a, g_b, θ, n_min, n_max) and the basis Q after it. Configs whose first FUSION_END floats are equal
# share ‖v_meta‖ and α per record (the sweep's groups).
FUSION_END = 16 + 1 + 3 * 16 * 16 + 16 + 2
# Where the parts of a row start: 1/(2σ²) after the D centres, W (3 × D × D), the bias, g_A's (a, b); the
# read-out numbers g_a, g_b; θ0-θ2; n_min; n_max; then the basis Q (D × D).
INV_AT, W_AT, BIAS_AT, G_A_AT, BASIS_AT = 16, 17, 785, 801, 810
GATE_AT, THRESHOLDS_AT, N_MIN_AT, N_MAX_AT = 803, 805, 808, 809


def flags(cfg: MDLConfig) -> int:
    """The ablation switches as the kernel's bit flags (decide_cpu.cc: kValueEncoding ...)."""
    return (1 * cfg.value_encoding + 2 * cfg.risk_inversion + 4 * cfg.risk_modulation
            + 8 * cfg.alpha_gating + 16 * (cfg.subspaces == "qr"))


@_config.per_config_cache
def supports(cfg: MDLConfig) -> bool:
    """The kernel's structural limits: D = 16 and scalar-per-field numeric leaves (no batched config);
    asked once per hashable config, every call for one with array leaves."""
    return _shaped(cfg, ())


def why_unsupported(cfg: MDLConfig) -> str:
    """Why ``supports`` refuses ``cfg``, in the words of an engine's one-line error: a config with
    traced leaves is named as such, since its D is 16 as often as not and "D = 16 (this one has
    D = 16)" would say nothing."""
    if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(cfg)):
        return ("a config with traced leaves (a caller's vmap or grad over the config) runs on the pure-JAX "
                "engine only")
    return f"the kernel takes one concrete config with D = 16 (this one has D = {cfg.D})"


def sweep_supports(cfg: MDLConfig, K: int) -> bool:
    """Can the native sweep run this batch? D = 16, concrete leaves of the batched shapes."""
    return _shaped(cfg, (K,))


def _shaped(cfg: MDLConfig, batch: tuple) -> bool:
    # D = 16 and concrete numeric leaves, each of its field's shape in one config after the ``batch`` axes
    if cfg.D != 16 or any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(cfg)):
        return False
    try:
        return all(np.shape(getattr(cfg, f)) in [batch + s for s in _config.config_shapes(f, cfg.D)]
                   for f in _config.NUMERIC_FIELDS)
    except Exception:  # noqa: BLE001 - a leaf np.shape cannot read: not for the kernel
        return False


def pack_uncached(cfg: MDLConfig) -> np.ndarray:
    """``pack`` without its cache: a fresh read-only (PARAMS,) float32 array (``pack_batch``'s one row)."""
    out = pack_batch(cfg, 1)[0]
    out.setflags(write=False)
    return out


@_config.per_config_cache
def pack(cfg: MDLConfig) -> np.ndarray:
    """The config as the kernel's float32 ``params`` buffer (decide_cpu.cc: struct Params), cached per
    hashable config (one with array leaves is packed every call).

    Args:
      cfg: one concrete config that ``supports`` accepts.

    Returns:
      A read-only (PARAMS,) float32 array.
    """
    return pack_uncached(cfg)


def _params_uncached(cfg: MDLConfig) -> jax.Array:
    return jax.device_put(pack_uncached(cfg))


@_config.per_config_cache(unhashable=_params_uncached)
def params(cfg: MDLConfig) -> jax.Array:
    """``pack(cfg)`` on the device, cached per (hashable) config so a call transfers nothing."""
    with jax.ensure_compile_time_eval():   # a concrete buffer even when first asked inside a caller's jit
        return jax.device_put(pack(cfg))


def pack_batch(cfg: MDLConfig, K: int) -> np.ndarray:
    """A batch of K configs (leaves with leading axis K) as (K, PARAMS) ``params`` rows: each row the
    same float32 bits ``pack`` gives that config alone (the same element-wise float32 arithmetic)."""
    f = np.float32
    D = cfg.D
    specs = _config.field_specs()

    def col(name, *shape):  # a leaf as (K,) + its declared per-config shape, or the shape given
        return np.asarray(getattr(cfg, name), f).reshape((K,) + (shape or specs[name].shape))
    # The centres exactly as the pure-JAX path makes them: np.linspace differs from jnp.linspace by an
    # ulp at 6 of 16 centres, and a Gaussian of width σ turns a centre's error δ into a relative error
    # ~δ·|s - c|/σ² of its peak, which reached 4e-5 in C at σ = 1e-4.
    centres = np.asarray(_decision.centres(cfg, jnp.float32), f)
    sigma = col("sigma")
    pi = np.asarray(cfg.projectors, f)
    others = pi.sum(0, dtype=f)[None] - pi
    W = col("gains")[:, :, None, None] * pi[None] + col("eps_c")[:, None, None, None] * others[None]
    bias = np.broadcast_to(np.asarray(cfg.bias, f).reshape(K, -1), (K, D))
    # σ near float32's ends (1e-30, 1e30 are valid) makes 1/(2σ²) inf or 0, as on the pure-JAX path
    # (whose XLA arithmetic does not warn): no RuntimeWarning, which a warnings-as-errors caller would
    # see as a crash on valid input.
    with np.errstate(over="ignore", divide="ignore"):
        inv = f(1.0) / (f(2.0) * sigma * sigma)
    # The kernel's structured fusion (decide_cpu.cc: fuse): W_k = ε_c I + (s_k - ε_c) Π_k, with s_k - ε_c
    # per basis coordinate of subspace k, and the dims (exact small integers in float32).
    coef = np.repeat(col("gains") - col("eps_c", 1), cfg.dims, axis=1)
    parts = [np.broadcast_to(centres, (K, D)), inv[:, None], W.reshape(K, -1),
             bias, col("g_A_coeffs"), col("gate_coeffs"), col("thresholds"), col("n_min", 1),
             col("n_max", 1), np.broadcast_to(np.asarray(cfg.basis, f).ravel(), (K, D * D)), coef,
             col("eps_c", 1), np.broadcast_to(np.asarray(cfg.dims[:2], f), (K, 2))]
    out = np.concatenate([np.asarray(x, f) for x in parts], axis=1)
    assert out.shape == (K, PARAMS), out.shape
    return out
