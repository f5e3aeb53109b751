"""``mdl-jax score-gates RUN_DIR``: the teacher-forced scores the practitioners' gates read
(``pipeline/gate_scores.py`` does the work, ``analysis/gates.py`` reads the file)."""

from __future__ import annotations

import sys
from pathlib import Path


def register(sub) -> None:
    """Add ``score-gates`` to the ``mdl-jax`` subcommands."""
    p = sub.add_parser("score-gates", help="score a run's B1 answers (teacher-forced log-probs), "
                                            "self-evaluation and best memory cosine for the "
                                            "practitioners' gates -> RUN_DIR/gate_scores.jsonl (resumable)")
    p.add_argument("run_dir", help="a reproduce run's folder (records.jsonl, run.json)")
    p.add_argument("--data-dir", default=None, help="dataset files (default: the run's, else ../shared/data)")
    p.add_argument("--cache-dir", default=None, help="embedding cache")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--limit", type=int, default=None, help="score at most this many new answers")
    p.set_defaults(func=score_cmd)


def score_cmd(args) -> int:
    from mdl_repro.analysis.oracle import RecordsError
    from mdl_repro.pipeline.gate_scores import SCORES_FILE, score_run

    if args.batch_size < 1:
        print(f"mdl-jax: error: --batch-size: expected an int ≥ 1, got {args.batch_size}", file=sys.stderr)
        return 2
    if not (Path(args.run_dir) / "records.jsonl").is_file():
        print(f"mdl-jax: error: run_dir: {args.run_dir} has no records.jsonl", file=sys.stderr)
        return 2
    try:
        res = score_run(args.run_dir, data_dir=args.data_dir, cache_dir=args.cache_dir,
                        batch_size=args.batch_size, limit=args.limit)
    except RecordsError as e:
        print(f"mdl-jax: error: {e}", file=sys.stderr)
        return 2
    print(f"scored {res['answers']} answers and {res['questions']} questions in {res['seconds']:.0f} s -> "
          f"{Path(args.run_dir) / SCORES_FILE}", file=sys.stderr)
    return 0
