"""Metrics, tables and figures of the end-to-end run (paper Tables 4-5, Figure 3) and REPORT.md.

Definitions:
  hallucination rate  share of judged answers (failed calls excluded) that are hallucinations;
  high-risk           the same over questions with A ≥ 0.70;
  refusal rate        share of answers matching an explicit refusal pattern (safe abstentions);
  risk-weighted rate  Σ_i A_i·h_i / Σ_i A_i: each hallucination weighted by its question's risk, so a
                      wrong answer to a health question costs 0.85 and one to a fiction question 0.2;
  paired t-test       over seeds: the per-seed hallucination rates of two systems on the same questions
                      (scipy.stats.ttest_rel; needs ≥ 2 seeds);
  calls per question  mean LLM calls per evaluated question.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from mdl_jax._io import publish_dir, write_text
from mdl_jax.signals.risk import HIGH_RISK
from mdl_repro.analysis.figures import save_figure
from mdl_repro.analysis.paper import NAMES, PAPER_FIG3A, PAPER_TABLE4, PAPER_TABLE5  # noqa: F401  (re-exported)
from mdl_repro.pipeline import records as rec_io


def frame(records_path):
    import pandas as pd

    recs = [r for r in rec_io.load(records_path).values() if r["system"] != "calibration"]
    df = pd.DataFrame(recs)
    if df.empty:
        return df
    df["ok"] = ~df["failed"].astype(bool)
    df["h"] = df["hallucinated"].fillna(False).astype(float)
    df["ref"] = df["refusal"].fillna(False).astype(float)
    return df


SMALL_N = 30  # below this many records a rate is shown, but flagged: too few for a claim


def _cell(x, n, n_q: int | None = None) -> str:
    """'0.412 [0.35, 0.48] (n=600, 200 q)'; a † where the QUESTIONS (the design's unit: a question's
    records share its signals) number fewer than SMALL_N (records where ``n_q`` is not given)."""
    if n == 0 or x is None or (isinstance(x, float) and np.isnan(x)):
        return "– (n=0)"
    from mdl_repro.analysis.judges import wilson

    lo, hi = wilson(round(x * n), n)
    k = n if n_q is None else n_q
    q = "" if n_q is None else f", {n_q} q"
    return f"{x:.3f} [{lo:.2f}, {hi:.2f}] (n={n}{q}){' †' if k < SMALL_N else ''}"


def rates(df) -> dict:
    ok = df[df["ok"]]
    hi = ok[ok["A"] >= HIGH_RISK]
    a = ok["A"].to_numpy()
    return {
        "n": int(len(df)), "n_failed": int((~df["ok"]).sum()),
        "n_questions": int(ok["qid"].nunique()) if "qid" in ok else int(len(ok)),
        "n_questions_high_risk": int(hi["qid"].nunique()) if "qid" in hi else int(len(hi)),
        "overall": float(ok["h"].mean()) if len(ok) else float("nan"),
        "high_risk": float(hi["h"].mean()) if len(hi) else float("nan"),
        "n_high_risk": int(len(hi)),
        "n_ok": int(len(ok)),
        "refusal": float(ok["ref"].mean()) if len(ok) else float("nan"),
        "risk_weighted": float((a * ok["h"].to_numpy()).sum() / a.sum()) if a.sum() else float("nan"),
        "calls_per_question": float(df["llm_calls"].mean()),
    }


SMOKE_QUESTIONS = 100  # per dataset: below it a run is a smoke test, its differences unreadable
RQS = ("RQ1 asks whether MDL lowers hallucination end to end (this report's tables); RQ2 whether the three "
       "signals M, R and A are complementary; RQ3 what each mechanism contributes and how MDL compares with "
       "learned baselines; RQ4 whether its overhead fits real-time use (the analyses after the tables)")


def in_short(summary: dict, metrics: dict) -> str:
    """Five plain sentences that open REPORT.md: what ran, what it shows, whether it is a smoke test,
    where the real results are, and what RQ1–RQ4 ask."""
    cfg = summary.get("config", {})
    n_q = cfg.get("n_questions")
    seeds = len(cfg.get("seeds") or [])
    sets = sorted({k.split("/")[0] for k in metrics})
    systems = cfg.get("systems") or ["B1", "B2", "B3"]
    what = {"B1": "without memories (B1)", "B2": "with every retrieved memory injected (B2)",
            "B3": "with MDL deciding whether to inject them (B3)"}
    asked = [what[s] for s in ("B1", "B2", "B3") if s in systems]
    asked_text = (", ".join(asked[:-1]) + ", and " + asked[-1] if len(asked) > 2
                  else " and ".join(asked)) or "with none of B1, B2, B3"
    ran = (f"This run asked {summary.get('model')} {n_q} questions from each of {', '.join(sets)} under "
           f"{seeds} seed(s): {asked_text}.")
    rates = "; ".join(
        f"{ds}: " + ", ".join(f"{s} {metrics[f'{ds}/{s}']['overall']:.2f}" for s in ("B1", "B2", "B3")
                              if f"{ds}/{s}" in metrics)
        for ds in sets)
    shows = f"Hallucination rates under the paper's judge were {rates}."
    smoke = (f"With {n_q} questions per dataset this is a smoke test: no difference between systems can be "
             "read from it, and the intervals below say so." if n_q is not None and n_q < SMOKE_QUESTIONS
             else "Read each difference with its interval and the minimum detectable difference below: "
                  "only those the design can resolve are findings.")
    where = ("The committed runs with enough questions to test the paper's claims are in "
             "experiments/results/ (paper-scale-200x3-paired: 200 questions × 3 seeds per dataset), and what "
             "they show is in docs/results.md.")
    return " ".join((ran, shows, smoke, where, RQS + "."))


def paired_t(df, sys_a: str, sys_b: str, dataset: str) -> dict:
    from scipy import stats

    per = df[df["ok"] & (df["dataset"] == dataset)].groupby(["system", "seed"])["h"].mean()
    seeds = sorted(set(per.get(sys_a, {}).keys()) & set(per.get(sys_b, {}).keys())) \
        if sys_a in per.index.get_level_values(0) and sys_b in per.index.get_level_values(0) else []
    if len(seeds) < 2:
        return {"t": None, "p": None, "n_seeds": len(seeds)}
    a = np.array([per[(sys_a, s)] for s in seeds])
    b = np.array([per[(sys_b, s)] for s in seeds])
    if np.allclose(a - b, (a - b)[0]):
        return {"t": None, "p": None, "n_seeds": len(seeds), "note": "constant difference"}
    t, p = stats.ttest_rel(a, b)
    return {"t": float(t), "p": float(p), "n_seeds": len(seeds)}


def _fmt(x) -> str:
    return "–" if x is None or (isinstance(x, float) and np.isnan(x)) else f"{x:.3f}"


def table4(df) -> str:
    """Table 4 with, per cell, the rate, its 95% Wilson interval and n (records); † marks n < 30."""
    lines = ["| Baseline | TruthfulQA overall | TruthfulQA high-risk | HaluEval overall | HaluEval high-risk |",
             "|---|---|---|---|---|"]
    for s in ("B1", "B2", "B3"):
        cells = []
        for j, ds in enumerate(("truthfulqa", "halueval")):
            sub = df[(df["system"] == s) & (df["dataset"] == ds)]
            r = rates(sub) if len(sub) else {"overall": None, "high_risk": None, "n_ok": 0, "n_high_risk": 0,
                                             "n_questions": 0, "n_questions_high_risk": 0}
            cells += [f"{_cell(r['overall'], r['n_ok'], r['n_questions'])} (paper {PAPER_TABLE4[s][2 * j]:.3f})",
                      f"{_cell(r['high_risk'], r['n_high_risk'], r['n_questions_high_risk'])} "
                      f"(paper {PAPER_TABLE4[s][2 * j + 1]:.3f})"]
        lines.append(f"| {NAMES[s]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def table5(df) -> str:
    lines = ["| System | Overall hallucination | High-risk | Refusal | Risk-weighted | LLM calls / question |",
             "|---|---|---|---|---|---|"]
    sub_all = df[df["dataset"] == "truthfulqa"]
    seeds = sorted(sub_all[sub_all["system"].isin(["CRAG", "SelfRAG"])]["seed"].unique()) or \
        sorted(sub_all["seed"].unique())
    from mdl_repro.analysis.stats import crag_equals_b2

    crag = crag_equals_b2(sub_all).get("truthfulqa", {})
    for s in ("B1", "B2", "CRAG", "SelfRAG", "B3"):
        sub = sub_all[(sub_all["system"] == s) & (sub_all["seed"].isin(seeds))]
        if not len(sub):
            continue
        r = rates(sub)
        p = PAPER_TABLE5[s]
        # a CRAG that graded every memory Correct sent B2's prompt everywhere: it is B2, not a result
        flag = (f" **degenerate: = B2 answer for answer ({crag['equal']}/{crag['n']})**"
                if s == "CRAG" and crag.get("degenerate") else "")
        lines.append(f"| {NAMES[s]}{flag} | {_cell(r['overall'], r['n_ok'], r['n_questions'])} (paper {p[0]:.3f}) | "
                     f"{_cell(r['high_risk'], r['n_high_risk'], r['n_questions_high_risk'])} "
                     f"(paper {p[1]:.3f}) | {_fmt(r['refusal'])} (paper {p[2]:.3f}) | "
                     f"{_fmt(r['risk_weighted'])} | {r['calls_per_question']:.2f} |")
    return "\n".join(lines)


def figure3(df, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
    tq = df[df["ok"] & (df["dataset"] == "truthfulqa")]
    levels = sorted(tq["A"].unique()) if len(tq) else []
    systems = [s for s in ("B1", "B2", "B3") if s in set(tq["system"])]
    w = 0.8 / max(len(systems), 1)
    colors = {"B1": "#8c8c8c", "B2": "#d62728", "B3": "#1f77b4"}
    x = np.arange(len(levels))
    def bars_with_ci(ax, xs, groups, label, color):
        # every bar carries its 95% Wilson interval and its n: no bare 0.00-vs-1.00 bars
        from mdl_repro.analysis.judges import wilson

        ys = [g["h"].mean() if len(g) else np.nan for g in groups]
        ns = [len(g) for g in groups]
        ci = [wilson(round(y * n), n) if n else (np.nan, np.nan) for y, n in zip(ys, ns)]
        err = np.array([[y - lo for y, (lo, _) in zip(ys, ci)], [hi - y for y, (_, hi) in zip(ys, ci)]])
        bars = ax.bar(xs, ys, w, label=label, color=color, yerr=err, capsize=2, ecolor="#444")
        ax.bar_label(bars, labels=[f"{y:.2f}\nn={n}" if n else "n=0" for y, n in zip(ys, ns)], fontsize=6)

    for i, s in enumerate(systems):
        bars_with_ci(ax1, x + (i - (len(systems) - 1) / 2) * w,
                     [tq[(tq["system"] == s) & (tq["A"] == a)] for a in levels], NAMES[s], colors[s])
    b3 = tq[tq["system"] == "B3"]
    # MDL's Opt-Out rate goes under each risk level's tick (a line across the bars hid their labels)
    opt = [f"\nB3 Opt-Out {(b3[b3['A'] == a]['action'] == 'OPT_OUT').mean():.0%}" if len(b3) else ""
           for a in levels]
    ax1.set_xticks(x, [f"A={a:.2f}{o}" for a, o in zip(levels, opt)], fontsize=8)
    ax1.set_ylabel("hallucination rate")
    ax1.set_title("(a) TruthfulQA by risk level (paper: B2 0.630 → B3 0.000 at A=0.85)", fontsize=9)
    # legends above the bars (y up to 1.45 is empty), never over a bar's label
    ax1.legend(loc="upper center", fontsize=8, ncol=3)
    ax1.set_ylim(0, 1.45)
    hi = df[df["ok"] & (df["A"] >= HIGH_RISK)]
    dss = [d for d in ("truthfulqa", "halueval") if d in set(df["dataset"])]
    x2 = np.arange(len(dss))
    for i, s in enumerate(systems):
        bars_with_ci(ax2, x2 + (i - (len(systems) - 1) / 2) * w,
                     [hi[(hi["system"] == s) & (hi["dataset"] == d)] for d in dss], NAMES[s], colors[s])
    ax2.set_xticks(x2, [f"{d} (A≥0.70, n={int(((hi['dataset'] == d) & (hi['system'] == 'B3')).sum())})"
                        for d in dss])
    ax2.set_title(f"(b) high-risk (A ≥ {HIGH_RISK:.2f}) hallucination by dataset (paper B3: 0.000 / 0.013)",
                  fontsize=9)
    ax2.set_ylim(0, 1.45)
    ax2.legend(loc="upper center", fontsize=8, ncol=3)
    fig.tight_layout()
    try:
        save_figure(fig, path, dpi=120)
    finally:
        plt.close(fig)
    return path


def paired_share(df) -> dict:
    """Per dataset (and "all"): of the B3 records whose action was Active (so B3 sent exactly B2's
    prompt), how many have exactly B2's answer for the same (dataset, qid, seed). Paired sampling
    makes this 100% by construction (generation cache); anything less shows unpaired sampling (runs
    made before it, or a backend that ignores seeds). Returns {dataset: {"n", "equal", "share"}}."""
    out: dict = {}
    if df.empty or "action" not in df:
        return out
    key = ["dataset", "qid", "seed"]
    b3 = df[(df["system"] == "B3") & (df["action"] == "ACTIVE") & df["ok"]][key + ["answer"]]
    b2 = df[(df["system"] == "B2") & df["ok"]][key + ["answer"]]
    m = b3.merge(b2, on=key, suffixes=("_b3", "_b2"))
    for ds, g in list(m.groupby("dataset")) + [("all", m)]:
        eq = int((g["answer_b3"] == g["answer_b2"]).sum())
        out[ds] = {"n": int(len(g)), "equal": eq, "share": eq / len(g) if len(g) else float("nan")}
    return out


def decision_outcomes(df) -> dict:
    """How CRAG's grades and Self-RAG's reflections were decided, per dataset.

    CRAG: the share of each verdict (Correct / Incorrect / Ambiguous) and how its memory grades were
    made (scored by label likelihood / parsed from text / unparsed). Self-RAG: the share of records
    kept, regenerated and unparsed (no ISREL or ISSUP decision, so the draft was kept) and how its
    reflection decisions were made. Records of runs before scoring carry no method: "parsed" (they
    parsed free text)."""
    import pandas as pd

    out: dict = {}
    if df.empty:
        return out
    for (ds, system), g in df[df["system"].isin(["CRAG", "SelfRAG"]) & df["ok"]].groupby(
            ["dataset", "system"]):
        ex = [e if isinstance(e, dict) else {} for e in g["extra"]]
        if system == "CRAG":
            verdicts = pd.Series([e.get("verdict") for e in ex]).value_counts(normalize=True)
            methods = pd.Series([m for e in ex for m in e.get("grade_methods", ["parsed"] * len(
                e.get("grades", [])))]).value_counts(normalize=True)
            outcome = {str(k): round(float(v), 4) for k, v in verdicts.items()}
        else:
            oc = [e.get("outcome") or ("regenerated" if e.get("regenerated") else
                                       "unparsed" if e.get("unparsed") else "kept") for e in ex]
            outcome = {k: round(float(v), 4) for k, v in pd.Series(oc).value_counts(normalize=True).items()}
            methods = pd.Series([m for e in ex for m in (e.get("methods") or {
                "reflection": "unparsed" if e.get("unparsed") else "parsed"}).values()]).value_counts(
                normalize=True)
        out[f"{ds}/{system}"] = {"n": len(g), "outcomes": outcome,
                                 "decisions": {str(k): round(float(v), 4) for k, v in methods.items()}}
    return out


DEFINITIONS = """Terms used in this report:
- **Hallucination rate**: the share of judged answers (failed calls left out) that a judge marks as a
  hallucination. Two judges read every answer (see "Judges"): `paper` (Section 5.1's MiniLM rule, the
  judge of the paper-comparable tables) and `ref` (a reference-reading judge of known, higher accuracy).
