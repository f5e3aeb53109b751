"""How far each hallucination judge agrees with careful reading: the gold set, and re-judged records.

The gold set (``repro/mdl_repro/pipeline/resources/gold_labels.jsonl``) holds 322 answers of the committed
``paper-scale-200x3`` run (160 TruthfulQA over all five systems, 162 HaluEval over B1-B3), each labelled
blind by two readers under one rule: hallucinated = the answer's answer to the question is false given
the references; a false side detail that leaves the answer right is safe; refusals and non-answers that
assert nothing false are safe. Its ``dev`` half tuned the ``ref`` judge; its ``test`` half was scored
(not read) several times while the rules were written, and that split is by record (``PROTOCOL``);
``question_split`` regroups it by question for further rule work; the 160 answers of ``paired-30x2``
(labelled after the rules were frozen) are the fresh set, reported separately.

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

from mdl_repro.pipeline.judgement import JUDGES, judge_all

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


def dataset_items(datasets, data_dir=None) -> dict:
    """{dataset: its items}, each named dataset loaded once."""
    from mdl_repro.pipeline.data import load

    return {ds: load(ds, data_dir) for ds in sorted(set(datasets))}


def _verdicts_key(answers: list, items: list, embedder) -> str | None:
    """What the judges' verdicts on ``answers`` depend on: the answers, their questions' references
    (the items), the judges' rules (the source of ``pipeline/judgement.py``) and the embedder's model
    (its ``model_id`` names the backend too). None for an embedder without a cache folder or model id
    (a test double): nothing is cached for it."""
    if getattr(embedder, "cache_dir", None) is None or not getattr(embedder, "model_id", None):
        return None
    import hashlib
    import json

    from mdl_repro.pipeline import judgement

    h = hashlib.sha256(Path(judgement.__file__).read_bytes())
    h.update(json.dumps([embedder.model_id, answers, [repr(it) for it in items]]).encode())
    return h.hexdigest()[:24]


def judge_gold(embedder, gold: pd.DataFrame | None = None, data_dir=None) -> pd.DataFrame:
    """The gold set with ``gold`` (bool) and one ``judge_<name>`` (bool) column per judge.

    Every run's report judges the same shipped gold set with the same rules (a large share of a small
    run's analysis), so the verdicts are kept in the embedder's cache folder
    (``judged/gold-KEY.json``, one small file per key), keyed by everything they depend on
    (``_verdicts_key``): a change of answer, reference, rule or model judges afresh."""
    import json

    from mdl_jax._io import write_bytes

    g = load_gold() if gold is None else gold.copy()
    pools = dataset_items(g["dataset"], data_dir)
    its = [pools[d][q] for d, q in zip(g["dataset"], g["qid"])]
    answers = list(g["answer"])
    key = _verdicts_key(answers, its, embedder)
    path = None if key is None else Path(embedder.cache_dir) / "judged" / f"gold-{key}.json"
    flags = None
    if path is not None and path.is_file():
        try:
            flags = json.loads(path.read_text())
            if set(flags) != set(JUDGES) or any(len(v) != len(answers) or any(x is not None and type(x) is not bool
                                                                               for x in v) for v in flags.values()):
                flags = None
        except (OSError, ValueError):
            flags = None  # a torn or foreign file costs one judging, never a wrong verdict
    if flags is None:
        verdicts = judge_all(answers, its, embedder)
        flags = {name: [None if j is None else bool(j.hallucinated) for j in js] for name, js in verdicts.items()}
        if path is not None:
            try:
                write_bytes(path, json.dumps(flags).encode())
            except OSError:
                pass  # a cache that cannot be written costs only the next run's judging
    g["gold"] = g["label"].eq("hallucinated")
    for name, js in flags.items():
        g[f"judge_{name}"] = js
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
    """(agreement table, its Markdown) of every judge against the shipped gold set; the Markdown ends
    with the judges' protocol (``protocol_markdown``: by-record and by-question test splits, the fresh
    set separately)."""
    judged = judge_gold(embedder, data_dir=data_dir)
    table = agreement(judged)
    return table, agreement_markdown(table) + "\n" + protocol_markdown(protocol_table(judged))


def rejudge(df: pd.DataFrame, embedder, data_dir=None) -> pd.DataFrame:
    """A copy of a records DataFrame (``report.frame``) with ``hallucinated_<judge>`` (bool; None where
    the call failed) and ``h_<judge>`` (float, failed → 0 as in ``report.frame``) for every judge."""
    out = df.copy()
    if out.empty:
        for name in JUDGES:
            out[f"hallucinated_{name}"], out[f"h_{name}"] = [], []
        return out
    pools = dataset_items(out["dataset"], data_dir)
    its = [pools[d][int(q)] for d, q in zip(out["dataset"], out["qid"])]
    failed = out["failed"].astype(bool) if "failed" in out else pd.Series(False, index=out.index)
    answers = [None if f else a for a, f in zip(out["answer"], failed)]
    for name, js in judge_all(answers, its, embedder).items():
        out[f"hallucinated_{name}"] = [None if j is None else j.hallucinated for j in js]
        out[f"h_{name}"] = [0.0 if j is None else float(j.hallucinated) for j in js]
    return out


# -- the judges' protocol as it happened, and a split for further rule work --------------------------

FRESH_RUN = "paired-30x2"  # labelled after the ref rules were frozen: the one blind measurement


def question_split(gold: pd.DataFrame) -> pd.Series:
    """The gold set's split regrouped by question: ``dev`` for every record of a question that has a
    ``dev`` record (those questions were read while the ``ref`` rules were written), ``test``
    otherwise. The shipped ``split`` column is by record and stays as it is (the published figures
    are computed on it); rule work from now on tunes on ``dev`` of this split and scores ``test``.
    (N,) strings aligned with ``gold``."""
    read = set(zip(gold.loc[gold["split"] == "dev", "dataset"], gold.loc[gold["split"] == "dev", "qid"]))
    return pd.Series(["dev" if (d, q) in read else "test" for d, q in zip(gold["dataset"], gold["qid"])],
                     index=gold.index, name="split_by_question")


def protocol_table(judged: pd.DataFrame) -> pd.DataFrame:
    """Agreement of each judge on the three readings of the gold set that matter for honesty: the
    by-record test split (the published figure; its questions overlap dev), the by-question test split
    (no question read while the rules were written) and the fresh set (``FRESH_RUN``, labelled after
    the rules were frozen). ``judged``: ``judge_gold``'s output."""
    q = question_split(judged)
    views = {"test (by record)": judged["split"] == "test", "test (by question)": q == "test",
             f"fresh ({FRESH_RUN})": judged["run"] == FRESH_RUN}
    rows = []
    for name in JUDGES:
        for ds in sorted(judged["dataset"].unique()):
            for view, mask in views.items():
                s = judged[mask & (judged["dataset"] == ds)]
                k, n = int((s[f"judge_{name}"].astype(bool) == s["gold"].astype(bool)).sum()), len(s)
                lo, hi = wilson(k, n)
                rows.append({"judge": name, "dataset": ds, "view": view, "n": n, "agree": k,
                             "rate": k / n if n else float("nan"), "lo": lo, "hi": hi})
    return pd.DataFrame(rows)


