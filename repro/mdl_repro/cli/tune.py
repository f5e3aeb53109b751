"""``mdl-jax tune``: the learned, still white-box MDL beside Table 7, trained on a run's records."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mdl_jax.cli.args import DefaultsHelpFormatter, out_dir, positive_int, seed_int


def steps_int(text: str) -> int:
    """Training steps: an int in [1, MAX_STEPS] (the training loop counts steps in int32)."""
    from mdl_jax.controller.tune_settings import MAX_STEPS

    v = positive_int(text)
    if v > MAX_STEPS:
        raise argparse.ArgumentTypeError(f"expected an integer in [1, {MAX_STEPS}], got {text!r}")
    return v


def register(sub) -> None:
    from mdl_jax.controller.tuning import FIELD_SETS

    p = sub.add_parser("tune", help="gradient-tune the controller on a run's oracle-labelled records "
                                    "(5 folds × seeds × field sets in one program) and write TUNED.md",
                       description="Trains the learned, still white-box MDL beside Table 7 (see "
                                   "repro/mdl_repro/analysis/learned.py) and writes TUNED.md, tuned.json and "
                                   "tuned-<field set>.json. Needs at least 5 records of each oracle label. "
                                   "A bare run on the 3,600 records of a paper-scale run takes about a "
                                   "minute here (2-core CPU).",
                       formatter_class=DefaultsHelpFormatter)
    p.add_argument("records", help="records.jsonl of a reproduce run")
    p.add_argument("--out", default=None, type=out_dir,
                   help="output folder (None: tuned/ beside RECORDS)")
    p.add_argument("--steps", type=steps_int, default=500, help="training steps per run")
    p.add_argument("--seeds", type=seed_int, nargs="+", default=[0, 1, 2], help="seeds per fold")
    p.add_argument("--field-sets", nargs="+", default=["gates", "all"], choices=list(FIELD_SETS),
                   help="which numeric fields train: gates = gate_coeffs + thresholds; all = every one")
    p.set_defaults(func=tune_cmd)


def tune_cmd(args) -> int:
    """``mdl-jax tune``: bad records raise ``RecordsError``, which the CLI prints as one line (exit 2)."""
    from mdl_repro.analysis.learned import learned_table, markdown

    res = learned_table(args.records, args.out, steps=args.steps, seeds=tuple(args.seeds),
                        field_sets=tuple(args.field_sets), progress=lambda m: print(m, file=sys.stderr))
    out = Path(args.out) if args.out else Path(args.records).parent / "tuned"
    print(markdown(res))
    print(f"wrote {out / 'TUNED.md'}", file=sys.stderr)
    return 0