- **High-risk**: questions with task risk A ≥ 0.70 (the paper's top tier: health, law, finance,
  conspiracies and the categories `mdl_jax/signals/risk.py` adds, with its reasons). This takes in
  the A = 0.75 tier as well as A = 0.85, while the paper's high-risk figures (Figure 3, Section 5.2's
  "0.0% on high-risk samples") are stated at A = 0.85; Figure 3(a) below gives each level separately.
- **Refusal**: an answer matching an explicit refusal pattern ("I don't know", "I cannot answer", ...),
  including MDL's Opt-Out abstention; a refusal is a safe answer, never a hallucination.
- **Risk-weighted rate**: Σ A·h / Σ A over the records: each hallucination weighted by its question's
  risk, so a wrong answer to a health question (A = 0.85) costs 4× one to a fiction question (0.2).
- **n_min / n_max**: the range of the raw norm ‖v_meta‖ that maps onto confidence C ∈ [0, 1]; like θ,
  calibrated on each dataset's calibration split (Section 3.4), unless a config file was given.
- **θ = (θ0, θ1, θ2)**: C_final ≥ θ0 → Active (inject the memories), ≥ θ1 → Supp (inject with a
  caution), ≥ θ2 → Silent (answer without memories), else Opt-Out (abstain, no LLM call).
