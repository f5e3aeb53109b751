"""``mdl-jax gate``: the memory gate over a file or a dataset (``gate/files.py`` does the work)."""

from __future__ import annotations

import argparse
import sys

from mdl_jax.cli.args import DefaultsHelpFormatter
from mdl_jax.gate import files
from mdl_jax.signals.embeddings import EMBED_BACKENDS


def job_from_args(args: argparse.Namespace) -> files.GateJob:
    """The ``GateJob`` the parsed flags describe (checked as it is made: GateInputError naming the flag)."""
    return files.GateJob(
        input=args.input, out=args.out, query_field=args.query_field, memories_field=args.memories_field,
        risk_field=args.risk_field, category_field=args.category_field, risk=args.risk, config=args.config,
        embedder=args.embedder, embed_backend=args.embed_backend, cache_dir=args.cache_dir, split=args.split,
        chunk_size=args.chunk_size, on_bad_row=args.on_bad_row, restart=args.restart,
        no_progress=args.no_progress)


def gate_cmd(args: argparse.Namespace) -> int:
    try:
        return files.run(job_from_args(args))
    except files.GateInputError as e:
        print(f"mdl-jax: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2


def register(sub) -> None:
    p = sub.add_parser("gate", help="the memory gate over a JSONL / Parquet / CSV file or a Hugging "
                                    "Face dataset: decision columns beside the input's",
                       description=files.__doc__.split("\n\n")[0] + f" Cost: {files.COST}.",
                       formatter_class=DefaultsHelpFormatter)
    p.add_argument("input", metavar="IN", help="a .jsonl / .parquet / .csv file, a dataset folder, "
                                               "or a Hugging Face dataset name")
    p.add_argument("--out", required=True, help="OUT.parquet or OUT.jsonl")
    p.add_argument("--query-field", default="query", help="the field holding the query")
    p.add_argument("--memories-field", default="memories",
                   help="the field holding the memories: a list of texts or of objects with 'text'")
    p.add_argument("--risk-field", default=None, help="a field holding A in [0, 1] (overrides --risk)")
    p.add_argument("--category-field", default=None,
                   help="a field holding the category, for a category table (--risk truthfulqa / JSON)")
    p.add_argument("--risk", default="0.5", help="A for every row: a number in [0, 1], 'truthfulqa', "
                                                 "'halueval', or a JSON file {category: risk}")
    p.add_argument("--config", default=None, help="an MDL config file (save_config); unset: the paper's defaults, MDLConfig()")
    p.add_argument("--embedder", default="all-MiniLM-L6-v2",
                   help="a sentence-transformers name or path, or module:function (texts -> (N, d))")
    p.add_argument("--embed-backend", default="auto",
                   choices=EMBED_BACKENDS,
                   help="what runs a named embedder: auto = OpenVINO bfloat16 on a CPU with AMX or "
                        "AVX512-BF16 (within the parity), else ONNX Runtime float32 (torch's vectors to float32 "
                        "rounding), where installed (the signals extra; their speeds: docs/benchmarks.md); "
                        "else torch")
    p.add_argument("--cache-dir", default=None, help="embedding cache (unset: $MDL_JAX_CACHE_DIR or "
                                                     "~/.cache/mdl_jax)")
    p.add_argument("--split", default="train", help="the split of a Hugging Face dataset")
    p.add_argument("--chunk-size", type=int, default=None,
                   help=f"rows per part (decided in one batch); default {files.CHUNK_SIZE:,}, or, resuming "
                        "an unfinished run, the size its parts were cut at")
    p.add_argument("--on-bad-row", choices=("error", "skip"), default="error",
                   help="a bad row stops the run (exit 2) or is skipped and counted")
    p.add_argument("--restart", action="store_true",
                   help="remove an unfinished run of OUT and start over (a run resumes only onto the input, "
                        "arguments, config, risk table and embedder it began with; else it stops, saying which "
                        "changed)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=gate_cmd)
