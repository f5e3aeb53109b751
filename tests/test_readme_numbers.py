"""The README's results section says only what the committed runs' files show: every number in it is
read from ``experiments/results/paper-scale-200x3-paired/analysis/analysis.json`` or the field
benchmarks' ``metrics.csv`` and must appear in the text as written (rounded as the README rounds it),
and the section holds no other number."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "experiments" / "results" / "paper-scale-200x3-paired"
FIELD = ROOT / "experiments" / "results" / "field-benchmarks" / "metrics.csv"


def _section() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    a = text.index("## Results\n")
    b = text.index("\n## ", a + 3)
    return text[a:b].replace("−", "-")  # the README prints minus signs


def _field(dataset: str, metric: str, gate: str = "MDL (paper defaults)") -> dict:
    with open(FIELD, newline="", encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if (r["dataset"], r["gate"], r["metric"]) == (dataset, gate, metric)]
    assert len(rows) == 1, (dataset, gate, metric)
    return {k: float(rows[0][k]) for k in ("value", "lo", "hi")}


def _field_expected() -> dict[str, str]:
    def shown(r):
        return f"{r['value']:.3f} [{r['lo']:.3f}, {r['hi']:.3f}]"

    return {
        "ConflictQA decision accuracy": shown(_field("conflictqa_strategyqa", "decision accuracy")),
        "RGB AUROC": shown(_field("rgb_en_fact", "AUROC")),
        "RGB AUROC, a question's sets of one size": shown(_field("rgb_en_fact_equal", "AUROC")),
        "ConflictNQ AUROC": shown(_field("conflictnq", "AUROC")),
    }


def _expected() -> dict[str, str]:
    a = json.loads((RUN / "analysis" / "analysis.json").read_text())
    h, rig = a["headline"], a["rigour"]["by_judge"]
    tq, he = h["b3_minus_b2"]["truthfulqa"], h["b3_minus_b2"]["halueval"]
    rnd = rig["paper"]["b3_vs_random"]["truthfulqa"]
    val = rig["paper"]["validity"]

    def interval(lo, hi):
        return f"[{lo:.3f}, {hi:.3f}]".replace("[0", "[+0").replace(", 0", ", +0")

    pc, rc = h["by_judge"]["paper"], h["by_judge"]["ref"]
    prim = {(r["name"], r["judge"]): r for r in h["primary"]}
    tq_holm = prim[("truthfulqa: B3 - B2", "paper")]["p_holm"]
    return {
        "TruthfulQA B3 - B2 Holm": "Holm-adjusted p < 0.001" if tq_holm < 0.001 else f"Holm-adjusted p = {tq_holm:.3f}",
        "ref MDL - constant Holm": f"(p = {prim[('pooled: MDL - per-dataset constant', 'ref')]['p_holm']:.3f})",
        "TruthfulQA B3 - B2": f"{tq['diff']:.3f} {interval(tq['ci_lo'], tq['ci_hi'])}",
        "TruthfulQA MDE": f"{100 * tq['mde']:.1f} pp",
        "B3 - random abstention": f"{rnd['diff']:+.3f} {interval(*rnd['ci'])}",
        "B3 - random abstention MDE": f"not resolvable (minimum detectable {100 * rnd['mde']:.1f} pp)",
        "HaluEval B3 - B2": f"{he['diff']:+.3f} {interval(he['ci_lo'], he['ci_hi'])}",
        "HaluEval MDE": f"{100 * he['mde']:.1f} pp",
        "power for the paper's effects": (f"{round(100 * min(tq['power_paper'], he['power_paper']))}–"
                                          f"{round(100 * max(tq['power_paper'], he['power_paper']))}%"),
        "ref MDL - constant": f"`ref` {rc['mdl_minus_constant']:.3f} {interval(*rc['mdl_minus_constant_ci'])}",
        "paper MDL - constant": f"`paper` {pc['mdl_minus_constant']:.3f} {interval(*pc['mdl_minus_constant_ci'])}",
        "paper MDL - constant MDE": f"minimum detectable {100 * pc['mdl_minus_constant_mde']:.1f} pp",
        "reader accuracy TruthfulQA": f"{round(100 * val['truthfulqa']['reader_accuracy_no_memory'])}% (TruthfulQA)",
        "reader accuracy HaluEval": f"{round(100 * val['halueval']['reader_accuracy_no_memory'])}% (HaluEval)",
        "gold answers behind the reader accuracy": (f"({val['truthfulqa']['reader_accuracy_n_gold']} and "
                                                    f"{val['halueval']['reader_accuracy_n_gold']} gold answers)"),
        "judge agreement without memory": f"only {val['truthfulqa']['agreement']['no memory']:.2f}",
    }


def test_every_number_in_the_readme_results_is_the_committed_runs():
    text = " ".join(_section().split())
    missing = {k: v for k, v in {**_expected(), **_field_expected()}.items() if v not in text}
    assert not missing, f"README's results do not match analysis.json and the field's metrics.csv: {missing}"


def test_the_readme_field_results_say_what_their_intervals_carry():
    """"adopts most memory sets that have passages": MDL withholds under half of every such data set's
    sets; "ranks ... only weakly": RGB's AUROC interval lies above 0.5 but below 0.7; "fabricated
    passages above the real one": ConflictNQ's AUROC interval lies below 0.5."""
    text = " ".join(_section().split())
    assert "adopts most memory sets that have passages" in text
    for d in ("rgb_en_fact", "ramdocs", "conflictqa_strategyqa", "conflictnq", "poisonedrag_adv", "nomiracl_en",
              "retrievalqa_gpt4"):
        assert _field(d, "withheld")["value"] < 0.5, d
    rgb, nq = _field("rgb_en_fact", "AUROC"), _field("conflictnq", "AUROC")
    assert "only weakly" in text and 0.5 < rgb["lo"] and rgb["hi"] < 0.7
    equal = _field("rgb_en_fact_equal", "AUROC")
    assert 0.5 < equal["lo"] and equal["hi"] < 0.7
    assert "fabricated passages above the real one" in text and nq["hi"] < 0.5


