"""RQ3 sensitivity sweeps through the sweep engine (``mdl_jax.sweep``): Figure 5(b), σ, thresholds.

Every grid is scored by ``sweep`` over all pooled records at once. Records are decided with the
calibrated config of their own dataset, so a grid is built on each dataset's config (only the swept
fields change) and swept over that dataset's records; the pooled accuracy of a config is the
weight-averaged accuracy over datasets (exact: accuracy × total weight, summed, divided by the total).
Bootstrap resamples (10, seed 0) resample *questions* (``stats.question_bootstrap_weights``: every record
of a drawn question gets its multiplicity, since a question's records share its signals), drawn once
over the pooled records and split by dataset, so every config is scored on the same resamples.

Degenerate optima: the best cell of a grid is flagged (``degenerate`` below) when its controller takes
one action on ≥ 99% of the records, or adopts on ≤ 5% (≈ always-reject) or ≥ 95%: a sweep whose best point is a
constant rule says that no setting of the swept fields beats ignoring the signals.

  gate grid   (g_a, g_b) ∈ [0, 1]² in steps of 0.05 (21 × 21), C_final = C·(g_a + g_b α)  (Fig. 5(b))
  σ sweep     σ ∈ {0.05, 0.0625, ..., 0.5} (37 values), n_min/n_max and θ kept at the run's values
  θ grid      θ0 ∈ [0, 1] in steps of 0.025 × offset ∈ {0.05, 0.1, 0.15, 0.2, 0.25}, θ1 = θ0 − offset,
              θ2 = θ0 − 2·offset (clipped at 0), the calibration rule of Section 3.4
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mdl_jax.controller.decision import Action
from mdl_repro.analysis.oracle import ACTION_LABELS
from mdl_repro.analysis.oracle import degenerate as _strict_degenerate
from mdl_repro.pipeline import ENGINE

NEAR_DEGENERATE = 0.05  # the rule: an adopt (Active) share ≤ 5% or ≥ 95% is a constant controller in all but name


def degenerate(action) -> str | None:
    """``oracle.degenerate`` (≥ 99% one action, ≤ 1% Active), and near-degenerate: Active on ≤ 5% (≈
    always-reject) or ≥ 95% (≈ always-adopt) of the records, with the action shares (e.g. σ = 0.05's
    2% Active / 47% Opt-Out). ``action``: (N,) codes or a (4,) vector of counts / shares."""
    strict = _strict_degenerate(action)
    if strict:
        return strict
    a = np.asarray(action)
    share = (a / a.sum()) if a.shape == (4,) and a.dtype.kind == "f" else \
        np.bincount(a.astype(int).ravel(), minlength=4) / max(a.size, 1)
    if share.sum() == 0:
        return None
    share = share / share.sum()
    if share[0] <= NEAR_DEGENERATE or share[0] >= 1 - NEAR_DEGENERATE:
        kind = "always-reject" if share[0] <= NEAR_DEGENERATE else "always-adopt"
        return ("near-degenerate: " + " / ".join(f"{v:.0%} {n}" for n, v in zip(ACTION_LABELS, share) if v > 0)
                + f", ≈ {kind}")
    return None


N_BOOT = 10
GATE_AXIS = np.round(np.linspace(0.0, 1.0, 21), 4)
SIGMAS = np.round(np.linspace(0.05, 0.5, 37), 5)
THETA0 = np.round(np.linspace(0.0, 1.0, 41), 4)
OFFSETS = (0.05, 0.1, 0.15, 0.2, 0.25)


def engine_available() -> bool:
    try:
        from mdl_jax import bootstrap_weights, config_grid, sweep  # noqa: F401
    except ImportError:
        return False
    return True


def _pooled_sweep(df, y, configs, make_batch, n_boot: int = N_BOOT, seed: int = 0) -> dict:
    """Sweep ``make_batch(cfg)`` (a batch of K configs built on one dataset's config) over every
    dataset; returns pooled accuracy (K, W), counts (K, W, 4) and the unweighted accuracy (K,)."""
    from mdl_jax import sweep
    from mdl_jax.evaluation.metrics import question_bootstrap_weights
    from mdl_repro.analysis.stats import question_ids

    N = len(df)
    Wt = question_bootstrap_weights(question_ids(df), n_boot, seed=seed)
    ds = df["dataset"].to_numpy()
    acc_sum = cnt = acc1_sum = cnt_point = None
    tot = np.zeros(n_boot)
    for d in np.unique(ds):
        idx = np.flatnonzero(ds == d)
        M, R, A = (df[k].to_numpy(np.float32)[idx] for k in ("M", "R", "A"))
        batch = make_batch(configs[d])
        w = Wt[:, idx].copy()
        empty = w.sum(1) <= 0  # a resample that drew no record of this dataset contributes nothing
        w[empty] = 1.0
        res = sweep(M, R, A, batch, adopt=y[idx], weights=w, engine=ENGINE)
        one = sweep(M, R, A, batch, adopt=y[idx], engine=ENGINE)
        total = np.where(empty, 0.0, np.asarray(res.total, np.float64))
        a = np.asarray(res.accuracy, np.float64) * total[None, :]
        c = np.asarray(res.counts, np.float64) * (~empty)[None, :, None]
        a1 = np.asarray(one.accuracy, np.float64) * len(idx)
        acc_sum = a if acc_sum is None else acc_sum + a
        cnt = c if cnt is None else cnt + c
        acc1_sum = a1 if acc1_sum is None else acc1_sum + a1
        c1 = np.asarray(one.counts, np.float64)
        cnt_point = c1 if cnt_point is None else cnt_point + c1
        tot += total
    assert acc_sum is not None and acc1_sum is not None, "no dataset to sweep"
    return {"accuracy": acc_sum / tot[None, :], "counts": cnt, "accuracy_point": acc1_sum / N,
            "counts_point": cnt_point}


def gate_grid(df, y, configs) -> dict:
    from mdl_jax import config_grid

    r = _pooled_sweep(df, y, configs, lambda c: config_grid(c, g_a=GATE_AXIS, g_b=GATE_AXIS))
    n = len(GATE_AXIS)
    acc = r["accuracy"].reshape(n, n, -1)
    mean, std = acc.mean(-1), acc.std(-1, ddof=1)
    i, j = np.unravel_index(np.argmax(mean), mean.shape)
    d_i, d_j = int(np.argmin(np.abs(GATE_AXIS - 0.3))), int(np.argmin(np.abs(GATE_AXIS - 0.7)))
    cp = r["counts_point"].reshape(n, n, 4)
    return {"axis": GATE_AXIS, "mean": mean, "std": std, "point": r["accuracy_point"].reshape(n, n),
            "best": (float(GATE_AXIS[i]), float(GATE_AXIS[j]), float(mean[i, j]), float(std[i, j])),
            "best_degenerate": degenerate(cp[i, j]), "default_degenerate": degenerate(cp[d_i, d_j]),
            "degenerate_cells": float(np.mean([degenerate(c) is not None for c in cp.reshape(-1, 4)])),
            "default": (0.3, 0.7, float(mean[d_i, d_j]), float(std[d_i, d_j])),
            # the paper's reading of Fig. 5(b): g_a ≤ 0.2 and g_b ≥ 0.7
            "paper_region_max": float(mean[np.ix_(GATE_AXIS <= 0.2 + 1e-9, GATE_AXIS >= 0.7 - 1e-9)].max())}


def sigma_sweep(df, y, configs) -> dict:
    from mdl_jax import config_grid

    r = _pooled_sweep(df, y, configs, lambda c: config_grid(c, sigma=SIGMAS))
    share = r["counts"] / r["counts"].sum(-1, keepdims=True)
    mean = r["accuracy"].mean(-1)
    return {"sigma": SIGMAS, "mean": mean, "std": r["accuracy"].std(-1, ddof=1),
            "share": share.mean(1), "point": r["accuracy_point"],
            "best_degenerate": degenerate(r["counts_point"][int(np.argmax(mean))]),
            "degenerate": [degenerate(c) for c in r["counts_point"]]}


def threshold_grid(df, y, configs) -> dict:
    from mdl_jax import config_grid

    th = [(t, max(t - o, 0.0), max(t - 2 * o, 0.0)) for t in THETA0 for o in OFFSETS]
    r = _pooled_sweep(df, y, configs, lambda c: config_grid(c, thresholds=th))
    share = (r["counts"] / r["counts"].sum(-1, keepdims=True)).mean(1).reshape(len(THETA0), len(OFFSETS), 4)
    acc = r["accuracy"].reshape(len(THETA0), len(OFFSETS), -1)
    mean = acc.mean(-1)
    cp = r["counts_point"].reshape(len(THETA0), len(OFFSETS), 4)
    bi = np.unravel_index(np.argmax(mean), mean.shape)
    return {"theta0": THETA0, "offsets": np.array(OFFSETS), "mean": mean, "std": acc.std(-1, ddof=1),
            "best_degenerate": degenerate(cp[bi]),
            "degenerate_theta0": [degenerate(cp[t, 0]) is not None for t in range(len(THETA0))],
            "point": r["accuracy_point"].reshape(len(THETA0), len(OFFSETS)),
            "abstain": share[..., Action.SILENT] + share[..., Action.OPT_OUT], "share": share}


def _flag(x) -> str:
    return f" **({x})**" if x else ""


def sensitivity_md(gate: dict, sig: dict, th: dict) -> str:
    b, d = gate["best"], gate["default"]
    i = int(np.argmax(sig["mean"]))
    j = np.unravel_index(np.argmax(th["mean"]), th["mean"].shape)
    degen = [(nm, x) for nm, x in (("(g_a, g_b) grid", gate.get("best_degenerate")),
                                   ("σ sweep", sig.get("best_degenerate")),
                                   ("θ grid", th.get("best_degenerate"))) if x]
    note = ([f"**Degenerate optima:** the best point of the {', '.join(nm for nm, _ in degen)} is a constant "
             "controller (" + "; ".join(x.removeprefix("degenerate: ") for _, x in degen) + "): no setting "
             "of the swept fields beats the majority rule there, so these optima are not tuning advice. "
             f"{gate.get('degenerate_cells', 0):.0%} of the (g_a, g_b) cells are degenerate."] if degen else [])
    return "\n".join([
        "| Sweep | Best (mean ± std over 10 question-bootstrap resamples) | At the run's setting | Paper |",
        "|---|---|---|---|",
        f"| (g_a, g_b) grid, 21 × 21 | {b[2]:.1%} ± {b[3]:.1%} at ({b[0]:.2f}, {b[1]:.2f})"
        f"{_flag(gate.get('best_degenerate'))}; "
        f"max over g_a ≤ 0.2, g_b ≥ 0.7: {gate['paper_region_max']:.1%} | {d[2]:.1%} ± {d[3]:.1%} at (0.3, 0.7) | "
        "up to 64.4% for g_a ≤ 0.2, g_b ≥ 0.7; ridge at g_a + g_b ≈ 0.9 |",
        f"| σ sweep, {len(sig['sigma'])} values | {sig['mean'][i]:.1%} ± {sig['std'][i]:.1%} at σ = "
        f"{sig['sigma'][i]:.3f}{_flag(sig.get('best_degenerate'))} | "
        f"{sig['mean'][int(np.argmin(np.abs(sig['sigma'] - 0.2)))]:.1%} at σ = 0.20 | "
        "σ = 0.20 on a plateau |",
        f"| θ0 × offset grid | {th['mean'][j]:.1%} ± {th['std'][j]:.1%} at θ0 = {th['theta0'][j[0]]:.3f}"
        f"{_flag(th.get('best_degenerate'))} (accuracy depends on θ0 only) | per-dataset θ0 of run.json | – |",
        *([""] + note if note else []),
    ])


# ------------------------------------------------------------------------------ the QR basis

QR_SEEDS = tuple(range(20))


def _qr_program(pi, M, R, A, ds, Mc, Rc, Ac, dsc, lab, cfg, n_ds: int, grid):
    """One QR basis (``pi``: (3, D, D) projectors) → per-dataset calibration (n_min, n_max, θ0 under
    both tie-breaks) on the calibration records and the actions of the evaluated records.

    The fusion is ``decision.fuse`` with the weight matrices built from ``pi`` instead of the config's
    static QR seed, so the bases are one vmapped axis of one program."""
    import jax
    import jax.numpy as jnp

    from mdl_jax.controller import decision as dec

    gains = jnp.asarray(cfg.gains, jnp.float32)
    W = gains[:, None, None] * pi + jnp.asarray(cfg.eps_c, jnp.float32) * (pi.sum(0)[None] - pi)

    def norm_alpha(m, r, a):
        s_a = 1.0 - a if cfg.risk_inversion else a
        v_wm, v_r, v_a = dec.encode(m, cfg), dec.encode(r, cfg), dec.encode(s_a, cfg)
        V = jnp.stack([dec.risk_gain(v_a, cfg) * v_wm, v_r, v_a])
        v = jnp.tanh(jnp.einsum("kij,kj->i", W, V, precision=jax.lax.Precision.HIGHEST)
                     + jnp.asarray(cfg.bias, jnp.float32))
        _, alpha, n = dec.read_out(v, v_wm, cfg)  # n_min/n_max of cfg are unused: C is rebuilt below
        return n, alpha

    both = jax.vmap(norm_alpha)
    n_c, al_c = both(Mc, Rc, Ac)
    n_e, al_e = both(M, R, A)
    onehot_c = dsc[None, :] == jnp.arange(n_ds)[:, None]                      # (D, Nc)
    n_min = jnp.min(jnp.where(onehot_c, n_c[None], jnp.inf), axis=1)
    n_max = jnp.max(jnp.where(onehot_c, n_c[None], -jnp.inf), axis=1)

    def c_final(n, al, d):
        C = jnp.clip((n - n_min[d]) / (n_max[d] - n_min[d]), 0.0, 1.0)
        return dec.gate(C, al, cfg)

    cf_c = c_final(n_c, al_c, dsc)
    agree = ((cf_c[None, :] >= grid[:, None]) == lab[None, :].astype(bool)).astype(jnp.float32)  # (G, Nc)
    agree = (onehot_c.astype(jnp.float32) @ agree.T) / onehot_c.sum(1, keepdims=True)           # (D, G)
    best = agree.max(1, keepdims=True)
    tied = agree == best
    low = jnp.argmax(tied, axis=1)
    idx = jnp.arange(grid.shape[0])
    last_gap = jax.lax.cummax(jnp.where(tied, -1, idx[None, :]), axis=1)
    run = jnp.where(tied, idx[None, :] - last_gap, 0)                                          # run length
    end = jnp.argmax(run, axis=1)
    length = run[jnp.arange(n_ds), end]
    mid = end - length + 1 + (length - 1) // 2
    cf_e = c_final(n_e, al_e, ds)
    out = {}
    for nm, pick in (("lowest", low), ("middle", mid)):
        t0 = grid[pick]
        th = jnp.stack([t0, jnp.maximum(t0 - 0.2, 0.0), jnp.maximum(t0 - 0.4, 0.0)], axis=1)[ds]  # (N, 3)
        out[nm] = (3 - (cf_e >= th[:, 0]).astype(jnp.int32) - (cf_e >= th[:, 1]).astype(jnp.int32)
                   - (cf_e >= th[:, 2]).astype(jnp.int32), t0)
    return out, best[:, 0], n_min, n_max


def qr_bases(df, labels: dict, cal, configs, seeds=QR_SEEDS, default: int = 42) -> dict:
    """The headline metrics over QR bases, each recalibrated on the run's calibration split exactly as the
    run calibrated (Section 3.4), computed in ONE jitted program vmapped over the bases (``qr_seed`` is a
    static config field, so the (3, D, D) projectors of every seed are built first and passed as data).

    Args:
      df: pooled records; labels: {judge: (N,) oracle labels}; cal: calibration records; configs: the
        run's per-dataset configs (their non-calibrated fields are used; they must agree across datasets).
      seeds: QR seeds of the study; ``default`` (the config's 42) is added and reported beside them.
    Returns per tie-break ("lowest": the rule the committed runs used; "middle": ``calibrate``'s current
    default) and seed: adopt share, accuracy per judge, θ0 per dataset, degenerate flag; and summaries.
    """
    import jax
    import jax.numpy as jnp

    from mdl_jax.controller.config import projector_stack
    from mdl_repro.analysis.oracle import calibration_split

    base = configs[sorted(configs)[0]]
    datasets = sorted(configs)
    maybe = [calibration_split(cal, d) for d in datasets] if cal is not None and len(cal) else []
    splits = [s for s in maybe if s is not None and len(s[0]) >= 2]
    if len(splits) != len(datasets):
        return {"skipped": "the QR-basis study recalibrates on the calibration split; this run has none"}
    all_seeds = sorted(set(seeds) | {default})
    pis = jnp.asarray(np.stack([projector_stack(base.D, base.dims, s, base.subspaces) for s in all_seeds]),
                      jnp.float32)
    ds = np.searchsorted(datasets, df["dataset"].to_numpy())
    sig = [jnp.asarray(df[k].to_numpy(np.float32)) for k in ("M", "R", "A")]
    csig = [jnp.asarray(np.concatenate([s[i] for s in splits])) for i in range(3)]
    dsc = jnp.asarray(np.concatenate([np.full(len(s[0]), i) for i, s in enumerate(splits)]))
    lab = jnp.asarray(np.concatenate([s[3] for s in splits]))
    grid = jnp.asarray(np.linspace(0.0, 1.0, 1001), jnp.float32)
    prog = jax.jit(jax.vmap(_qr_program, in_axes=(0,) + (None,) * 12), static_argnums=(11,))
    out, best, n_min, n_max = prog(pis, *sig, jnp.asarray(ds), *csig, dsc, lab, base, len(datasets), grid)
    from mdl_repro.analysis.oracle import degenerate

    res = {"seeds": all_seeds, "default": default, "datasets": datasets, "judges": list(labels)}
    for tb in ("lowest", "middle"):
        act, t0 = (np.asarray(x) for x in out[tb])
        per = []
        for i, s in enumerate(all_seeds):
            row: dict[str, Any] = {"seed": s, "adopt": float(np.mean(act[i] == 0)),
                                   "opt_out": float(np.mean(act[i] == 3)),
                   "theta0": {d: float(t0[i, j]) for j, d in enumerate(datasets)},
                   "degenerate": {d: degenerate(act[i][ds == j]) for j, d in enumerate(datasets)}}
            for j, y in labels.items():
                row[f"accuracy_{j}"] = float(np.mean((act[i] == 0) == np.asarray(y)))
            per.append(row)
        study = [r for r in per if r["seed"] in set(seeds)]
        summ: dict = {}
        for k in ["adopt", "opt_out"] + [f"accuracy_{j}" for j in labels]:
            v = np.array([r[k] for r in study])
            summ[k] = {"median": float(np.median(v)), "min": float(v.min()), "max": float(v.max()),
                       "default": next(r[k] for r in per if r["seed"] == default)}
        summ["n_degenerate"] = int(sum(any(r["degenerate"].values()) for r in study))
        res[tb] = {"per_seed": per, "summary": summ}
    res["n_bases"] = len(list(seeds))
    return res


def qr_bases_md(qr: dict) -> str:
    if "skipped" in qr:
        return f"*Not run: {qr['skipped']}.*"
    judges = qr["judges"]
    lines = [f"Every basis recalibrated (n_min, n_max, θ) on the run's calibration split; {qr['n_bases']} bases "
             f"(qr_seed {min(qr['seeds'])}–{max(s for s in qr['seeds'] if s != qr['default'])}) beside the "
             f"default qr_seed {qr['default']}, all in one jitted program vmapped over the bases.", "",
             "| tie-break | quantity | median over bases | range | default (seed "
             f"{qr['default']}) |", "|---|---|---|---|---|"]
    names = {"adopt": "adopt share (Active)", "opt_out": "Opt-Out share",
             **{f"accuracy_{j}": f"decision accuracy, {j} judge's oracle" for j in judges}}
    for tb, lab in (("lowest", "lowest tied θ0 (the committed run's rule)"),
                    ("middle", "middle of the widest tied run (current `calibrate`)")):
        s = qr[tb]["summary"]
        for k, nm in names.items():
            v = s[k]
            lines.append(f"| {lab} | {nm} | {v['median']:.3f} | {v['min']:.3f}–{v['max']:.3f} | {v['default']:.3f} |")
        lines.append(f"| {lab} | bases giving a degenerate controller on some dataset | "
                     f"{s['n_degenerate']} of {qr['n_bases']} | | |")
    return "\n".join(lines)
