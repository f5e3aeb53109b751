"""How far each hallucination judge agrees with careful reading: the gold set, and re-judged records.

The gold set (``mdl_jax/pipeline/resources/gold_labels.jsonl``) holds 322 answers of the committed
``paper-scale-200x3`` run (160 TruthfulQA over all five systems, 162 HaluEval over B1-B3), each labelled
blind by two readers under one rule: hallucinated = the answer's answer to the question is false given
the references; a false side detail that leaves the answer right is safe; refusals and non-answers that
assert nothing false are safe. Its ``dev`` half tuned the ``ref`` judge; its ``test`` half did not.

  agreement      share of gold records on which a judge's verdict equals the gold label, with a 95%
                 Wilson interval, per judge × dataset × split;
  confusion      2×2 counts: judge hallucinated / safe against gold hallucinated / safe;
  rejudge(df)    adds ``hallucinated_<judge>`` (bool, None where failed) and ``h_<judge>`` (float) to a
                 records DataFrame, so Tables 4-5 can be computed under every judge.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from mdl_jax.pipeline.judgement import JUDGES, judge_all

GOLD_PATH = Path(__file__).resolve().parents[1] / "pipeline" / "resources" / "gold_labels.jsonl"
DATASET_NAMES = {"truthfulqa": "TruthfulQA", "halueval": "HaluEval"}


def load_gold(path: str | Path = GOLD_PATH) -> pd.DataFrame:
    """The gold set as a DataFrame (one row per labelled answer)."""
    return pd.read_json(path, lines=True, dtype={"qid": int, "seed": int})


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """95% Wilson score interval of a proportion k/n ((nan, nan) for n = 0)."""
    if n == 0:
        return float("nan"), float("nan")
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return (0.0 if k == 0 else max(0.0, mid - half)), (1.0 if k == n else min(1.0, mid + half))


def _items(datasets, data_dir=None) -> dict:
    from mdl_jax.pipeline.data import load

    return {ds: load(ds, data_dir) for ds in sorted(set(datasets))}


def judge_gold(embedder, gold: pd.DataFrame | None = None, data_dir=None) -> pd.DataFrame:
    """The gold set with ``gold`` (bool) and one ``judge_<name>`` (bool) column per judge."""
    g = load_gold() if gold is None else gold.copy()
    pools = _items(g["dataset"], data_dir)
    its = [pools[d][q] for d, q in zip(g["dataset"], g["qid"])]
    verdicts = judge_all(list(g["answer"]), its, embedder)
    g["gold"] = g["label"].eq("hallucinated")
    for name, js in verdicts.items():
        g[f"judge_{name}"] = [j.hallucinated for j in js]
    return g


def agreement(judged: pd.DataFrame) -> pd.DataFrame:
    """One row per judge × dataset × split (and split "all"): n, agreeing, rate, Wilson interval and
    the confusion counts tp (both hallucinated), fp (judge only), fn (gold only), tn (both safe)."""
    rows = []
    for name in JUDGES:
        order = list(DATASET_NAMES)
        for ds in sorted(judged["dataset"].unique(), key=lambda d: (order.index(d) if d in order else
                                                                    len(order), d)):
            d = judged[judged["dataset"] == ds]
            for split in ("dev", "test", "all"):
                s = d if split == "all" else d[d["split"] == split]
                j, g = s[f"judge_{name}"].astype(bool), s["gold"].astype(bool)
                k, n = int((j == g).sum()), len(s)
                lo, hi = wilson(k, n)
                rows.append({"judge": name, "dataset": ds, "split": split, "n": n, "agree": k,
                             "rate": k / n if n else float("nan"), "lo": lo, "hi": hi,
                             "tp": int((j & g).sum()), "fp": int((j & ~g).sum()),
                             "fn": int((~j & g).sum()), "tn": int((~j & ~g).sum())})
    return pd.DataFrame(rows)


def agreement_markdown(table: pd.DataFrame) -> str:
    """The agreement table and the test-split confusion matrices as Markdown."""
    out = ["| Judge | Dataset | Split | n | Agreement | 95% CI (Wilson) |", "|---|---|---|---:|---:|---|"]
    for r in table.itertuples():
        out.append(f"| {r.judge} | {DATASET_NAMES.get(r.dataset, r.dataset)} | {r.split} | {r.n} | "
                   f"{r.rate:.3f} ({r.agree}/{r.n}) | [{r.lo:.3f}, {r.hi:.3f}] |")
    for split in ("test", "all"):
        out += ["", f"Confusion matrices ({split} split; rows: judge, columns: gold):", ""]
        for r in table[table["split"] == split].itertuples():
            out += [f"**{r.judge} on {DATASET_NAMES.get(r.dataset, r.dataset)}** (n = {r.n})", "",
                    "| judge \\ gold | hallucinated | safe |", "|---|---:|---:|",
                    f"| hallucinated | {r.tp} | {r.fp} |", f"| safe | {r.fn} | {r.tn} |", ""]
    return "\n".join(out).rstrip() + "\n"


def gold_report(embedder, data_dir=None) -> tuple[pd.DataFrame, str]:
    """(agreement table, its Markdown) of every judge against the shipped gold set."""
    table = agreement(judge_gold(embedder, data_dir=data_dir))
    return table, agreement_markdown(table)


def rejudge(df: pd.DataFrame, embedder, data_dir=None) -> pd.DataFrame:
    """A copy of a records DataFrame (``report.frame``) with ``hallucinated_<judge>`` (bool; None where
    the call failed) and ``h_<judge>`` (float, failed → 0 as in ``report.frame``) for every judge."""
    out = df.copy()
    if out.empty:
        for name in JUDGES:
            out[f"hallucinated_{name}"], out[f"h_{name}"] = [], []
        return out
    pools = _items(out["dataset"], data_dir)
    its = [pools[d][int(q)] for d, q in zip(out["dataset"], out["qid"])]
    failed = out["failed"].astype(bool) if "failed" in out else pd.Series(False, index=out.index)
    answers = [None if f else a for a, f in zip(out["answer"], failed)]
    for name, js in judge_all(answers, its, embedder).items():
        out[f"hallucinated_{name}"] = [None if j is None else j.hallucinated for j in js]
        out[f"h_{name}"] = [0.0 if j is None else float(j.hallucinated) for j in js]
    return out