def test_the_readme_results_claim_no_direction_the_run_cannot_resolve():
    a = json.loads((RUN / "analysis" / "analysis.json").read_text())
    he = a["headline"]["b3_minus_b2"]["halueval"]
    assert he["verdict"].startswith("not resolvable")
    text = " ".join(_section().split())
    assert "no B3 - B2 difference is resolvable" in text and "not testable" in text
    assert not a["headline"]["by_judge"]["paper"]["testable"]["truthfulqa"]
    # each direction the section states is one whose interval excludes 0, and the MDL - constant
    # intervals it quotes are read as the primary family reads them
    prim = {(r["name"], r["judge"]): r for r in a["headline"]["primary"]}
    assert prim[("truthfulqa: B3 - B2", "paper")]["rejected"]
    for j in ("paper", "ref"):
        r = prim[("pooled: MDL - per-dataset constant", j)]
        assert not r["rejected"] and "below each dataset's majority rule" not in text
    for c in _claims(_section()):
        if DIRECTION.search(c) or re.search(r"\bless than\b", c):
            ivs = [(float(x), float(y)) for x, y in INTERVAL.findall(c)]
            assert any(lo > 0 or hi < 0 for lo, hi in ivs), c
    # no number in the section that the expected table does not account for (besides the design's n)
    allowed = {"200", "3", "2", "135", "4", "5", "8", "6", "0", "0.001", "3.1"}   # (3.1: Llama-3.1-8B)
    numbers = set(re.findall(r"\d+(?:\.\d+)?", text))
    known = set(re.findall(r"\d+(?:\.\d+)?", " ".join([*_expected().values(), *_field_expected().values()])))
    stray = numbers - known - allowed
    assert not stray, f"numbers in the README's results that no committed file gives: {sorted(stray)}"


# ------------------------------------------------------------------ docs/results.md

DOC = ROOT / "docs" / "results.md"
RUNS = ("paper-scale-200x3-paired", "paired-30x2", "paper-scale-200x3", "tqa-halu-100x2", "rq1-qwen1.5b",
        "rq1-smollm2")
