"""Records whose C_final lies exactly on θ0 = θ1 = θ2, for the tests that every path takes the higher
action there (Section 3.3: a tie takes the higher action)."""

import jax.numpy as jnp
import numpy as np

from mdl_jax import MDLConfig
from mdl_jax.controller import decision as _d

# Records whose C and α every path computes exactly: no value encoding (v = s·1, no exp), fusion gains
# so large that every |z_i| > 20 and tanh saturates to ±1 (‖v_meta‖ = 4, C = (4 - 0)/(4 - 0) = 1),
# M = 0.5 (‖v_wm‖ = 2), so α = Σ sign(z_i)/16 exactly. The only rounding left is the gate's
# g_a + g_b·α, which a compiler may contract into one FMA (one rounding instead of two) in some
# paths and not others: XLA:CPU does inside a jitted fusion, never between eager ops, and g++ did in
# the native kernel. θ0 = θ1 = θ2 = that C_final with two roundings (what eager decide_one and NumPy
# compute), so every path must say Active (ties take the higher action).
TIE_BIAS = tuple(float(x) for x in -np.linspace(5, 455, 16))
TIE_BASE = MDLConfig(value_encoding=False, eps_c=0.0, gains=(300.0, 300.0, 300.0), n_min=0.0, n_max=4.0,
                      bias=TIE_BIAS)


def tie_records(n=12, seed=0):
    W = np.asarray(_d.weight_matrices(TIE_BASE, jnp.float32), np.float64)
    recs = []
    for R in np.linspace(0.0, 1.0, 41, dtype=np.float32):
        for A in np.linspace(0.0, 1.0, 41, dtype=np.float32):
            sa = 1.0 - float(A)
            z = (0.5 + 0.5 * sa) * W[0].sum(1) * 0.5 + W[1].sum(1) * float(R) + W[2].sum(1) * sa + TIE_BIAS
            # α = Σ sign/16 whose numerator is not a power of two (3/4, 5/8, 3/8: g_b·α is inexact)
            if np.min(np.abs(z)) > 20 and abs(int(np.sign(z).sum())) // 2 not in (0, 1, 2, 4, 8):
                recs.append((np.float32(0.5), R, A, np.float32(np.sign(z).sum() / 16)))
    rng = np.random.default_rng(seed)
    pick = [recs[i] for i in rng.choice(len(recs), n, replace=False)]
    cfgs, x = [], []
    for m, r, a, alpha in pick:
        for _ in range(10_000):   # gates where one FMA rounds below the two roundings: a contracting path says Supp
            g_a, g_b = np.float32(rng.uniform(0.8, 1.0)), np.float32(rng.uniform(0.3, 1.0))   # C_final > 0
            c_final = np.float32(g_a + np.float32(g_b * alpha))   # two roundings (NumPy never contracts)
            fma = np.float32(np.float64(g_b) * np.float64(alpha) + np.float64(g_a))   # (exact product)
            if fma < c_final:
                break
        else:
            raise AssertionError(f"no gate found for α = {alpha}")
        th = float(c_final)
        cfgs.append(TIE_BASE.replace(gate_coeffs=(float(g_a), float(g_b)), thresholds=(th, th, th)))
        x.append((m, r, a))
    return np.array(x, np.float32).T, cfgs