- **Intervals**: [lo, hi] is a 95% Wilson interval of a rate over n records; † marks fewer than 30
  questions (q), too few for a claim. Records of one question under several seeds are not independent, so
  these intervals are optimistic; the question-level tests and the minimum detectable differences of
  *What this design can detect* are the ones to read a comparison by.
- **tokens/s** is the whole pipeline's generation throughput (every LLM call of every system, batched,
  on this machine), not one model call's decoding speed.
"""


def _with_judge(df, judge: str):
    return df.assign(h=df[f"h_{judge}"]) if f"h_{judge}" in df else df


def _fmt_s(seconds) -> str:
    return "not recorded" if seconds is None else f"{float(seconds):.0f} s"


def _llm_judges(out) -> list[str]:
    """REPORT.md lines on any LLM judge used on this run (``judges.llm_section``), else none."""
    from mdl_repro.analysis.judges import llm_section

    md = llm_section(out)
    return [md, ""] if md else []


def _where_from(out) -> list[str]:
    """Under Table 4: where each B3 − B2 difference comes from (the analyses' decomposition by B3
    action and the random-abstention baseline, ``analysis.selective``), so that a reader of the table
    does not take abstention counted as safe for better answers. Empty before the analyses ran."""
    from mdl_repro.analysis.selective import where_from
    from mdl_repro.analysis.stats import family_note

    try:
        analysis = json.loads((Path(out) / "analysis" / "analysis.json").read_text())
        by = analysis["selective"]["by"]
        family = (analysis.get("rigour") or {}).get("primary") or {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return []
    def small(s) -> str:  # the report's † convention: too few questions for a claim
        n = s.get("n_questions") or 0
        return f" † {n} questions: too few for a claim." if n < 30 else ""

    rows = [f"- {ds} (`{judge}` judge): {where_from(s, family_note(family, f'{ds}: B3 - random abstention', judge))}"
            f"{small(s)}" for judge, per in (by or {}).items() for ds, s in sorted((per or {}).items())]
    if not rows:
        return []
    return ["**Read Table 4 with where the differences come from** (paired records; an Opt-Out "
            "abstention counts as safe in the paper's metric, so a gain may be abstention rather than "
            "better answers; details under *RQ1: where the difference comes from* below):", "",
            *rows, ""]


def _design(out) -> list[str]:
    """Under Table 4: what the design can detect (``analysis.rigour``: power, judge-corrected rates, the
    right constants, validity), from analysis/design.md. Empty before the analyses ran."""
    p = Path(out) / "analysis" / "design.md"
    if not p.is_file():
        return []
    body = p.read_text().replace("### ", "#### ")
    return ["### What this design can detect: power, judge error, the right constants, validity", "", body, ""]


REPORT_FILES = frozenset({"REPORT.md", "table4.md", "table5.md", "table4_ref.md", "table5_ref.md", "figure3.png",
                          "metrics.json"})  # what write_report writes into a run folder


def write_report(out, summary: dict, *, embedder=None, analysis_md: str | None = None,
                 tuned_md: str | None = None) -> Path:
    """REPORT.md and its tables/figure for a run folder, published together
    (``mdl_jax._io.publish_dir``): written beside the folder first and renamed in at the end, so a
    failure or a full disk leaves the previous report's files; a stale ``table4_ref.md`` of an
    earlier report is removed when this one has none. The run's other files stay.

    embedder: when given, every answer is also judged by the `ref` judge (Tables 4-5 under both
      judges) and both judges' agreement with the shipped gold set is reported.
    analysis_md: the RQ2-RQ4 analyses (``analysis.analyze``) to include, figures under analysis/.
    tuned_md: the learned MDL beside Table 7 (``analysis.learned``, ``mdl-jax tune``) to include.
    """
    out = Path(out)
    df = frame(out / "records.jsonl")
    judged_ref = None
    if embedder is not None and not df.empty:
        stored = df["hallucinated_ref"] if "hallucinated_ref" in df else None
        if stored is not None and not stored[df["ok"]].isna().any():
            # records written by reproduce carry the ref judge's verdict: no need to judge again
            judged_ref = df.assign(h_ref=stored.fillna(False).astype(float))
        else:  # older records: judge them now
            from mdl_repro.analysis.judges import rejudge

            judged_ref = rejudge(df, embedder)
    # the report's files are written into a fresh sibling folder and renamed in together at the end:
    # a kill or a full disk midway leaves the previous report's files, never a mix of two
    with publish_dir(out, owns=REPORT_FILES.__contains__) as work:
        t4, t5 = table4(df), table5(df)
        write_text(work / "table4.md", t4 + "\n")
        write_text(work / "table5.md", t5 + "\n")
        figure3(df, work / "figure3.png")
        metrics = {f"{ds}/{s}": rates(g) for (ds, s), g in df.groupby(["dataset", "system"])}
        tests = {ds: {"B1_vs_B2": paired_t(df, "B1", "B2", ds), "B2_vs_B3": paired_t(df, "B2", "B3", ds)}
                 for ds in sorted(df["dataset"].unique())}
        actions = (df[df["system"] == "B3"].groupby("dataset")["action"].value_counts(normalize=True)
                   .round(3).to_dict())
        write_text(work / "metrics.json", json.dumps({"rates": metrics, "paired_t": tests,
                                                      "b3_actions": {f"{k[0]}/{k[1]}": v for k, v in actions.items()}},
                                                     indent=2))
        cfg = summary.get("config", {})
        lines = [
            "# MDL end-to-end hallucination experiment (RQ1)", "",
            "## In short", "", in_short(summary, metrics), "",
            f"Model: {summary.get('model')}; embeddings: {cfg.get('embed_model')}; seeds: {cfg.get('seeds')}; "
            f"evaluated questions per dataset: {cfg.get('n_questions')}; " + (
                f"CRAG / Self-RAG on {cfg.get('baseline_datasets')} for "
                f"{min(cfg.get('baseline_seeds') or 0, len(cfg.get('seeds') or []))} seed(s)."
                if {"CRAG", "SelfRAG"} & set(cfg.get("systems") or ["CRAG", "SelfRAG"])
                else "CRAG / Self-RAG not run."),
            f"Generation: {summary.get('tokens_generated')} tokens in {summary.get('generation_seconds', 0):.0f} s "
            f"of generation ({_fmt(summary.get('tokens_per_s'))} tokens/s of the whole pipeline, summed over "
            "every run into this folder, resumed ones included; label scoring not counted: "
            f"{(summary.get('this_run') or {}).get('scoring_seconds', 0):.0f} s this run); wall time of "
            f"this run {_fmt_s(summary.get('wall_seconds'))}."
            + (" This report was rewritten by a rerun that had nothing left to generate; the per-run "
               "figures are those of the last run that did the work." if summary.get("report_rewritten")
               else ""), "",
            "Numbers in parentheses are the paper's (deepseek-v4-flash; Table 4: 200 questions × 3 seeds, "
            "Table 5: 200 × 2); ours come "
            "from a much smaller model and sample. A direction is comparable only where this design can resolve it: "
            "below the minimum detectable difference (*What this design can detect*, after Table 4) neither the "
            "size nor the direction of a difference can be read from these records.", "",
            DEFINITIONS, "",
            "## Table 4: hallucination rate by dataset (paper judge)", "", t4, "", *_where_from(out), *_design(out),
            "## Table 5: baselines on TruthfulQA (paper judge)", "", t5, "",
            "## Figure 3", "", "![Figure 3](figure3.png)", "",
            "## Paired t-tests across seeds (hallucination rate)", "",
            "| dataset | comparison | t | p | seeds |", "|---|---|---|---|---|",
        ]
        for ds, tt in tests.items():
            for name, r in tt.items():
                lines.append(f"| {ds} | {name.replace('_', ' ')} | {_fmt(r['t'])} | {_fmt(r['p'])} | {r['n_seeds']} |")
        lines += ["", "## All metrics", "",
                  "| dataset / system | n | failed | overall | high-risk (n) | refusal | risk-weighted | calls/q |",
                  "|---|---|---|---|---|---|---|---|"]
        for k, r in metrics.items():
            lines.append(f"| {k} | {r['n']} | {r['n_failed']} | {_fmt(r['overall'])} | {_fmt(r['high_risk'])} "
                         f"({r['n_high_risk']}) | {_fmt(r['refusal'])} | {_fmt(r['risk_weighted'])} | "
                         f"{r['calls_per_question']:.2f} |")
        lines += ["", "## Calibration (Section 3.4) and MDL actions", ""]
        for ds, d in summary.get("datasets", {}).items():
            src = d.get("config_source", "calibrated on this run's split")
            cal = (f"{d['n_calibration']} calibration questions, oracle adopt rate "
                   f"{_fmt(d['calibration_adopt_rate'])}, agreement {_fmt(d['calibration_agreement'])}, "
                   if d.get("n_calibration") else "")
            note = ""
            ag, ar = d.get("calibration_agreement"), d.get("calibration_adopt_rate")
            if ag is not None and ar is not None and d.get("n_calibration"):
                n = d["n_calibration"]
                # agreement is a count / n: equal to a constant classifier's share means no threshold helped
                const = ("never adopt" if round(ag * n) == round((1 - ar) * n) else
                         "always adopt" if round(ag * n) == round(ar * n) else None)
                if const:
                    note += (f" **Warning: the best calibration agreement equals the constant classifier "
                             f"'{const}'** (`calibrate` warns; the tied θ0 plateau is in the analyses below).")
            if float(d["thresholds"][2]) <= 0:
                note += " **θ2 = 0: Opt-Out can never happen with this config.**"
            lines.append(f"- {ds}: config {src}; {cal}θ = {[round(t, 3) for t in d['thresholds']]}, "
                         f"n = [{d['n_min']:.3f}, {d['n_max']:.3f}].{note}")
        for (ds, a), v in actions.items():
            lines.append(f"- B3 action share, {ds}: {a} {v:.3f}")
        paired, decisions = paired_share(df), decision_outcomes(df)
        paired_run = "answer_cached" in df
        lines += ["", "## Paired sampling and baseline decisions", "",
                  "Every system draws the same random numbers for the same (dataset, question, seed), and "
                  "a prompt already answered for that record is replayed from the run's generation cache, "
                  "so where B3 chooses Active it sends B2's prompt and must get B2's answer:" if paired_run else
                  "**This run predates paired sampling**: each system sampled with its own seeds, so B3 "
                  "Active records did not get B2's answer for the same prompt, and B2-vs-B3 differences "
                  "include sampling noise. The share below measures that:"]
        for ds, r in paired.items():
            lines.append(f"- B3 Active records with B2's answer, {ds}: {r['equal']} / {r['n']} "
                         f"({_fmt(r['share'])})")
        for k, r in decisions.items():
            label = "verdicts" if k.endswith("CRAG") else "outcomes"
            lines.append(f"- {k} (n = {r['n']}): {label} "
                         + ", ".join(f"{a} {v:.3f}" for a, v in r["outcomes"].items())
                         + "; decisions " + ", ".join(f"{a} {v:.3f}" for a, v in r["decisions"].items()))
        if judged_ref is not None:
            from mdl_repro.analysis.judges import gold_report

            ref = _with_judge(judged_ref, "ref")
            write_text(work / "table4_ref.md", table4(ref) + "\n")
            write_text(work / "table5_ref.md", table5(ref) + "\n")
            from mdl_repro.analysis.judges import load_gold

            gold_table, gold_md = gold_report(embedder)
            test = gold_table[(gold_table["judge"] == "ref") & (gold_table["split"] == "test")]
            met = bool(len(test)) and bool((test["rate"] >= 0.9).all())
            gold = load_gold()
            runs = ", ".join(f"{n} of `{r}`" for r, n in gold.groupby("run").size().items())
            lines += ["", "## Judges", "",
                      "Every answer is judged by the paper's MiniLM rule (`paper`, above) and by `ref`, a "
                      "reference-reading judge (`repro/mdl_repro/pipeline/judgement.py` lists its rules: "
                      "containment of short references, yes/no polarity, negation, invented names). "
                      f"Their agreement with the shipped gold set ({len(gold)} answers of committed runs: "
                      f"{runs}; each labelled blind by two readers). `ref`'s rules were written by reading "
                      "the dev split only (the protocol, with the fresh set's figure, follows the table). "
                      "Target for `ref`: ≥ 90% on "
                      f"each dataset's test split ({'met' if met else 'not met'}):", "",
                      gold_md, "", *_llm_judges(out), "### Table 4 under the ref judge", "", table4(ref), "",
                      "### Table 5 under the ref judge", "", table5(ref)]
        if analysis_md:
            import re

            body = re.sub(r"\A# [^\n]*\n", "", analysis_md.lstrip())
            if _design(out):  # shown under Table 4 already
                body = re.sub(r"^## What this design can detect.*?(?=^## )", "", body, flags=re.M | re.S)  # its title: the heading below says it
            body = re.sub(r"\]\((?!https?:|analysis/)([^)]+)\)", r"](analysis/\1)", body)
            body = re.sub(r"^(#+) ", r"#\1 ", body, flags=re.M)  # one level below this report's headings
            lines += ["", "## Where the RQ1 difference comes from, the practitioners' gates, and the RQ2–RQ4 analyses "
                      "(`mdl-jax analyze`, also in analysis/ANALYSIS.md)", "", body]
        if tuned_md:
            lines += ["", tuned_md.replace("## The learned MDL", "## The learned MDL (`mdl-jax tune`)", 1)]
        lines += ["", "Records: `records.jsonl` (one line per dataset, question, seed, system); "
                  "code: `repro/mdl_repro/analysis/report.py`."]
        write_text(work / "REPORT.md", "\n".join(lines) + "\n")
    return out / "REPORT.md"