PROTOCOL = (
    "How the `ref` rules were developed, as it happened: they were written by reading the `dev` half of "
    "the first 322 gold answers, and the `test` half's agreement was computed three times while they "
    "were written (to check progress, not read answer by answer). That split is by record: 43 questions "
    "have answers in both halves, so 66 test answers share a question with answers that were read. The "
    "160 answers of `paired-30x2`, labelled blind after the rules were frozen, are the one fresh "
    "measurement, and are reported separately below. For any further rule work the split is regrouped "
    "by question (`judges.question_split`: every answer of a question with a dev answer is dev); the "
    "published by-record figures stay reproducible from the shipped `split` column.")


def protocol_markdown(table: pd.DataFrame) -> str:
    out = [PROTOCOL, "", "| Judge | Dataset | Gold answers | n | Agreement | 95% CI (Wilson) |",
           "|---|---|---|---:|---:|---|"]
    for r in table.itertuples():
        out.append(f"| {r.judge} | {DATASET_NAMES.get(r.dataset, r.dataset)} | {r.view} | {r.n} | "
                   f"{r.rate:.3f} ({r.agree}/{r.n}) | [{r.lo:.3f}, {r.hi:.3f}] |")
    return "\n".join(out) + "\n"


# -- the LLM judge (``mdl-jax judge --judge llm``): its agreement with the gold set -------------------

