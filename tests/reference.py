"""Two references the parity tests compare with.

``NumpyMDL``: a paper-style NumPy implementation, one decision at a time, the independent reference for
the JAX controller and the baseline the controller benchmark compares against; written straight from
Section 3 / Algorithm 1, in float64, sharing nothing with mdl_jax but the QR basis.

``decide_definition``: the library's own pure-JAX definition as one jitted program, without
``decide``'s checks, packing or engines: what the engines (native, pallas) must agree with."""

from __future__ import annotations

import jax
import numpy as np

from mdl_jax.controller import api
from mdl_jax.controller.config import MDLConfig
from mdl_jax.signals.conflict import pair_flags_recent

# The pure-JAX definition as one jitted function of (signals, config pytree), without decide's checks,
# packing or engines: what the engines' parity tests compare with.
decide_definition = jax.jit(api._decide_shaped)


class NumpyMDL:
    def __init__(self, cfg: MDLConfig | None = None):
        cfg = cfg or MDLConfig()
        self.cfg = cfg
        D = cfg.D
        self.c = np.linspace(0.0, 1.0, D)
        if cfg.subspaces == "identity":
            pis = [np.eye(D)] * 3
        else:
            rand = np.random.default_rng(cfg.qr_seed).standard_normal((D, D))
            Q, Rm = np.linalg.qr(rand)
            Q = Q * np.sign(np.diag(Rm))
            e = np.cumsum((0,) + tuple(cfg.dims))
            pis = [Q[:, e[k]:e[k + 1]] @ Q[:, e[k]:e[k + 1]].T for k in range(3)]
        self.pis = pis
        self.W = [cfg.gains[k] * pis[k] + cfg.eps_c * sum(pis[j] for j in range(3) if j != k)
                  for k in range(3)]

    def encode(self, s):
        if not self.cfg.value_encoding:
            return s * np.ones(self.cfg.D)
        return s * np.ones(self.cfg.D) + np.exp(-(s - self.c) ** 2 / (2 * self.cfg.sigma ** 2))

    def decide(self, M, R, A):
        cfg = self.cfg
        s_a = 1.0 - A if cfg.risk_inversion else A
        v_wm, v_r, v_a = self.encode(M), self.encode(R), self.encode(s_a)
        g_A = cfg.g_A_coeffs[0] + cfg.g_A_coeffs[1] * v_a.mean() if cfg.risk_modulation else 1.0
        v_meta = np.tanh(g_A * self.W[0] @ v_wm + self.W[1] @ v_r + self.W[2] @ v_a + cfg.bias)
        norm = np.linalg.norm(v_meta)
        C = min(max((norm - cfg.n_min) / (cfg.n_max - cfg.n_min), 0.0), 1.0)
        den = np.linalg.norm(v_wm) * norm
        alpha = float(v_wm @ v_meta / den) if den > 0 else 0.0
        C_final = C * (cfg.gate_coeffs[0] + cfg.gate_coeffs[1] * alpha) if cfg.alpha_gating else C
        th = cfg.thresholds
        action = 0 if C_final >= th[0] else 1 if C_final >= th[1] else 2 if C_final >= th[2] else 3
        energies = [float(v_meta @ p @ v_meta) for p in self.pis]
        return dict(action=action, C=C, alpha=alpha, C_final=C_final, v_meta=v_meta, norm=norm,
                    energies=energies, g_A=g_A)


def numpy_store_signals(q, mem, flags, threshold=0.3):
    """Paper-style signal aggregation for ONE store, per pair in Python/NumPy.

    q: (d,) query embedding; mem: (S, d) memory embeddings (no padding); flags: S×S conflict flags.
    Returns (M, R, phi, n_relevant)."""
    cos = [float(np.dot(q, m)) for m in mem]
    M = min(max(max(cos), 0.0), 1.0) if cos else 0.0
    rel = [i for i, c in enumerate(cos) if c > threshold]
    if len(rel) < 2:
        return M, 0.5, 0.0, len(rel)
    sims, n_conf = [], 0
    for a in range(len(rel)):
        for b in range(a + 1, len(rel)):
            i, j = rel[a], rel[b]
            sims.append(float(np.dot(mem[i], mem[j])))
            n_conf += bool(flags[i][j])
    phi = n_conf / len(sims)
    R = min(max(float(np.mean(sims)) * (1 - phi) ** 2, 0.0), 1.0)
    return M, R, phi, len(rel)


def relevant_flags(texts, r):
    """The lexical flags of the memories ``r`` of ``texts`` (indices), as ``aggregate_small``'s callable
    ``flags`` takes them: the reference the small-store path's flags are checked against."""
    return pair_flags_recent([texts[i] for i in r])
