"""``mdl-jax sweep``: a config grid over the records of a Parquet file, streamed (``sweep_parquet``).

    mdl-jax sweep records.parquet --grid g_a=0:1:21 --grid g_b=0:1:21 --bootstrap 10 --out grid.csv

One CSV row per config: the grid's values, then (without --bootstrap) accuracy (when the file has
labels), the share of each action and the mean C_final; with --bootstrap W, each of those is the mean
over the W Poisson resamples (so ``accuracy`` is the resamples' mean, close to but not the file's own
accuracy), and a 95% percentile interval of the accuracy follows it; ``--column group=QID`` draws whole
questions (records of one id together), not records one by one. Memory is one pass of records,
whatever the file's size.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from mdl_jax.cli.args import (
    CommandError,
    DefaultsHelpFormatter,
    config_file,
    existing_file,
    nonneg_int,
    out_file,
    positive_int,
    refuse_same_file,
    seed_int,
    write_stdout,
)

# The most configs one command sweeps: 10^7 configs' leaves alone are ~1.8 GB on the host (a typo
# such as 0:1:100000 twice asked for 10^10, a 74.5 GiB allocation and a MemoryError traceback).
# Larger grids: split them over several commands, or call ``sweep_parquet`` from Python.
MAX_CONFIGS = 10 ** 7


def grid_axis(text: str) -> tuple[str, list[float]]:
    """``FIELD=V1,V2,...`` or ``FIELD=START:STOP:COUNT`` (COUNT evenly spaced values, both ends)."""
    name, sep, values = text.partition("=")
    if not sep or not name.strip() or not values.strip():
        raise argparse.ArgumentTypeError(f"expected FIELD=V1,V2,... or FIELD=START:STOP:COUNT, got {text!r}")
    try:
        if ":" in values:
            a, b, n = values.split(":")
            if int(n) < 1:
                raise ValueError
            if int(n) > MAX_CONFIGS:   # np.linspace would allocate it before any other check
                raise argparse.ArgumentTypeError(f"COUNT {int(n):,} in {text!r} is over the command's "
                                                 f"{MAX_CONFIGS:,} configs")
            vals = np.linspace(float(a), float(b), int(n)).tolist()
        else:
            vals = [float(v) for v in values.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers in {text!r} (FIELD=V1,V2,... or "
                                         "FIELD=START:STOP:COUNT with COUNT ≥ 1)") from None
    return name.strip(), vals


def _label(v: np.float32) -> str:
    if v == 0:
        return "0"
    if 1e-4 <= abs(v) < 1e16:
        return np.format_float_positional(v, unique=True, trim="-")
    return np.format_float_scientific(v, unique=True, trim="-")


def column_map(text: str) -> tuple[str, str]:
    """``ROLE=COLUMN`` for a role of ``sweep_parquet``."""
    from mdl_jax.controller.stream import ROLES

    role, sep, col = text.partition("=")
    if not sep or role not in ROLES or not col:
        raise argparse.ArgumentTypeError(f"expected ROLE=COLUMN with ROLE one of {', '.join(ROLES)}, got {text!r}")
    return role, col


def register(sub) -> None:
    p = sub.add_parser("sweep", help="a config grid over a Parquet file of (M, R, A[, adopt]) records, "
                                     "streamed: accuracy, action shares, mean C_final per config",
                       description="Sweeps a grid of configs (--grid, the Cartesian product; other fields "
                                   "from --config or the paper defaults) over every record of a Parquet "
                                   "file, streamed in passes (memory is one pass, not the file). Cost: "
                                   "about K × N / (10^6-10^7) seconds on a 2-core CPU for K configs and "
                                   "N records.",
                       formatter_class=DefaultsHelpFormatter)
    p.add_argument("records", type=existing_file, help="Parquet file with columns M, R, A (and adopt)")
    p.add_argument("--grid", type=grid_axis, action="append", required=True,
                   help="FIELD=V1,V2,... or FIELD=START:STOP:COUNT, repeatable (e.g. g_a=0:1:21 sigma=0.1,0.2)")
    p.add_argument("--config", type=config_file, default=None, help="base config file (default: the paper's)")
    p.add_argument("--column", type=column_map, action="append", default=[],
                   help="ROLE=COLUMN: read a role (M, R, A, adopt, weight, group: the ids whose records "
                        "--bootstrap draws together) from another column")
    p.add_argument("--bootstrap", type=nonneg_int, default=0, help="Poisson bootstrap resamples (0: none); with W > 0 every column is the mean over the W "
                        "resamples (the accuracy column too, not the file's own accuracy), beside a 95%% "
                        "percentile interval of the accuracy. Records are resampled one by one: where several "
                        "share a question the interval is too narrow; --column group=QID resamples whole "
                        "questions (the records of one id move together)")
    p.add_argument("--seed", type=seed_int, default=0, help="the resamples' seed")
    p.add_argument("--record-chunk", type=positive_int, default=1 << 18, help="records per pass")
    p.add_argument("--out", type=out_file, default=None, help="CSV file (default: print to stdout)")
    p.add_argument("--checkpoint", type=out_file, default=None,
                   help="keep the sweep's progress in this file (every minute): the same command after a "
                        "kill resumes from it, and refuses if the file's content, the grid or an option "
                        "changed; removed once the CSV is written. Costs one more read of RECORDS (its "
                        "sha256) (default: OUT.progress.npz with --out, none without)")
    p.set_defaults(func=sweep_cmd)


def sweep_cmd(args) -> int:
    """``mdl-jax sweep``: bad input (grid, file, column, values) is one ``mdl-jax: error:`` line."""
    from mdl_jax import MDLConfig, config_grid, load_config
    from mdl_jax.controller import checkpoint as _checkpoint
    from mdl_jax.controller.decision import Action
    from mdl_jax.controller.stream import sweep_parquet_kept

    checkpoint = args.checkpoint or (f"{args.out}.progress.npz" if args.out else None)
    if checkpoint and args.out and os.path.abspath(checkpoint) == os.path.abspath(args.out):
        raise CommandError("sweep: --checkpoint and --out name one file; the CSV would replace the progress")
    refuse_same_file(args.out, RECORDS=args.records, **{"--config": args.config})
    refuse_same_file(checkpoint, what="--checkpoint", RECORDS=args.records,
                     **{"--config": args.config, "--out": args.out})
    base = load_config(args.config) if args.config else MDLConfig()
    names = [n for n, _ in args.grid]
    if len(set(names)) != len(names):
        raise CommandError(f"sweep: --grid: each field once, got {names}")
    roles = [r for r, _ in args.column]
    if len(set(roles)) != len(roles):
        raise CommandError(f"sweep: --column: each role once, got {', '.join(f'{r}={c}' for r, c in args.column)}")
    K = int(np.prod([len(v) for _, v in args.grid], dtype=np.float64))
    if K > MAX_CONFIGS:
        raise CommandError(f"sweep: --grid: {K:,} configs (the product of the axes' lengths) is over the "
                           f"command's {MAX_CONFIGS:,}; split the grid over several commands")
    try:
        import pyarrow.parquet  # noqa: F401  (the one extra dependency the command has)
    except ImportError:
        raise CommandError("sweep: reading Parquet needs pyarrow: pip install pyarrow "
                           "(the signals extra has it too)") from None
    try:
        grid = config_grid(base, **dict(args.grid))
        res = sweep_parquet_kept(args.records, grid, columns=dict(args.column) or None, bootstrap=args.bootstrap,
                                 seed=args.seed, record_chunk=args.record_chunk, engine="auto", mesh_shape=None,
                                 progress=sys.stderr.isatty(), checkpoint=checkpoint)
    except ValueError as e:
        raise CommandError(f"sweep: {e}") from None
    values = np.stack(np.meshgrid(*[v for _, v in args.grid], indexing="ij"), -1).reshape(-1, len(names))
    counts = np.asarray(res.counts)
    total = np.asarray(res.total)
    share = counts / (total[None, :, None] if args.bootstrap else total)
    head = list(names)
    cols = []
    if res.accuracy is not None:
        acc = np.asarray(res.accuracy)
        if args.bootstrap:
            head += ["accuracy", "accuracy_lo95", "accuracy_hi95"]
            cols += [acc.mean(1), np.percentile(acc, 2.5, axis=1), np.percentile(acc, 97.5, axis=1)]
        else:
            head.append("accuracy")
            cols.append(acc)
    if args.bootstrap:
        share, mean_cf = share.mean(1), np.asarray(res.mean_C_final).mean(1)
    else:
        mean_cf = np.asarray(res.mean_C_final)
    head += [f"share_{a.name}" for a in Action] + ["mean_C_final"]
    cols += [share[:, i] for i in range(4)] + [mean_cf]
    # each grid value as the float32 the config holds, in the fewest digits that name it: distinct
    # values never print alike, and a value float32 cannot hold shows as what was swept
    labels = [[_label(np.float32(v)) for v in row] for row in values]
    lines = [",".join(head)] + [",".join(labels[k] + [f"{c[k]:.6f}" for c in cols]) for k in range(len(values))]
    text = "\n".join(lines) + "\n"
    if args.out:
        import pyarrow.parquet as pq

        from mdl_jax._io import write_text

        # the file's rows (res.total is a resample's weight total under --bootstrap, not a row count)
        n_rows = pq.ParquetFile(args.records).metadata.num_rows
        # --out may name a file in folders that do not exist yet (``out_file`` checks that they can be
        # created). Written whole or not at all: a full disk leaves the previous file as it was, and
        # the progress in place (removed only after), so the same command finishes at once.
        write_text(args.out, text)
        print(f"wrote {args.out} ({len(values):,} config{'s' * (len(values) != 1)} × {n_rows:,} records)",
              file=sys.stderr)
    else:
        write_stdout(text)
    if checkpoint:
        _checkpoint.remove(checkpoint)
    return 0