def llm_summary(judged: list[dict], gold_rows: list[dict], *, model: str, server: str, calls: int,
                cache_hits: int) -> dict:
    """What ``mdl-jax judge --judge llm`` writes beside its output (``*.llm-judge.json``): the judge's
    model, verdict methods, failures, hallucination rates of the judged records, and its agreement with
    the gold set per dataset (Wilson 95% CI; failed verdicts are counted as not agreeing and listed)."""
    def methods(rows):
        out: dict[str, int] = {}
        for r in rows:
            m = r.get("judge_llm_method")
            if m is not None:
                out[m] = out.get(m, 0) + 1
        return out

    agreement = {}
    for ds in sorted({r["dataset"] for r in gold_rows}):
        rows = [r for r in gold_rows if r["dataset"] == ds]
        ok = [r for r in rows if r.get("judge_llm_hallucinated") is not None]
        k = sum(r["judge_llm_hallucinated"] == (r["label"] == "hallucinated") for r in ok)
        n = len(rows)
        lo, hi = wilson(k, n)
        says_yes = sum(bool(r["judge_llm_hallucinated"]) for r in ok)
        agreement[ds] = {"n": n, "agree": int(k), "rate": k / n if n else None, "lo": lo, "hi": hi,
                         "failed": n - len(ok), "judged_hallucinated": says_yes,
                         "gold_hallucinated": sum(r["label"] == "hallucinated" for r in rows)}
    rates = {}
    for ds in sorted({r["dataset"] for r in judged}):
        v = [r["judge_llm_hallucinated"] for r in judged
             if r["dataset"] == ds and r.get("judge_llm_hallucinated") is not None]
        rates[ds] = {"n": len(v), "rate": sum(v) / len(v) if v else None}
    return {"judge": "llm", "model": model, "server": server, "calls": calls, "cache_hits": cache_hits,
            "methods": methods(judged), "failed": sum(r.get("judge_llm_method") == "failed" for r in judged),
            "n": len(judged), "hallucination_rate": rates, "gold_agreement": agreement,
            "gold_methods": methods(gold_rows)}


def llm_summary_markdown(s: dict) -> str:
    """One LLM judge's summary as Markdown (REPORT.md's judges section, and the command's output)."""
    lines = [f"**LLM judge `{s['model']}`** (server {s['server']}): {s['n']} answers graded; verdict by "
             + ", ".join(f"{k} {v}" for k, v in sorted(s["methods"].items()))
             + f"; {s['failed']} failed (recorded with their reason, never guessed).", ""]
    if s["gold_agreement"]:
        lines += ["| Dataset | gold answers | agreement | 95% CI (Wilson) | failed | judged hallucinated / "
                  "gold hallucinated |", "|---|---:|---:|---|---:|---|"]
        for ds, a in s["gold_agreement"].items():
            rate = "–" if a["rate"] is None else f"{a['rate']:.3f} ({a['agree']}/{a['n']})"
            lines.append(f"| {DATASET_NAMES.get(ds, ds)} | {a['n']} | {rate} | [{a['lo']:.3f}, {a['hi']:.3f}] "
                         f"| {a['failed']} | {a['judged_hallucinated']} / {a['gold_hallucinated']} |")
    else:
        lines.append("Its agreement with the gold set was not measured (`--no-gold`).")
    return "\n".join(lines) + "\n"


