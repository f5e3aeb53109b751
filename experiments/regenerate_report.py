"""Rebuild REPORT.md, analysis/ and tuned/ of an existing run folder from its records.jsonl and
run.json, without generating anything (the generation cache of a committed run is not committed, so a
`reproduce` rerun would regenerate every answer):

    python -m experiments.regenerate_report experiments/results/paper-scale-200x3-paired

It runs what `reproduce` runs after its records are complete: `mdl-jax analyze`, `mdl-jax tune` (runs
with ≥ 500 pooled records) and the report writer, with the run's own run.json (its calibrated configs
are kept; nothing is recalibrated).
"""

import json
import sys
import time
from pathlib import Path


def main(argv=None) -> int:
    from mdl_jax.signals.embeddings import Embedder
    from mdl_repro.analysis.analyze import analyze
    from mdl_repro.analysis.report import write_report
    from mdl_repro.cli.experiment import tune_step

    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1 or not (Path(args[0]) / "records.jsonl").is_file():
        print("usage: python -m experiments.regenerate_report RUN_DIR (a folder with records.jsonl)",
              file=sys.stderr)
        return 2
    out = Path(args[0])
    say = lambda m: print(m, file=sys.stderr)  # noqa: E731
    t0 = time.perf_counter()
    tuned = tune_step(out)  # first: the analyses score the tuned configs beside the other gates
    t1 = time.perf_counter()
    analyze(out / "records.jsonl", out / "analysis", progress=say)
    t2 = time.perf_counter()
    summary = json.loads((out / "run.json").read_text()) if (out / "run.json").is_file() else {}
    summary["report_rewritten"] = True
    write_report(out, summary, embedder=Embedder("all-MiniLM-L6-v2"),
                 analysis_md=(out / "analysis" / "ANALYSIS.md").read_text(), tuned_md=tuned)
    say(f"tune {t1 - t0:.0f} s, analyze {t2 - t1:.0f} s, report {time.perf_counter() - t2:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
