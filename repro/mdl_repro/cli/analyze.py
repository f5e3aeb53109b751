"""``mdl-jax analyze``: every RQ1-RQ4 analysis of a run."""

from __future__ import annotations

import sys
from pathlib import Path

from mdl_jax.cli.args import DefaultsHelpFormatter, config_file, existing_dir, out_dir

ANALYZE_COST = ("about 15 seconds on an idle 2-core CPU for the 4,560 records of a paper-scale run (3,600 "
                "pooled B1/B2/B3), more under load (the sweeps and XGBoost dominate); --latency adds "
                "loading MiniLM and SmolLM2")


def register(sub) -> None:
    """Add ``analyze`` to the ``mdl-jax`` subcommands."""
    p = sub.add_parser("analyze", help="RQ1-RQ4 analyses of a records file: coverage / selective risk, the "
                                        "practitioners' gates, Tables 6-8, 10, Figures 4-6, statistics, "
                                        "ANALYSIS.md",
                       description="Run every RQ1-RQ4 analysis of a reproduce run's records (coverage, selective "
                                   "risk, AURC, the B3 - B2 decomposition, the practitioners' gates, oracle labels, "
                                   "Tables 6, 7, 8, 10, Figures 4-6, the sweeps, question-level statistics) "
                                   "and write the tables, figures, analysis.json and ANALYSIS.md. No LLM is "
                                   f"called. A bare run takes {ANALYZE_COST}.",
                       formatter_class=DefaultsHelpFormatter)
    p.add_argument("records", help="records.jsonl of a reproduce run (run.json beside it is used)")
    p.add_argument("--out", default=None, type=out_dir,
                   help="output folder (None: analysis/ beside RECORDS)")
    p.add_argument("--latency", action="store_true",
                   help="also time signal aggregation, one MiniLM embedding and one SmolLM2 call (loads models)")
    p.add_argument("--data-dir", default=None, type=existing_dir,
                   help="dataset files (case-study questions, --latency stores)")
    p.add_argument("--cache-dir", default=None, type=out_dir, help="embedding cache (--latency)")
    p.add_argument("--config", default=None, metavar="FILE", type=config_file,
                   help="score every record with this config file (mdl_jax.save_config, e.g. from mdl-jax "
                        "tune) instead of the run's calibrated per-dataset configs")
    p.set_defaults(func=analyze_cmd)


def analyze_cmd(args) -> int:
    """``mdl-jax analyze``: bad records raise ``RecordsError``, which the CLI prints as one line (exit 2)."""
    from mdl_repro.analysis.analyze import analyze

    latency = None
    if args.latency:
        import functools

        from mdl_repro.pipeline.stage_latency import pipeline_stages

        latency = functools.partial(pipeline_stages, data_dir=args.data_dir, cache_dir=args.cache_dir)
    res = analyze(args.records, args.out, latency=latency, data_dir=args.data_dir,
                  cache_dir=args.cache_dir, progress=lambda m: print(m, file=sys.stderr),
                  config=args.config)
    out = Path(args.out) if args.out else Path(args.records).parent / "analysis"
    print(f"wrote {out / 'ANALYSIS.md'} ({res['wall_s']['analyses']:.1f} s analyses, "
          f"{res['wall_s']['total']:.1f} s total)", file=sys.stderr)
    return 0