def llm_section(run_dir) -> str | None:
    """REPORT.md's paragraph on every LLM judge used on this run (``*.llm-judge.json`` in its folder,
    written by ``mdl-jax judge --judge llm``), or None when none was used."""
    import json

    found = sorted(Path(run_dir).glob("*.llm-judge.json"))
    parts = []
    for f in found:
        try:
            s = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        parts.append(f"From `{f.name}`:\n\n" + llm_summary_markdown(s))
    if not parts:
        return None
    return "\n".join(["### LLM judges (`mdl-jax judge --judge llm`)", "",
                      "Each answer graded against the dataset's references by an OpenAI-compatible "
                      "server, the verdict read from the Yes/No label likelihood where the server sends "
                      "logprobs, else from the reply's first word; agreement with the shipped gold set:",
                      "", *parts])


# -- the gold set as the analyses read it: every judge's verdict and the answer's condition -----------

VERDICTS_PATH = Path(__file__).resolve().parent / "resources" / "gold_verdicts.jsonl"
MEMORY_SYSTEMS = ("B2", "CRAG", "SelfRAG")  # answers written with the memories in the prompt


def answer_condition(system: str, action) -> str:
    """'memory' where the answer was written with the memories in its prompt (B2, CRAG, Self-RAG; B3
    under Active / Supp), 'no memory' otherwise (B1; B3 under Silent), 'abstention' for B3 Opt-Out."""
    if system in MEMORY_SYSTEMS or (system == "B3" and action in ("ACTIVE", "SUPP")):
        return "memory"
    if system == "B3" and action == "OPT_OUT":
        return "abstention"
    return "no memory"


def gold_verdicts(embedder, results_dir, data_dir=None) -> pd.DataFrame:
    """The gold set judged by every judge (``judge_gold``) with each answer's condition (with / without
    the memories in the prompt; a B3 answer's action is read from its run's records under
    ``results_dir/<run>/records.jsonl``). Columns: gid, run, dataset, qid, seed, system, split, condition,
    gold (bool), judge_<name> (bool). The analyses read the committed copy (``load_gold_verdicts``) so
    that they call no model; ``experiments/regenerate_report.py`` refreshes it."""
    from mdl_repro.pipeline import records as rec_io

    g = judge_gold(embedder, data_dir=data_dir)
    act: dict = {}
    for run in sorted(g["run"].unique()):
        p = Path(results_dir) / run / "records.jsonl"
        if p.is_file():
            for r in rec_io.load(p).values():
                if r.get("system") == "B3":
                    act[(run, r["dataset"], int(r["qid"]), int(r["seed"]))] = r.get("action")
    g["condition"] = [answer_condition(s, act.get((r, d, int(q), int(e))))
                      for s, r, d, q, e in zip(g["system"], g["run"], g["dataset"], g["qid"], g["seed"])]
    cols = ["gid", "run", "dataset", "qid", "seed", "system", "split", "condition", "gold"] + [
        f"judge_{n}" for n in JUDGES]
    return g[cols]


def load_gold_verdicts(path: str | Path = VERDICTS_PATH) -> pd.DataFrame | None:
    """The committed judged gold set (``gold_verdicts``), or None where it is not there."""
    p = Path(path)
    if not p.is_file():
        return None
    v = pd.read_json(p, lines=True, dtype={"qid": int, "seed": int})
    if "kind" not in v:  # the gold labellers' kind (correct / wrong / mixed / non_answer / refusal)
        v = v.merge(load_gold()[["gid", "kind"]], on="gid", how="left")
    return v
