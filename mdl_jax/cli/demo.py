"""``mdl-jax demo``: the controller's decisions for named (M, R, A) cases, one of each action."""

from __future__ import annotations

import sys

DEMO_TRIPLES = [
    # (label, M, R, A): named cases that reach all four actions under the deployed defaults
    ("relevant, consistent, low risk", 0.85, 0.80, 0.20),
    ("relevant, consistent, medium risk", 0.85, 0.80, 0.50),
    ("relevant, conflicting, medium risk", 0.80, 0.15, 0.50),
    ("weakly relevant, medium risk", 0.30, 0.50, 0.50),
    ("relevant, weakly reliable, high risk", 0.80, 0.30, 0.85),
    ("relevant, conflicting, high risk", 0.85, 0.15, 0.85),
    ("irrelevant, conflicting, high risk", 0.10, 0.10, 0.85),
]


def demo(out=sys.stdout) -> None:
    import numpy as np

    from mdl_jax import Action, MDLConfig, decide

    cfg = MDLConfig()
    M, R, A = (np.array([t[i] for t in DEMO_TRIPLES], np.float32) for i in (1, 2, 3))
    d = decide(M, R, A, cfg, engine="auto")
    head = (f"{'case':36s} {'M':>5s} {'R':>5s} {'A':>5s}  {'action':8s} {'C':>6s} {'alpha':>6s} "
            f"{'C_final':>7s}  {'E_wm':>5s} {'E_r':>5s} {'E_a':>5s}")
    print("MDL controller, default config (the paper's Table 2; n_min, n_max calibrated as Section 3.4): θ = "
          f"{tuple(cfg.thresholds)}, n = [{cfg.n_min:.3f}, {cfg.n_max:.3f}]", file=out)
    print("E_k = share of ‖v_meta‖² in subspace k (Lemma 1 attribution)\n", file=out)
    print(head, file=out)
    print("-" * len(head), file=out)
    e = np.asarray(d.energies)
    share = e / e.sum(-1, keepdims=True)
    for i, (label, m, r, a) in enumerate(DEMO_TRIPLES):
        print(f"{label:36s} {m:5.2f} {r:5.2f} {a:5.2f}  {Action(int(d.action[i])).label:8s} "
              f"{float(d.C[i]):6.3f} {float(d.alpha[i]):6.3f} {float(d.C_final[i]):7.3f}  "
              f"{share[i, 0]:5.2f} {share[i, 1]:5.2f} {share[i, 2]:5.2f}", file=out)
