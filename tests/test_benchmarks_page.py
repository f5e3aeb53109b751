"""The docs page "MDL on the field's benchmarks" says only what the committed run's files show: its summary
is the run's own (rebuilt from metrics.csv), and every number in its verdict is one of the run's numbers."""

from __future__ import annotations

import csv
import re
from pathlib import Path

from mdl_jax.evaluation.run import summary_markdown

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "experiments" / "results" / "field-benchmarks"
PAGE = ROOT / "docs" / "benchmarks-field.md"


def _rows(name: str) -> list[dict]:
    with open(RUN / name, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_the_pages_summary_is_the_committed_runs():
    text = PAGE.read_text(encoding="utf-8")
    block = text.split("<!-- summary:start -->\n", 1)[1].split("<!-- summary:end -->", 1)[0]
    assert block.strip() == summary_markdown(_rows("metrics.csv")).strip()
    report = (RUN / "REPORT.md").read_text(encoding="utf-8")
    assert summary_markdown(_rows("metrics.csv")).strip() in report


def test_every_number_in_the_verdict_is_one_of_the_runs():
    verdict = PAGE.read_text(encoding="utf-8").split("## Verdict", 1)[1].split("\n## ", 1)[0]
    verdict = verdict.replace("−", "-")
    values: set[str] = set()
    for row in _rows("metrics.csv"):
        for k in ("value", "lo", "hi"):
            if row.get(k) not in (None, "", "nan"):
                x = float(row[k])
                values |= {f"{x:.3f}", f"{-x:.3f}", f"{100 * x:.1f}%"}
    for row in _rows("conditions.csv"):
        for k, v in row.items():
            if k not in ("dataset", "condition", "n") and v not in ("", "None"):
                values |= {f"{float(v):.3f}", f"{100 * float(v):.1f}%"}
        values.add(row["n"])
    found = re.findall(r"-?\d+\.\d+%?|\b\d+\b(?= evaluated)", verdict)
    assert len(found) > 20
    missing = [x for x in found if x not in values and x.lstrip("-") not in values]
    assert not missing, f"numbers in the verdict that the committed run does not hold: {missing}"


def test_the_verdict_states_no_direction_between_unpaired_overlapping_intervals():
    verdict = PAGE.read_text(encoding="utf-8").split("## Verdict", 1)[1].split("\n## ", 1)[0]
    assert " below the " not in verdict and " beats " not in verdict


def test_every_interval_in_the_verdict_is_one_row_of_the_run():
    verdict = PAGE.read_text(encoding="utf-8").split("## Verdict", 1)[1].split("\n## ", 1)[0].replace("−", "-")
    rows = [r for r in _rows("metrics.csv") if r["lo"] not in ("", "nan")]
    triples = {tuple(f"{float(r[k]):.3f}" for k in ("value", "lo", "hi")) for r in rows}
    triples |= {tuple(f"{-float(r[k]):.3f}" for k in ("value", "hi", "lo")) for r in rows}
    found = re.findall(r"(-?\d\.\d{3})\s+\[(-?\d\.\d{3}),\s+(-?\d\.\d{3})\]", verdict)
    assert len(found) >= 10
    assert not [t for t in found if t not in triples], [t for t in found if t not in triples]


def test_a_users_gate_stands_in_the_summary_beside_mdl():
    """A run made for a user's own gate (``--gate-scores``, ``extra``) shows it in the summary tables, before
    the oracle, not only in each data set's section."""
    rows = [r for r in _rows("metrics.csv") if r["dataset"] == "rgb_en_fact"]
    mine = [{**r, "gate": "my gate", "value": "0.123456"} for r in rows if r["gate"] == "MDL (paper defaults)"
            and r["metric"] in ("decision accuracy", "AUROC")]
    text = summary_markdown(rows + mine)
    heads = [line for line in text.splitlines() if line.startswith("| data set |")]
    assert heads[0].endswith("| MDL tuned | my gate | oracle |") and heads[1].endswith("| my gate | oracle |")
    assert text.count("0.123 [") == 2


def test_the_size_cue_the_page_states_is_the_loaders():
    """Each figure of "A cue in the sets' sizes", recomputed from the data: the AUROC of "fewer memories"
    against "do not adopt" over each data set's labelled sets, and RGB's set sizes by condition."""
    import numpy as np

    from mdl_jax.evaluation.datasets import load_benchmark
    from mdl_jax.evaluation.metrics import auroc

    text = " ".join(PAGE.read_text(encoding="utf-8").split("## A cue in the sets' sizes", 1)[1]
                    .split("\n## ", 1)[0].split())
    for name, words in (("rgb_en_fact", "AUROC {a} over its {n} labelled sets"), ("ramdocs", "give {a} over its {n}"),
                        ("conflictnq", "({a} over {n}:")):
        items = [it for it in load_benchmark(name) if it.should_adopt is not None and it.memories]
        a = auroc(-np.array([len(it.memories) for it in items], float), [not it.should_adopt for it in items])
        assert words.format(a=f"{a:.3f}", n=len(items)) in text, (name, a, len(items))
    rgb = load_benchmark("rgb_en_fact")
    noise = [len(it.memories) for it in rgb if it.condition == "noise"]
    rest = [len(it.memories) for it in rgb if it.condition != "noise"]
    assert f"noise-only sets hold {min(noise)}–{max(noise)} memories" in text
    assert f"other three sets {min(rest)}–{max(rest)}" in text
    # and the report's own rows it quotes: the memory count's and MDL's AUROC on RGB's evaluated sets
    by = {(r["dataset"], r["gate"], r["metric"]): r for r in _rows("metrics.csv")}
    for gate in ("memory count", "MDL (paper defaults)"):
        r = by[("rgb_en_fact", gate, "AUROC")]
        assert "{:.3f} [{:.3f}, {:.3f}]".format(*(float(r[k]) for k in ("value", "lo", "hi"))) in text, gate
    # RGB read with equal sizes: the count ranks nothing, and the report's rows the page quotes
    equal = [it for it in load_benchmark("rgb_en_fact_equal") if it.should_adopt is not None and it.memories]
    a = auroc(-np.array([len(it.memories) for it in equal], float), [not it.should_adopt for it in equal])
    assert f"The count then ranks nothing (AUROC {a:.3f} over its {len(equal)} labelled sets)" in text
    # what else the equal reading changes: the signal snippets' share in the true and swapped sets
    share = {}
    for name in ("rgb_en_fact", "rgb_en_fact_equal"):
        kinds = [it.meta["memory_kinds"] for it in load_benchmark(name) if it.condition in ("true", "swapped")]
        share[name] = sum(k != "noise" for ks in kinds for k in ks) / sum(map(len, kinds))
        no_noise = sum("noise" not in ks for ks in kinds)
    assert f"rises from {share['rgb_en_fact']:.2f} to {share['rgb_en_fact_equal']:.2f}, and {no_noise} of those " \
           f"{len(kinds)} sets hold no noise snippet" in text
    assert by[("rgb_en_fact_equal", "MDL (paper defaults)", "AUROC")]["n_groups"] == \
        by[("rgb_en_fact", "MDL (paper defaults)", "AUROC")]["n_groups"] == "77"
    for gate in ("memory count", "MDL (paper defaults)", "R alone", "similarity (top-1)"):
        r = by[("rgb_en_fact_equal", gate, "AUROC")]
        assert "{:.3f} [{:.3f}, {:.3f}]".format(*(float(r[k]) for k in ("value", "lo", "hi"))) in text, gate
