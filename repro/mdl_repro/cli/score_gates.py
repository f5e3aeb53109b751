"""``mdl-jax score-gates RUN_DIR``: the teacher-forced scores the practitioners' gates read
(``pipeline/gate_scores.py`` does the work, ``analysis/gates.py`` reads the file)."""

from __future__ import annotations

import sys
from pathlib import Path

from mdl_jax.cli.args import DefaultsHelpFormatter, positive_int


def register(sub) -> None:
    """Add ``score-gates`` to the ``mdl-jax`` subcommands."""
    p = sub.add_parser("score-gates", help="score a run's B1 answers (teacher-forced log-probs), "
                                            "self-evaluation and best memory cosine for the "
                                            "practitioners' gates -> RUN_DIR/gate_scores.jsonl (resumable)",
                       description="Scores every B1 and calibration answer of a reproduce run for the gates "
                                   "`mdl-jax analyze` compares with MDL: teacher-forced log-probabilities (no new "
                                   "generation), self-evaluation by label likelihood and the best memory cosine. "
                                   "The run's model must be the bundled SmolLM2 (another model's run is refused). "
                                   "Cost: one teacher-forced forward pass of SmolLM2 per answer and one "
                                   "embedding per memory, no generation; resumable.",
                       formatter_class=DefaultsHelpFormatter)
    p.add_argument("run_dir", help="a reproduce run's folder (records.jsonl, run.json)")
    p.add_argument("--data-dir", default=None, help="dataset files (default: the run's, else ../shared/data)")
    p.add_argument("--cache-dir", default=None, help="embedding cache (default: $MDL_JAX_CACHE_DIR or the user cache)")
    p.add_argument("--batch-size", type=positive_int, default=32, help="answers per forward pass")
    p.add_argument("--limit", type=positive_int, default=None, help="score at most this many new answers (default: all)")
    p.set_defaults(func=score_cmd)


def score_cmd(args) -> int:
    from mdl_repro.analysis.oracle import RecordsError
    from mdl_repro.pipeline.gate_scores import SCORES_FILE, score_run

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
