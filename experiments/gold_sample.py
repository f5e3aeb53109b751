"""The gold sample of an evaluated run: a stratified random draw of its answers, labelled blind.

The judge-error correction needs each judge's sensitivity and specificity on answers like the ones it
corrects. This draws them from the evaluated run itself, stratified by the cells the correction works
in (dataset × system × the B3 action of the same question and seed), so that every cell the corrected
rates are computed in has read answers behind it. B3's Opt-Out answers are the fixed abstention (no
model call) and are not drawn.

    python -m experiments.gold_sample RUN_DIR OUT_DIR [--per-cell 15] [--seed 0]

writes OUT_DIR/blind_sample.jsonl (bid, dataset, question, answer, the dataset's references, HaluEval's
knowledge: nothing that names the system or the action, in a shuffled order) and, with ``--key``,
OUT_DIR/key.jsonl (bid → dataset, qid, seed, system, B3 action). The draw is a pure function of the
records and the seed, so the key is written only after labelling and can be checked by anyone.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from mdl_jax.pipeline.data import load

SYSTEMS = ("B1", "B2", "B3")


def draw(records: pd.DataFrame, per_cell: int, seed: int) -> pd.DataFrame:
    """The stratified sample: up to ``per_cell`` answers of each (dataset, system, B3 action) cell,
    drawn without replacement, then shuffled as one list with fresh blind ids."""
    b3 = records[records["system"] == "B3"][["dataset", "qid", "seed", "action"]].rename(
        columns={"action": "b3_action"})
    ev = records[records["system"].isin(SYSTEMS)].merge(b3, on=["dataset", "qid", "seed"], how="inner")
    ev = ev[~((ev["system"] == "B3") & (ev["b3_action"] == "OPT_OUT"))]
    rng = np.random.default_rng(seed)
    parts = []
    for _, cell in ev.groupby(["dataset", "system", "b3_action"], sort=True):
        take = min(per_cell, len(cell))
        parts.append(cell.iloc[np.sort(rng.choice(len(cell), take, replace=False))])
    out = pd.concat(parts).iloc[rng.permutation(sum(map(len, parts)))].reset_index(drop=True)
    out["bid"] = [f"b{i:03d}" for i in range(len(out))]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.gold_sample", description=__doc__.split("\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--per-cell", type=int, default=15)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--key", action="store_true", help="also write key.jsonl (after labelling)")
    a = ap.parse_args(argv)
    if a.per_cell < 1:
        ap.error(f"--per-cell: expected a positive count, got {a.per_cell}")
    rec_path = a.run_dir / "records.jsonl"
    if not rec_path.is_file():
        ap.error(f"run_dir: no records.jsonl in {a.run_dir}")
    sample = draw(pd.read_json(rec_path, lines=True), a.per_cell, a.seed)
    items = {ds: {it.qid: it for it in load(ds)} for ds in sorted(sample["dataset"].unique())}
    a.out_dir.mkdir(parents=True, exist_ok=True)
    blind = []
    for r in sample.itertuples():
        it = items[r.dataset][int(r.qid)]
        row = {"bid": r.bid, "dataset": r.dataset, "question": it.question, "answer": r.answer,
               "correct_refs": list(it.correct), "incorrect_refs": list(it.incorrect)}
        if it.context:
            row["knowledge"] = it.context
        blind.append(row)
    (a.out_dir / "blind_sample.jsonl").write_text(
        "".join(json.dumps(b, ensure_ascii=False) + "\n" for b in blind), encoding="utf-8")
    if a.key:
        keys = sample[["bid", "dataset", "qid", "seed", "system", "b3_action"]].to_dict("records")
        (a.out_dir / "key.jsonl").write_text("".join(json.dumps(k) + "\n" for k in keys), encoding="utf-8")
    cells = sample.groupby(["dataset", "system", "b3_action"]).size()
    print(f"{len(sample)} answers in {len(cells)} cells", file=sys.stderr)
    print(cells.to_string(), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
