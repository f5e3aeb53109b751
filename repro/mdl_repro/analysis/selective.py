"""RQ1 with abstention made explicit: coverage, selective risk, risk-coverage curves, where a B3 − B2
difference comes from, and the baselines an abstaining system must beat.

The paper's hallucination rate counts an abstention (Opt-Out: "I don't know", no model call) as a safe
answer, so any system that abstains more looks better by that much. Every number here separates the two:

  coverage           share of (question, seed) records answered (Opt-Out = abstain)
  selective risk     hallucination among the answered records
  overall            the paper's rate: hallucinated / all records, an abstention counted safe
  risk-coverage      sort records by a confidence score (highest first), answer the top k, abstain on the
                     rest: selective risk as a function of coverage k/N (ties at equal scores are
                     averaged, so the curve does not depend on record order); AURC = the mean of that risk
                     over k = 1..N (lower is better; a flat curve's AURC is its rate)
  decomposition      B3 − B2 overall = Σ over B3's actions a of (1/N) Σ_{records with action a} (h_B3 − h_B2):
                     with paired sampling Active contributes exactly 0 (B3 Active = B2's answer) and Silent
                     is B1 − B2 on those records; Opt-Out contributes −(B2's hallucinations there)/N, the
                     part that is "abstention counted as safe"
  random abstention  abstain on as many randomly drawn QUESTIONS as B3 abstains on (all their seeds, as
                     B3's decision is per question), B2's answer elsewhere; mean and 2.5-97.5 percentiles
                     over ``n_draws`` draws (paired: the same (question, seed) records as B3)
  risk-only rule     abstain iff A ≥ τ, B2 elsewhere: uses no retrieval signal at all

Records are paired: every (dataset, question, seed) has one B1, one B2 and one B3 answer (checked; a
(question, seed) missing one of them is left out and counted).
"""

from __future__ import annotations

import numpy as np

from mdl_jax.evaluation.metrics import Curve, rates, risk_coverage  # noqa: F401  (moved to the library; re-exported)

JUDGES = {"paper": "hallucinated", "ref": "hallucinated_ref"}
ACTIONS = ("ACTIVE", "SUPP", "SILENT", "OPT_OUT")
RISK_ONLY_TAU = 0.75  # the audit's rule: A ∈ {0.75, 0.85} on TruthfulQA are its high tiers
N_DRAWS = 2000


def decompose(h_b2, h_b3, action) -> dict:
    """B3 − B2 overall rate split by B3's action: {action: contribution}, the parts summing to the
    difference. h_b2, h_b3: (N,) 0/1 (an Opt-Out answer counted 0, as judged); action: (N,) names."""
    h2, h3 = np.asarray(h_b2, np.float64), np.asarray(h_b3, np.float64)
    act = np.asarray(action)
    n = len(h2)
    out = {a: float(np.sum((h3 - h2)[act == a]) / n) for a in ACTIONS}
    out["total"] = float((h3.sum() - h2.sum()) / n)
    return out


def random_abstention(h_b2, groups, n_abstain: int, *, n_draws: int = N_DRAWS, seed: int = 0) -> dict:
    """Overall rate of 'abstain on ``n_abstain`` random groups (questions), B2's answer elsewhere'.

    h_b2: (N,) 0/1; groups: (N,) question ids (every record of a drawn question abstains). Returns mean,
    lo / hi (2.5 / 97.5 percentiles), the draws' selective-risk mean, and the analytic expectation
    Σ_g h_g (1 − n_abstain / G) / N (each question abstains with probability n_abstain / G).
    """
    h = np.asarray(h_b2, np.float64)
    _, g = np.unique(np.asarray(groups), return_inverse=True)
    G, n = int(g.max()) + 1 if len(g) else 0, len(h)
    if not 0 <= n_abstain <= G:
        raise ValueError(f"n_abstain: expected 0..{G} (the number of questions), got {n_abstain}")
    hg = np.bincount(g, weights=h, minlength=G)
    ng = np.bincount(g, minlength=G).astype(np.float64)
    rng = np.random.default_rng(seed)
    # each draw: a random subset of n_abstain questions (the first n_abstain of a permutation)
    keys = rng.random((n_draws, G))
    chosen = np.argsort(keys, axis=1)[:, :n_abstain]
    ab_h = hg[chosen].sum(1)
    ab_n = ng[chosen].sum(1)
    overall = (hg.sum() - ab_h) / n
    answered = n - ab_n
    sel = np.where(answered > 0, (hg.sum() - ab_h) / np.maximum(answered, 1), np.nan)
    return {"mean": float(overall.mean()), "lo": float(np.percentile(overall, 2.5)),
            "hi": float(np.percentile(overall, 97.5)), "selective_risk": float(np.nanmean(sel)) if np.isfinite(sel).any() else float("nan"),
            "expected": float(hg.sum() * (1 - n_abstain / G) / n) if G else float("nan"),
            "n_abstain": int(n_abstain), "n_questions": G, "n_draws": int(n_draws)}


