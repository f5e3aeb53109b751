"""``mdl-jax benchmarks``: MDL and the gates it is compared with on the field's benchmarks.

    mdl-jax benchmarks --out runs/bench                     # every data set (../shared/data/benchmarks)
    mdl-jax benchmarks rgb_en_fact ramdocs --limit 50 --out runs/smoke
    mdl-jax benchmarks rgb_en_fact --gate-scores mine.csv --out runs/mine   # a user's own gate beside MDL

Writes REPORT.md, metrics.csv, conditions.csv, risk–coverage figures and the signals of each data set
(``mdl_jax.evaluation.run``). A rerun into the same folder continues its run: one whose inputs changed
(--limit, --config, the embedder, --n-boot, --no-fit, a data set's items or --gate-scores) is refused,
naming what changed; with the same inputs it reuses the signals (an interrupted run resumes) and reports
every data set of the run, those named before and those named now. ``--gate-scores`` takes a CSV with a ``qid`` column (the memory sets'
ids, ``BenchmarkItem.qid`` of ``load_benchmark``'s items) and one column of scores per gate (higher = do not adopt),
with a row for every memory set of each reader-free data set named.
"""

from __future__ import annotations

import argparse
import csv
import math
import re
import sys

from mdl_jax.cli.args import (
    CommandError,
    DefaultsHelpFormatter,
    config_file,
    existing_dir,
    existing_file,
    out_dir,
    positive_int,
    write_stdout,
)


def _scores(path: str) -> dict[str, dict[str, float]]:
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:  # a spreadsheet's BOM is not a column name
            reader = csv.reader(f)
            rows = list(reader)
    except UnicodeDecodeError as e:
        raise CommandError(f"--gate-scores {path}: not UTF-8 text (byte {e.start})") from None
    except csv.Error as e:   # a field over the csv module's limit (128 KiB): no id or score is that long
        raise CommandError(f"--gate-scores {path}, line {reader.line_num}: not a CSV of ids and scores "
                           f"({e})") from None
    if not rows or "qid" not in rows[0]:
        raise CommandError(f"--gate-scores {path}: expected a CSV with a 'qid' column and one column per gate")
    head = rows[0]
    dup = sorted({c for c in head if head.count(c) > 1})
    if dup:
        raise CommandError(f"--gate-scores {path}: column(s) named twice: {dup}")
    q = head.index("qid")
    gates = [(j, c) for j, c in enumerate(head) if j != q]
    if not gates:
        raise CommandError(f"--gate-scores {path}: no score column beside 'qid'")
    out: dict[str, dict[str, float]] = {c: {} for _, c in gates}
    for i, r in enumerate(rows[1:], start=2):
        if len(r) != len(head):
            raise CommandError(f"--gate-scores {path}, line {i}: expected {len(head)} fields, got {len(r)}")
        if r[q] in out[gates[0][1]]:
            raise CommandError(f"--gate-scores {path}, line {i}: qid {r[q]!r} given twice")
        for j, g in gates:
            try:
                v = float(r[j])
            except ValueError:
                raise CommandError(f"--gate-scores {path}, line {i}: column {g!r}: expected a number, "
                                   f"got {r[j]!r}") from None
            if not math.isfinite(v):
                raise CommandError(f"--gate-scores {path}, line {i}: column {g!r}: expected a finite number")
            out[g][r[q]] = v
    return out


# run_benchmarks names the user's scores by its argument, ``extra`` (``extra['gate']``: one gate's): on the
# command line they are the --gate-scores file (a column of it), which the message names instead
_EXTRA = re.compile(r"\Aextra(?:\[('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")\])?(?=[:\[])")


def _as_flags(message: str, scores: str | None) -> str:
    m = _EXTRA.match(message) if scores else None
    if m is None:
        return message
    rest = message[m.end():]
    out = f"--gate-scores {scores}" + (f": column {m.group(1)}{rest}" if m.group(1) else rest)
    if m.group(1) and rest.startswith(": no score for "):   # (not a column whose own name says so)
        out += ("; give a row for every memory set of each data set named (their ids: [it.qid for it in "
                "load_benchmark(name, limit=...)]), or name only the data sets the file covers")
    return out


def register(sub) -> None:
    from mdl_jax.evaluation.run import ALL
    from mdl_jax.signals.embeddings import EMBED_BACKENDS
    p = sub.add_parser("benchmarks", help="MDL and the compared gates on the field's conflict, abstention and "
                                          "adaptive-retrieval benchmarks: tables, plots, REPORT.md",
                       description="Scores MDL, the gates it is compared with and an oracle on the same rows of "
                                   "each benchmark (no reader; AdaRAGUE with its recorded Llama-3.1-8B answers) "
                                   "and writes metrics.csv, figures and REPORT.md into --out. Cost of a bare run "
                                   "(all sets): one to a few minutes on a 2-core CPU with the embedding cache "
                                   "warm; about half an hour cold, embedding some 40,000 passages.",
                       formatter_class=DefaultsHelpFormatter)
    def name(v: str) -> str:
        # checked here, not by argparse's choices: with nargs="*" those also test the empty default
        if v not in ALL:
            raise argparse.ArgumentTypeError(f"expected one of {', '.join(ALL)}; got {v!r}")
        return v

    p.add_argument("names", nargs="*", metavar="NAME", type=name, help=f"data sets (default: all): {', '.join(ALL)}")
    p.add_argument("--out", type=out_dir, required=True, help="the run folder. A rerun into it resumes its run and adds the data sets it "
                        "names; one with another --limit, --config, --embed-backend, --n-boot, --no-fit, "
                        "--gate-scores or data is refused (use a fresh --out)")
    p.add_argument("--limit", type=positive_int, help="questions per data set, taken in turn from its splits (a smoke test; default: all)")
    p.add_argument("--data-dir", type=existing_dir, help="the benchmarks folder (default: the shared copy)")
    p.add_argument("--gate-scores", type=existing_file,
                   help="a CSV of your own gates' scores: a 'qid' column (each memory set's id, BenchmarkItem.qid) "
                        "and one column per gate, higher = do not adopt; a row for every memory set of the data "
                        "sets named")
    p.add_argument("--config", type=config_file, help="an MDL config file (default: the paper's defaults, MDLConfig())")
    p.add_argument("--no-fit", action="store_true", help="skip the calibrated, tuned and learned MDL rows")
    p.add_argument("--n-boot", type=positive_int, default=1000, help="bootstrap resamples per interval")
    p.add_argument("--embed-backend", default="auto", choices=EMBED_BACKENDS,
                   help="what runs the embedder (Embedder's backend)")
    p.set_defaults(func=run)


def run(args) -> int:
    from mdl_jax.evaluation.run import ALL, RunInUse, run_benchmarks
    from mdl_jax.gate.core import MemoryGate

    extra = _scores(args.gate_scores) if args.gate_scores else None
    try:
        gate = MemoryGate(risk=0.5, config=args.config, embed_backend=args.embed_backend)
        report = run_benchmarks(args.out, tuple(args.names) or ALL, gate=gate, limit=args.limit,
                                data_dir=args.data_dir, extra=extra, fit_mdl=not args.no_fit, n_boot=args.n_boot,
                                progress=sys.stderr.isatty(), log=lambda s: print(s, file=sys.stderr))
    except (ValueError, TypeError, RunInUse) as e:  # the documented argument errors of run_benchmarks and the gate
        if isinstance(e, UnicodeError):
            raise
        raise CommandError(_as_flags(str(e), args.gate_scores)) from None
    write_stdout(f"{report}\n")
    return 0