# a word that states a direction; where one is used the sentence must carry an interval that excludes 0
DIRECTION = re.compile(r"\b(higher|lower|lowers|below|above|beats?|exceeds?|outperforms?|worse|better)\b"
                       r"|hallucinates (more|less)", re.I)
INTERVAL = re.compile(r"\[([+-]?\d+\.\d+), ([+-]?\d+\.\d+)\]")


def _doc() -> str:
    return DOC.read_text(encoding="utf-8").replace("−", "-")


def _json_intervals() -> set[tuple[float, float]]:
    """Every interval any committed run's analysis.json holds: [lo, hi] lists, {ci_lo, ci_hi} and
    {lo, hi} pairs, rounded as the page prints them (3 decimals)."""
    out: set = set()

    def walk(x):
        if isinstance(x, dict):
            for a, b in (("ci_lo", "ci_hi"), ("lo", "hi")):
                if isinstance(x.get(a), (int, float)) and isinstance(x.get(b), (int, float)):
                    out.add((round(x[a], 3), round(x[b], 3)))
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            if len(x) == 2 and all(isinstance(v, (int, float)) for v in x):
                out.add((round(x[0], 3), round(x[1], 3)))
            for v in x:
                walk(v)

    for run in RUNS:
        walk(json.loads((ROOT / "experiments" / "results" / run / "analysis" / "analysis.json").read_text()))
    return out


def _claims(text: str) -> list[str]:
    """The page's sentences, table rows and list items, one string each (code spans dropped)."""
    text = re.sub(r"`[^`]*`", "`…`", text)
    parts: list[str] = []
    for block in re.split(r"\n\s*\n", text):
        if block.lstrip().startswith("|"):
            parts += block.splitlines()
            continue
        for item in re.split(r"\n(?=- )", block):
            parts += re.split(r"(?<=[.!?])\s+(?=[A-Z*(])", " ".join(item.split()))
    return [p for p in parts if p.strip()]


def test_every_interval_in_the_results_page_is_a_committed_runs():
    have = _json_intervals()
    missing = []
    for lo, hi in INTERVAL.findall(_doc()):
        lo, hi = float(lo), float(hi)
        if not any(abs(lo - a) <= 5e-4 + 1e-9 and abs(hi - b) <= 5e-4 + 1e-9 for a, b in have):
            missing.append(f"[{lo}, {hi}]")
    assert not missing, f"intervals in docs/results.md that no committed analysis.json holds: {missing}"


def test_every_direction_in_the_results_page_has_a_resolved_interval():
    bad = []
    for c in _claims(_doc()):
        if DIRECTION.search(c):
            ivs = [(float(a), float(b)) for a, b in INTERVAL.findall(c)]
            if not any(lo > 0 or hi < 0 for lo, hi in ivs):
                bad.append(c[:160])
    assert not bad, "direction words without an interval that excludes 0:\n" + "\n".join(bad)


def test_the_results_page_drops_the_claims_its_intervals_do_not_carry():
    text = " ".join(_doc().split())
    for phrase in ("so even the sign depends on the judge", "MDL 18 µs", "similarity max 7-20 µs",
                   "beats B3", "hallucinates more", "falls below it on HaluEval"):
        assert phrase not in text, phrase
    # Table 10 is read against the within-dataset null, as REPORT reads it
    a = json.loads((RUN / "analysis" / "analysis.json").read_text())
    for j in ("paper", "ref"):
        t = a["by_judge"][j]["table10"]["rows"]["M+R+A"]
        assert f"p = {t['p_within']:.2f}" in text, (j, t["p_within"])
    # the gates' cost per decision as the run's gates table measured it
    gates_md = (RUN / "analysis" / "gates.md").read_text()
    for gate in ("MDL calibrated (run config)", "similarity (best cosine)"):
        lat = re.search(rf"^\| truthfulqa \| {re.escape(gate)} \|.*\| (\d+ µs) \|$", gates_md, re.M)
        assert lat and f"{gate.split(' (')[0]} {lat.group(1)}" in text, (gate, lat and lat.group(1))