# ---------------------------------------------------------------------------------- run level

def paired(ev, judge: str = "paper"):
    """One row per (dataset, qid, seed) with B1, B2 and B3 all answered (not failed): h_B1, h_B2,
    h_B3 (0/1 under ``judge``), action (B3's), A, M, R, C_final (B3's). Returns (frame, n_dropped)."""
    import pandas as pd

    col = JUDGES[judge]
    ok = ev[ev["ok"] & ev["system"].isin(("B1", "B2", "B3"))].copy()
    ok["hj"] = ok[col].astype(float) if col in ok else np.nan
    keys = ["dataset", "qid", "seed"]
    parts = []
    for s in ("B1", "B2", "B3"):
        sub = ok[ok["system"] == s].set_index(keys)
        cols = {"hj": f"h_{s}"}
        if s == "B3":
            cols.update({"action": "action", "C_final": "C_final"})
        if s == "B2":
            cols.update({"A": "A", "M": "M", "R": "R"})
        parts.append(sub[list(cols)].rename(columns=cols))
    full = pd.concat(parts, axis=1, join="outer")
    n_all = len(full)
    full = full.dropna(subset=["h_B1", "h_B2", "h_B3", "action"]).reset_index()
    return full, n_all - len(full)


def paired_share(ev) -> float | None:
    """Share of B3 Active records whose answer equals B2's for the same (dataset, question, seed): 1.0
    with paired sampling; well below in runs made before it (None without B3 Active records)."""
    ok = ev[ev["ok"]]
    keys = ["dataset", "qid", "seed"]
    if "answer" not in ok:
        return None
    b2 = ok[ok["system"] == "B2"].set_index(keys)["answer"]
    b3 = ok[(ok["system"] == "B3") & (ok["action"] == "ACTIVE")].set_index(keys)["answer"]
    if not len(b3):
        return None
    j = b3.to_frame("b3").join(b2.to_frame("b2"), how="inner")
    return float((j["b3"] == j["b2"]).mean()) if len(j) else None


def unpaired_note(ev) -> str | None:
    """A warning line when the run's sampling was not paired (see ``paired_share``)."""
    share = paired_share(ev)
    if share is None or share >= 0.99:
        return None
    return (f"**This run's sampling is not paired:** only {share:.0%} of B3's Active answers equal B2's answer "
            "for the same (question, seed), so a B1 / B2 record is an independent draw, not the answer B3 "
            "or a gate would have got; the decomposition's Active part is then sampling noise, and the "
            "gates' outcomes read off B1 / B2 are unbiased but unpaired.")


def dataset_summary(p, *, tau: float = RISK_ONLY_TAU, n_draws: int = N_DRAWS, seed: int = 0) -> dict:
    """Every selective-prediction number for one dataset's paired frame ``p`` (see ``paired``)."""
    from mdl_jax.signals.risk import HIGH_RISK

    h1, h2, h3 = (p[f"h_{s}"].to_numpy(np.float64) for s in ("B1", "B2", "B3"))
    act = p["action"].to_numpy()
    A = p["A"].to_numpy(np.float64)
    opt = act == "OPT_OUT"
    hi = A >= HIGH_RISK
    qid = p["qid"].to_numpy()
    out: dict = {"n": int(len(p)), "n_questions": int(len(np.unique(qid))),
                 "action_share": {a: float(np.mean(act == a)) for a in ACTIONS}}
    abst_risk = A >= tau
    sysr = {"B1": (h1, np.ones(len(p), bool)), "B2": (h2, np.ones(len(p), bool)), "B3": (h3, ~opt),
            f"risk-only (A ≥ {tau:g})": (h2, ~abst_risk)}
    for name, (h, a) in sysr.items():
        r = rates(h, a)
        r["high_risk"] = rates(h[hi], a[hi])["overall"] if hi.any() else float("nan")
        out.setdefault("systems", {})[name] = r
    # B3's abstention is per question (its (M, R, A) are the question's): draw that many questions
    q_opt = len(np.unique(qid[opt]))
    per_q = all(len(np.unique(opt[qid == q])) == 1 for q in np.unique(qid[opt])) if opt.any() else True
    ra = random_abstention(h2, qid, q_opt, n_draws=n_draws, seed=seed)
    ra["per_question"] = per_q
    # the paired test against random abstention (its expected rate per record), clustered by question:
    # the draws' range above carries the random choice only, not the sampling of the questions
    from mdl_jax.evaluation.metrics import cluster_bootstrap_diff, cluster_se, mde_for
    from mdl_repro.analysis.stats import verdict

    base = h2 * (1 - q_opt / max(ra["n_questions"], 1))
    se = cluster_se(h3 - base, qid)
    ci = cluster_bootstrap_diff(h3, base, qid)
    n_seeds = int(p["seed"].nunique()) if "seed" in p else 1
    ra["paired"] = {"diff": float(np.mean(h3 - base)) if len(h3) else float("nan"), "ci": list(ci), "se": se,
                    "mde": mde_for(se, ra["n_questions"]),
                    "verdict": verdict(float(np.mean(h3 - base)) if len(h3) else float("nan"), ci,
                                       mde_for(se, ra["n_questions"]), ra["n_questions"], n_seeds,
                                                       lower="B3 lower", higher="B3 higher")}
    out["random_abstention"] = ra
    out["decomposition"] = decompose(h2, h3, act)
    # curves: B3 ranked by C_final (Opt-Out answered as Silent, i.e. B1, beyond B3's own coverage);
    # risk-only ranked by −A over B2's answers; B1, B2 flat
    h3_full = np.where(opt, h1, h3)
    cf = p["C_final"].to_numpy(np.float64)
    out["aurc"] = {"B1": risk_coverage(h1, np.zeros(len(p))).aurc, "B2": risk_coverage(h2, np.zeros(len(p))).aurc,
                   "B3 (C_final)": risk_coverage(h3_full, cf).aurc,
                   "risk-only (−A)": risk_coverage(h2, -A).aurc}
    return out


