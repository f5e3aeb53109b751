"""The README's results section says only what the committed run's files show: every number in it is
read from ``experiments/results/paper-scale-200x3-paired/analysis/analysis.json`` and must appear in
the text as written (rounded as the README rounds it), and the section holds no other number."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "experiments" / "results" / "paper-scale-200x3-paired"


def _section() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    a = text.index("## Results in three sentences")
    b = text.index("\n## ", a + 3)
    return text[a:b].replace("−", "-")  # the README prints minus signs


def _expected() -> dict[str, str]:
    a = json.loads((RUN / "analysis" / "analysis.json").read_text())
    h, rig = a["headline"], a["rigour"]["by_judge"]
    tq, he = h["b3_minus_b2"]["truthfulqa"], h["b3_minus_b2"]["halueval"]
    rnd = rig["paper"]["b3_vs_random"]["truthfulqa"]
    val = rig["paper"]["validity"]

    def interval(lo, hi):
        return f"[{lo:.3f}, {hi:.3f}]".replace("[0", "[+0").replace(", 0", ", +0")

    pc, rc = h["by_judge"]["paper"], h["by_judge"]["ref"]
    return {
        "TruthfulQA B3 - B2": f"{tq['diff']:.3f} {interval(tq['ci_lo'], tq['ci_hi'])}",
        "TruthfulQA MDE": f"{100 * tq['mde']:.1f} pp",
        "B3 - random abstention": f"{rnd['diff']:+.3f} {interval(*rnd['ci'])}",
        "HaluEval B3 - B2": f"{he['diff']:+.3f} {interval(he['ci_lo'], he['ci_hi'])}",
        "HaluEval MDE": f"{100 * he['mde']:.1f} pp",
        "power for the paper's effects": (f"{round(100 * min(tq['power_paper'], he['power_paper']))}–"
                                          f"{round(100 * max(tq['power_paper'], he['power_paper']))}%"),
        "ref MDL - constant": f"`ref` {rc['mdl_minus_constant']:.3f} {interval(*rc['mdl_minus_constant_ci'])}",
        "paper MDL - constant": f"`paper` {pc['mdl_minus_constant']:.3f} {interval(*pc['mdl_minus_constant_ci'])}",
        "reader accuracy TruthfulQA": f"{round(100 * val['truthfulqa']['reader_accuracy_no_memory'])}% (TruthfulQA)",
        "reader accuracy HaluEval": f"{round(100 * val['halueval']['reader_accuracy_no_memory'])}% (HaluEval)",
        "judge agreement without memory": f"only {val['truthfulqa']['agreement']['no memory']:.2f}",
    }


def test_every_number_in_the_readme_results_is_the_committed_runs():
    text = " ".join(_section().split())
    missing = {k: v for k, v in _expected().items() if v not in text}
    assert not missing, f"README's results do not match analysis.json: {missing}"


def test_the_readme_results_claim_no_direction_the_run_cannot_resolve():
    a = json.loads((RUN / "analysis" / "analysis.json").read_text())
    he = a["headline"]["b3_minus_b2"]["halueval"]
    assert he["verdict"].startswith("not resolvable")
    text = " ".join(_section().split())
    assert "no B3 - B2 difference is resolvable" in text and "not testable" in text
    assert not a["headline"]["by_judge"]["paper"]["testable"]["truthfulqa"]
    # no number in the section that the expected table does not account for (besides the design's n)
    allowed = {"200", "3", "2", "135", "4", "5", "8", "6"}
    numbers = set(re.findall(r"\d+(?:\.\d+)?", text))
    known = set(re.findall(r"\d+(?:\.\d+)?", " ".join(_expected().values())))
    stray = numbers - known - allowed
    assert not stray, f"numbers in the README's results that no committed file gives: {sorted(stray)}"
