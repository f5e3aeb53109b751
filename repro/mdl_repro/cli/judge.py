"""``mdl-jax judge``: the rule judges and an LLM judge over any records carrying (dataset, qid, answer)."""

from __future__ import annotations

from mdl_jax.cli.args import (
    CommandError,
    DefaultsHelpFormatter,
    existing_dir,
    existing_file,
    nonneg_int,
    out_dir,
    out_file,
    positive_float,
    positive_int,
    refuse_same_file,
)
from mdl_repro.pipeline.judgement import JUDGES, judge_records, read_answers

# Told before judging starts, so a long wait reads as work: the rule judges cost one MiniLM pass, the
# LLM judge's cost is the server's (the bundled SmolLM2 behind `python -m mdl_repro.serve` grades the
# 482 gold answers in minutes on a CPU).
JUDGE_COST = ("the rule judges cost one MiniLM pass over the answers and their references (cached), a "
              "few minutes on a CPU for a 3,600-record run; --judge llm costs one 1-token request per "
              "answer (cached by model and prompt) plus, unless --no-gold, the 482 gold answers once")


def register(sub) -> None:
    """Add ``judge`` to the ``mdl-jax`` subcommands."""
    p = sub.add_parser(
        "judge", help="judge any records carrying (dataset, qid, answer) with the rule judges or an LLM",
        description="Re-judge answers: reads JSON lines with dataset (truthfulqa|halueval), qid (index in "
                    "the dataset file) and answer (string, or null for a failed call), writes each record "
                    "back with judge_<name>_hallucinated (and _refusal, _rule for the rule judges " +
                    ", ".join(JUDGES) + "; _method, _p_yes, _error, _model for llm). --judge llm grades "
                    "each answer against the dataset's references through any OpenAI-compatible "
                    "chat-completions server (repro/mdl_repro/pipeline/judgement_llm.py) and reports its "
                    "agreement with the shipped gold set. Cost: " + JUDGE_COST + ".",
        formatter_class=DefaultsHelpFormatter)
    p.add_argument("input", metavar="IN.jsonl", type=existing_file,
                   help="records to judge (e.g. a run's records.jsonl, or the gold set)")
    p.add_argument("--out", default=None, type=out_file,
                   help="output JSON lines (None: IN with .judged.jsonl)")
    p.add_argument("--judge", nargs="+", default=list(JUDGES), choices=list(JUDGES) + ["llm"],
                   help="which judges grade the answers")
    p.add_argument("--base-url", default=None,
                   help="llm: the server's API root, e.g. http://127.0.0.1:8123/v1")
    p.add_argument("--model", default=None, help="llm: the served model's name (the judge's id)")
    # Not OPENAI_API_KEY by default: that key would go to whatever server --base-url names.
    p.add_argument("--api-key-env", default="MDL_JAX_JUDGE_API_KEY", metavar="VAR",
                   help="llm: environment variable holding the API key (unset: no key is sent); the key "
                        "is never logged or written")
    p.add_argument("--concurrency", type=positive_int, default=4, help="llm: requests in flight at once")
    p.add_argument("--retries", type=nonneg_int, default=3,
                   help="llm: retries of a call after a connection error, timeout, 429 or 5xx "
                        "(exponential backoff from 0.5 s)")
    p.add_argument("--timeout", type=positive_float, default=60.0, help="llm: seconds per request")
    p.add_argument("--no-gold", action="store_true",
                   help="llm: skip grading the shipped gold set (482 answers) for the agreement report")
    p.add_argument("--data-dir", default=None, type=existing_dir,
                   help="folder with TruthfulQA.csv and halueval_qa.jsonl (None: $MDL_JAX_DATA_DIR, "
                        "else ../shared/data beside the repo, else the hub)")
    p.add_argument("--cache-dir", default=None, type=out_dir,
                   help="embedding cache and the llm reply cache (None: $MDL_JAX_CACHE_DIR or "
                        "~/.cache/mdl_jax)")
    p.set_defaults(func=judge_cmd)


