"""Subcommands of later pipeline stages (imported by ``cli`` only when the command line is parsed)."""

from __future__ import annotations

import argparse
import sys

from mdl_jax.cli import existing_dir, nonneg_int, out_dir, out_file, positive_int, seed_int

# Measured here: 26,293 memory texts to embed, ~21 texts/s under load (about 20 minutes) on first use;
# the embedding cache makes later runs take seconds.
SIGNALS_COST = "about 20 minutes on first use here (26,293 texts), seconds once they are cached"


def _common(p: argparse.ArgumentParser) -> None:
    # Help texts that name their own default contain %(default)s, so the formatter adds none.
    p.add_argument("--data-dir", default=None, type=existing_dir,
                   help="folder with TruthfulQA.csv and halueval_qa.jsonl (%(default)s: "
                        "$MDL_JAX_DATA_DIR, else ../shared/data beside the repo, else the hub)")
    p.add_argument("--datasets", nargs="+", default=["truthfulqa", "halueval"],
                   choices=["truthfulqa", "halueval"], help="datasets to run")
    p.add_argument("--model", default="all-MiniLM-L6-v2", help="sentence-transformers model name or path")
    p.add_argument("--cache-dir", default=None, type=out_dir, help="embedding cache (%(default)s: $MDL_JAX_CACHE_DIR "
                                                     "or ~/.cache/mdl_jax)")
    p.add_argument("--split-seed", type=seed_int, default=0,
                   help="seed of the memory stores' distractors and of the calibration / evaluation split")
    # The old name, ambiguous beside reproduce's --seeds; hidden, warns, kept so old scripts run.
    p.add_argument("--seed", dest="split_seed", type=seed_int, default=argparse.SUPPRESS,
                   action=_DeprecatedSeed, help=argparse.SUPPRESS)


class _DeprecatedSeed(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        print("warning: --seed is deprecated; it is the store/split seed, now --split-seed "
              "(generation seeds are reproduce's --seeds)", file=sys.stderr)
        setattr(namespace, self.dest, values)


def register(sub) -> None:
    p = sub.add_parser("signals", help="build memory stores and the M, R, A signals table (Parquet)",
                       description="Build the memory stores and the M, R, A signals table (Parquet). "
                                   "No LLM. A bare run embeds every memory of both datasets with "
                                   f"MiniLM: {SIGNALS_COST}.",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    _common(p)
    p.add_argument("--limit", type=positive_int, default=None, help="first N questions per dataset (None: all)")
    p.add_argument("--n-calibration", type=nonneg_int, default=80,
                   help="questions per dataset marked as the calibration split")
    p.add_argument("--out", default="out/signals.parquet", type=out_file, help="Parquet file to write")
    p.set_defaults(func=signals_cmd)
    from mdl_jax.pipeline import experiment

    experiment.register(sub, _common)


def build_signal_table(datasets, *, data_dir=None, limit=None, model="all-MiniLM-L6-v2",
                       cache_dir=None, seed=0, n_calibration=80, progress=True):
    """Stores + signals for each dataset, with a ``split`` column (calibration / evaluation)."""
    import pandas as pd

    from mdl_jax.pipeline.data import load
    from mdl_jax.signals.embeddings import Embedder
    from mdl_jax.pipeline.store_signals import compute_signals
    from mdl_jax.pipeline.stores import StoreConfig, build_stores, split_calibration

    emb = Embedder(model, cache_dir=cache_dir, progress=progress)
    tables, all_stores = [], {}
    for ds in datasets:
        items = load(ds, data_dir, limit=limit)
        n_cal = min(n_calibration, len(items) // 2)
        cal, _ = split_calibration(items, n_cal, seed)
        cal_ids = {it.qid for it in cal}
        stores = build_stores(items, StoreConfig(seed=seed))
        t = compute_signals(stores, emb, progress=progress)
        t["split"] = ["calibration" if q in cal_ids else "evaluation" for q in t["qid"]]
        tables.append(t)
        all_stores[ds] = stores
    return pd.concat(tables, ignore_index=True), all_stores, emb


def signals_cmd(args) -> int:
    from mdl_jax.pipeline.store_signals import save_table

    table, _, emb = build_signal_table(args.datasets, data_dir=args.data_dir, limit=args.limit,
                                       model=args.model, cache_dir=args.cache_dir, seed=args.split_seed,
                                       n_calibration=args.n_calibration)
    path = save_table(table, args.out)
    print(f"wrote {len(table)} rows to {path} (embedded {emb.n_embedded} new texts, "
          f"{emb.n_cached} from cache)", file=sys.stderr)
    summary = table.groupby("dataset")[["M", "R", "A", "phi"]].mean().round(3)
    print(summary.to_string())
    return 0