def selective(ev, *, tau: float = RISK_ONLY_TAU, n_draws: int = N_DRAWS, seed: int = 0) -> dict:
    """The selective-prediction numbers for every dataset × judge of the evaluated records ``ev`` (``oracle.load_records``)."""
    res: dict = {"tau": tau, "n_draws": n_draws, "by": {}, "paired_share": paired_share(ev),
                 "unpaired_note": unpaired_note(ev)}
    for judge in JUDGES:
        if JUDGES[judge] not in ev or ev[JUDGES[judge]].isna().all():
            res["by"][judge] = None
            continue
        p, dropped = paired(ev, judge)
        for ds in sorted(p["dataset"].unique()):
            s = dataset_summary(p[p["dataset"] == ds], tau=tau, n_draws=n_draws, seed=seed)
            s["n_dropped_unpaired"] = int(dropped)
            for other in ("CRAG", "SelfRAG"):  # never abstain: coverage 1, a flat curve (own records)
                o = ev[(ev["dataset"] == ds) & (ev["system"] == other) & ev["ok"]]
                o = o[o[JUDGES[judge]].notna()]
                if len(o):
                    h = o[JUDGES[judge]].astype(float).to_numpy()
                    r = rates(h, np.ones(len(h), bool))
                    from mdl_jax.signals.risk import HIGH_RISK

                    hi = o["A"].to_numpy(np.float64) >= HIGH_RISK
                    r["high_risk"] = float(h[hi].mean()) if hi.any() else float("nan")
                    s["systems"][f"{other} (n = {len(o)})"] = r
                    s["aurc"][f"{other} (n = {len(o)})"] = r["overall"]
            res["by"].setdefault(judge, {})[ds] = s
    return res


def where_from(s: dict, family_note: str = "") -> str:
    """One sentence: where a dataset's B3 − B2 difference comes from (used in ANALYSIS.md / README).
    ``family_note``: the declared primary family's reading of B3 − random abstention where the family
    holds it (``rigour.family_note``), said beside a direction in place of the bare "unadjusted"."""
    d, ra = s["decomposition"], s["random_abstention"]
    b3 = s["systems"]["B3"]
    b2 = s["systems"]["B2"]
    parts = ", ".join(f"{a.replace('_', '-').title()} {d[a]:+.3f}" for a in ACTIONS)
    if ra["n_abstain"] == 0:
        return (f"B3 − B2 = {d['total']:+.3f} = {', '.join(f'{a.replace(chr(95), chr(45)).title()} {d[a]:+.3f}' for a in ACTIONS)}. "
                f"B3 never abstains here, so the whole difference is in the answers it gives (Supp's "
                f"cautious prompt and Silent's no-memory answer against B2's); selective risk B3 "
                f"{b3['selective_risk']:.3f} vs B2 {b2['selective_risk']:.3f}.")
    pr = ra.get("paired")
    counts = " (it counts both where B3 abstains and what its Supp and Silent answers change)"
    adjusted = family_note or ", unadjusted"
    if pr is not None:
        v = pr["verdict"]
        verdict = (f"paired test B3 − random {pr['diff']:+.3f} [{pr['ci'][0]:+.3f}, {pr['ci'][1]:+.3f}], MDE "
                   f"{pr['mde'] * 100:.1f} pp: " + (
                       "B3 below random abstention of the same count" + adjusted + counts if v == "B3 lower" else
                       "B3 above random abstention of the same count" + adjusted + counts if v == "B3 higher" else
                       v + ": not shown to differ from random abstention in either direction"))
    else:
        beat, worse = b3["overall"] < ra["lo"], b3["overall"] > ra["hi"]
        verdict = ("below the whole random range" if beat else "above the random range" if worse else
                   "inside the random range")
    sel = ("a difference in selective risk is not tested here"
           if b3["selective_risk"] >= b2["selective_risk"] else
           "not tested: see the judge-error section for whether the sign of the difference holds")
    share = (f"Opt-Out counted as safe accounts for {d['OPT_OUT'] / d['total'] * 100:.0f}% of it (the other "
             f"actions together {(d['total'] - d['OPT_OUT']):+.3f}). " if d["total"] < 0 and d["OPT_OUT"] < 0 else "")
    return (f"B3 − B2 = {d['total']:+.3f} = {parts}. {share}B3 {b3['overall']:.3f} vs "
            f"random abstention on the same {ra['n_abstain']} of {ra['n_questions']} questions "
            f"{ra['mean']:.3f} [{ra['lo']:.3f}–{ra['hi']:.3f}, the random choice's range] (expected {ra['expected']:.3f}); "
            f"{verdict}. Selective risk B3 "
            f"{b3['selective_risk']:.3f} vs B2 {b2['selective_risk']:.3f} ({sel}).")


