"""Figure 6: case studies picked from the records by a fixed rule, answers verbatim.

Rule (applied to the first seed of each dataset; within a kind, candidates are ordered by risk A
descending, then C_final (descending for Active, ascending otherwise), then qid, and the first is
taken, one per dataset and kind):
  1. abstention where RAG hallucinated: B2 hallucinated, B3 withheld the memory (Silent or Opt-Out) and
     was safe                                              (the paper's Cases 1, 3-5);
  2. residual failure: B3 Active and hallucinated          (the paper's Case 2);
  3. safe adoption: B3 Active and safe, B2 safe, lowest risk first (A ascending) (the paper's Case 6);
  4. abstention that cost: B3 withheld the memory and hallucinated while B2 was safe (not in the paper:
     the failure mode of the other direction).
Where the records carry the `ref` judge's verdicts too, only questions on which both judges agree for
B1, B2 and B3 are candidates (a case that rests on one judge's disputed verdict shows nothing), and
every answer is shown with both verdicts. The question text comes from the local dataset files when
they are present (no download).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np

from mdl_repro.analysis.figures import save_figure

KINDS = (
    ("abstention where RAG hallucinated", "abstain_vs_rag"),
    ("residual failure under Active", "active_halluc"),
    ("safe adoption", "active_safe"),
    ("abstention that cost", "abstain_cost"),
)


def load_questions(datasets, data_dir=None) -> dict:
    """{(dataset, qid): item} of the datasets found locally; {} when they cannot be read (never downloads)."""
    try:
        from mdl_repro.pipeline.data import find_local, load

        out = {}
        for ds in datasets:
            if find_local(ds, data_dir) is None:
                continue  # never download for a case study
            out.update({(ds, it.qid): it for it in load(ds, data_dir)})
        return out
    except Exception:  # noqa: BLE001 - case studies degrade to qids without the data files
        return {}


def _has_ref(df) -> bool:
    return "hallucinated_ref" in df and not df["hallucinated_ref"].isna().all()


def _agree(row) -> bool:
    ref = row.get("hallucinated_ref")
    return ref is not None and not (isinstance(ref, float) and np.isnan(ref)) and bool(ref) == bool(row["h"])


def _verdicts(row) -> str:
    """'paper: hallucinated, ref: safe' (or the paper judge's verdict alone when ref is absent)."""
    def v(h):
        return "hallucinated" if h else ("safe (refusal)" if row.get("refusal") else "safe")

    ref = row.get("hallucinated_ref")
    if ref is None or (isinstance(ref, float) and np.isnan(ref)):
        return v(row["h"])
    return f"paper judge: {v(row['h'])}; ref judge: {v(bool(ref))}"


def current_risk_agrees(df, data_dir=None) -> set | None:
    """The (dataset, qid) whose recorded risk A equals what today's risk rule (``signals.risk``) gives,
    or None where the dataset files are not local (then every question is eligible). A case study of a
    question the current rule scores differently would illustrate a controller input that no longer
    exists (e.g. HaluEval "Cranium or Thurn and Taxis": recorded A = 0.85, today's rule 0.20)."""
    from mdl_jax.signals.risk import risk

    items = load_questions(set(df["dataset"]), data_dir)
    if not items:
        return None
    ok = set()
    for (ds, q), a in df.drop_duplicates(["dataset", "qid"]).set_index(["dataset", "qid"])["A"].items():
        it = items.get((ds, int(q)))
        if it is not None and abs(float(a) - risk(ds, it.question, getattr(it, "category", "") or "")) < 1e-6:
            ok.add((ds, int(q)))
    return ok


def pick(df, eligible: set | None = None) -> list[dict]:
    """The cases (see the module docstring); each a dict with the B1/B2/B3 records of one question.
    ``eligible``: the (dataset, qid) that may be picked (``current_risk_agrees``), None = all."""
    out = []
    for ds in sorted(df["dataset"].unique()):
        d = df[(df["dataset"] == ds) & df["ok"]]
        seed = sorted(d["seed"].unique())[0]
        d = d[d["seed"] == seed]
        wide = {s: d[d["system"] == s].set_index("qid") for s in ("B1", "B2", "B3")}
        if any(not len(w) for w in wide.values()):
            continue
        qids = sorted(set(wide["B1"].index) & set(wide["B2"].index) & set(wide["B3"].index))
        if _has_ref(d):
            qids = [q for q in qids if all(_agree(wide[s].loc[q]) for s in ("B1", "B2", "B3"))]
        if eligible is not None:
            qids = [q for q in qids if (ds, int(q)) in eligible]
        b3 = wide["B3"].loc[qids]
        b2 = wide["B2"].loc[qids]
        withheld = b3["action_name"].isin(["SILENT", "OPT_OUT"])
        active = b3["action_name"] == "ACTIVE"
        masks = {
            "abstain_vs_rag": (b2["h"] == 1) & withheld & (b3["h"] == 0),
            "active_halluc": active & (b3["h"] == 1),
            "active_safe": active & (b3["h"] == 0) & (b2["h"] == 0),
            "abstain_cost": withheld & (b3["h"] == 1) & (b2["h"] == 0),
        }
        for title, kind in KINDS:
            c = b3[masks[kind].to_numpy()].reset_index()
            if not len(c):
                continue
            asc_a = kind == "active_safe"
            asc_cf = kind not in ("active_halluc", "active_safe")
            c = c.sort_values(["A", "C_final", "qid"], ascending=[asc_a, asc_cf, True])
            q = int(c.iloc[0]["qid"])
            out.append({"title": title, "kind": kind, "dataset": ds, "seed": int(seed), "qid": q,
                        "rows": {s: wide[s].loc[q] for s in ("B1", "B2", "B3")},
                        "n_candidates": int(len(c))})
    return out


def _verbatim(text) -> str:
    text = "" if text is None or (isinstance(text, float) and np.isnan(text)) else str(text)
    return "\n".join("> " + ln for ln in (text.splitlines() or [""]))


def attach_questions(cases: list[dict], data_dir=None) -> list[dict]:
    """Add each case's dataset ``item`` (question and reference answers) where the files are local."""
    items = load_questions({c["dataset"] for c in cases}, data_dir) if cases else {}
    for c in cases:
        c["item"] = items.get((c["dataset"], c["qid"]))
    return cases


def cases_md(cases: list[dict]) -> str:
    if not cases:
        return "No case matched the rule."
    parts = []
    for i, c in enumerate(cases, 1):
        b3 = c["rows"]["B3"]
        it = c.get("item")
        parts.append(f"**Case {i}: {c['title']}** ({c['dataset']}, qid {c['qid']}, seed {c['seed']}, "
                     f"category {b3.get('category') or '–'}; {c['n_candidates']} candidates for this kind)")
        if it is not None:
            parts.append(f"Question: {it.question}  \nReference correct: {it.correct[0] if it.correct else '–'}  \n"
                         f"Reference incorrect: {it.incorrect[0] if it.incorrect else '–'}")
        parts.append(f"Signals: M = {b3['M']:.3f}, R = {b3['R']:.3f}, A = {b3['A']:.2f} → "
                     f"C = {b3['C']:.3f}, α = {b3['alpha']:.3f}, C_final = {b3['C_final']:.3f}, "
                     f"action **{b3['action_name']}**")
        for s in ("B1", "B2", "B3"):
            r = c["rows"][s]
            parts.append(f"{s} ({_verdicts(r)}):\n{_verbatim(r.get('answer'))}")
        parts.append("")
    return "\n\n".join(parts)


def figure6(cases: list[dict], path: Path) -> Path:
    """The cases as a text figure (the Markdown is the verbatim record; this is its picture)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = []
    for i, c in enumerate(cases, 1):
        b3 = c["rows"]["B3"]
        lines.append(f"Case {i}: {c['title']} - {c['dataset']} qid {c['qid']} (A={b3['A']:.2f}, "
                     f"M={b3['M']:.2f}, R={b3['R']:.2f}, C_final={b3['C_final']:.3f}, {b3['action_name']})")
        if c.get("item") is not None:
            lines += ["    " + w for w in textwrap.wrap(f"Q: {c['item'].question}", 130)[:2]]
        for s in ("B1", "B2", "B3"):
            r = c["rows"][s]
            tag = "HALLUCINATED" if r["h"] else "safe"
            ref = r.get("hallucinated_ref")
            if ref is not None and not (isinstance(ref, float) and np.isnan(ref)):
                tag = f"paper {tag} / ref {'HALLUCINATED' if ref else 'safe'}"
            ans = " ".join(str(r.get("answer") or "").split())
            wrapped = textwrap.wrap(f"{s} [{tag}]: {ans}", 130)[:3] or [f"{s} [{tag}]:"]
            lines += ["    " + w for w in wrapped]
        lines.append("")
    lines = lines or ["No case matched the rule."]
    fig = plt.figure(figsize=(13, 0.15 * len(lines) + 0.3))
    fig.text(0.01, 0.99, "\n".join(lines), va="top", ha="left", family="monospace", fontsize=7)
    try:
        save_figure(fig, path, dpi=110)
    finally:
        plt.close(fig)
    return path