def _write_jsonl(path, rows) -> None:
    import json

    from mdl_jax._io import atomic_open

    with atomic_open(path, "w") as f:  # whole or not at all; never through a planted name
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def judge_cmd(args) -> int:
    import json
    import os
    import sys
    from pathlib import Path

    from mdl_jax._io import write_text

    src = Path(args.input)
    out = Path(args.out) if args.out else src.with_name(src.name.removesuffix(".jsonl") + ".judged.jsonl")
    refuse_same_file(str(out), **{"IN.jsonl": str(src)})
    llm = None
    if "llm" in args.judge:
        missing = [f for f, v in (("--base-url", args.base_url), ("--model", args.model)) if not v]
        if missing:
            raise CommandError(f"judge: --judge llm needs {' and '.join(missing)} (an OpenAI-compatible "
                               "server and the model it serves)")
        key = os.environ.get(args.api_key_env)
        if key is None and args.api_key_env != "MDL_JAX_JUDGE_API_KEY":
            raise CommandError(f"judge: --api-key-env: the environment variable {args.api_key_env} is "
                               "not set")
    recs = read_answers(src)  # before any model loads or server call: bad input fails fast
    embedder = None
    if any(j in JUDGES for j in args.judge):
        from mdl_jax.signals.embeddings import Embedder

        embedder = Embedder(cache_dir=args.cache_dir)
    if "llm" in args.judge:
        from mdl_jax._paths import default_cache_dir
        from mdl_repro.pipeline.judgement_llm import LLMJudge

        try:
            llm = LLMJudge(args.base_url, args.model, api_key=key, concurrency=args.concurrency,
                           retries=args.retries, timeout=args.timeout,
                           cache=Path(args.cache_dir or default_cache_dir()) / "llm_judge.sqlite")
        except ValueError as e:
            raise CommandError(f"judge: {e}") from None
    try:
        judged = judge_records(recs, embedder, args.data_dir, path=str(src), judges=args.judge, llm=llm)
        _write_jsonl(out, judged)
        print(f"judged {len(judged)} records with {', '.join(args.judge)} → {out}", file=sys.stderr)
        names = [j for j in args.judge]
        for ds in sorted({r["dataset"] for r in judged}):
            rows = [r for r in judged if r["dataset"] == ds]
            rates = []
            for name in names:
                v = [r[f"judge_{name}_hallucinated"] for r in rows if r[f"judge_{name}_hallucinated"] is not None]
                rates.append(f"{name} {sum(v) / len(v):.3f}" if v else f"{name} n/a")
            print(f"  {ds}: {len(rows)} records; hallucination rate " + ", ".join(rates), file=sys.stderr)
        if llm is None:
            return 0
        from mdl_repro.analysis.judges import GOLD_PATH, llm_summary, llm_summary_markdown

        gold_rows = [r for r in judged if r.get("label") in ("hallucinated", "safe")]
        if not gold_rows and not args.no_gold:
            print("llm judge: grading the shipped gold set for its agreement (cached per model)",
                  file=sys.stderr)
            gold_rows = judge_records(read_answers(GOLD_PATH), None, args.data_dir, path=str(GOLD_PATH),
                                      judges=("llm",), llm=llm)
        summary = llm_summary(judged, gold_rows, model=args.model, server=llm.where,
                              calls=llm.calls, cache_hits=llm.cache_hits)
        side = out.with_name(out.name.removesuffix(".jsonl") + ".llm-judge.json")
        write_text(side, json.dumps(summary, indent=1))
        print(llm_summary_markdown(summary), file=sys.stderr)
        print(f"wrote {side} (REPORT.md of the run in that folder shows it when rewritten)",
              file=sys.stderr)
        n_failed = sum(r["judge_llm_method"] == "failed" for r in judged)
        if n_failed:
            first = next(r["judge_llm_error"] for r in judged if r["judge_llm_method"] == "failed")
            print(f"mdl-jax: error: judge: {n_failed} of {len(judged)} LLM verdicts failed (first: "
                  f"{first}); they are recorded as failed with their reason; rerun to retry them "
                  "(answered ones come from the cache)", file=sys.stderr)
            return 3
        return 0
    finally:
        if llm is not None:
            llm.close()