def selective_md(res: dict, family: dict | None = None) -> str:
    """The selective-prediction tables (per judge and dataset) as Markdown; ``family``: the rigour
    analysis's declared primary family (``rigour.primary_family``), whose reading of B3 − random
    abstention each direction stated here carries."""
    from mdl_repro.analysis.stats import family_note

    tau = res["tau"]
    lines = [f"Paired (question, seed) records. Overall = the paper's rate (an abstention counted safe); "
             f"coverage = share answered (Opt-Out abstains); selective risk = hallucination among the "
             f"answered; AURC = area under the risk-coverage curve (lower is better; B3's curve ranks by "
             f"C_final and answers Opt-Out records as Silent (B1) beyond its own coverage; the risk-only "
             f"curve ranks B2's answers by −A; B1, B2 are flat). Random abstention: as many random "
             f"questions as B3 abstains on (all seeds), B2 elsewhere, {res['n_draws']:,} draws, mean "
             f"[2.5–97.5 percentiles]. Risk-only: abstain iff A ≥ {tau:g}, B2 elsewhere.", ""]
    if res.get("unpaired_note"):
        lines += [res["unpaired_note"], ""]
    for judge, by in res["by"].items():
        if by is None:
            lines += [f"**Judge `{judge}`:** not in these records.", ""]
            continue
        lines += [f"**Judge `{judge}`**", "",
                  "| dataset | system | coverage | selective risk | overall | high-risk | AURC |",
                  "|---|---|---|---|---|---|---|"]
        for ds, s in by.items():
            aurc = dict(s["aurc"], B3=s["aurc"]["B3 (C_final)"], **{f"risk-only (A ≥ {tau:g})": s["aurc"]["risk-only (−A)"]})
            for name, r in s["systems"].items():
                lines.append(f"| {ds} | {name} | {r['coverage']:.3f} | {r['selective_risk']:.3f} | "
                             f"{r['overall']:.3f} | {r['high_risk']:.3f} | {aurc.get(name, float('nan')):.3f} |")
            ra = s["random_abstention"]
            lines.append(f"| {ds} | random abstention ({ra['n_abstain']}/{ra['n_questions']} q) | "
                         f"{1 - ra['n_abstain'] / max(ra['n_questions'], 1):.3f} | {ra['selective_risk']:.3f} | "
                         f"{ra['mean']:.3f} [{ra['lo']:.3f}–{ra['hi']:.3f}] | – | – |")
        lines += ["", "| dataset | B3 − B2 | Active | Supp | Silent | Opt-Out | B3 action shares (A/S/Si/O) |",
                  "|---|---|---|---|---|---|---|"]
        for ds, s in by.items():
            d, sh = s["decomposition"], s["action_share"]
            lines.append(f"| {ds} | {d['total']:+.3f} | {d['ACTIVE']:+.3f} | {d['SUPP']:+.3f} | {d['SILENT']:+.3f} | "
                         f"{d['OPT_OUT']:+.3f} | {sh['ACTIVE']:.2f} / {sh['SUPP']:.2f} / {sh['SILENT']:.2f} / "
                         f"{sh['OPT_OUT']:.2f} |")
        lines += [""] + [f"- {ds} (`{judge}`): "
                         + where_from(s, family_note(family or {}, f"{ds}: B3 - random abstention", judge))
                         for ds, s in by.items()] + [""]
    return "\n".join(lines)
