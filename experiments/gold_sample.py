"""The gold sample of an evaluated run: a stratified random draw of its answers, labelled blind.

The judge-error correction needs each judge's sensitivity and specificity on answers like the ones it
corrects. This draws them from the evaluated run itself, stratified by the cells the correction works
in (dataset × system × the B3 action of the same question and seed), so that every cell the corrected
rates are computed in has read answers behind it. B3's Opt-Out answers are the fixed abstention (no
model call) and are not drawn.

    python -m experiments.gold_sample RUN_DIR OUT_DIR [--per-cell 15] [--seed 0]
    python -m experiments.gold_sample RUN_DIR OUT_DIR --finalize LABELS_A LABELS_B [LABELS_C]

writes OUT_DIR/blind_sample.jsonl (bid, dataset, question, answer, the dataset's references, HaluEval's
knowledge: nothing that names the system or the action, in a shuffled order) and, with ``--key``,
OUT_DIR/key.jsonl (bid → dataset, qid, seed, system, B3 action). The draw is a pure function of the
records and the seed, so the key is written only after labelling and can be checked by anyone.

``--finalize`` joins the two readers' labels (and the adjudicator's, for their disagreements) with the
key into OUT_DIR/gold_labels.jsonl (the shipped gold set's fields, plus ``b3_action``) and prints each
judge's sensitivity and specificity on it, per dataset.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from mdl_jax._io import write_text
from mdl_repro.pipeline.data import load

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


def _labels(path: Path) -> dict[str, dict]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return {r["bid"]: r for r in rows}


def finalize(sample: pd.DataFrame, blind: list[dict], paths: list[Path], out: Path, run: str) -> None:
    """Write gold_labels.jsonl (A and B agreed, or C's reading of their disagreement) and print the
    agreement and each judge's sensitivity / specificity against the final labels."""
    if len(paths) not in (2, 3):
        raise SystemExit("--finalize: expected LABELS_A LABELS_B [LABELS_C]")
    la, lb = _labels(paths[0]), _labels(paths[1])
    lc = _labels(paths[2]) if len(paths) == 3 else {}
    gold = []
    for r, b in zip(sample.itertuples(), blind):
        x, y = la[r.bid], lb[r.bid]
        if x["label"] == y["label"]:
            final, agreement = x, "agreed"
        elif r.bid in lc:
            final, agreement = lc[r.bid], "adjudicated"
        else:
            raise SystemExit(f"--finalize: {r.bid}: the readers disagree and there is no adjudication")
        gold.append({"gid": r.bid, "split": "evaluated-run", "run": run, "dataset": r.dataset,
                     "qid": int(r.qid), "seed": int(r.seed), "system": r.system, "b3_action": r.b3_action,
                     "question": b["question"], "answer": b["answer"], "label": final["label"],
                     "kind": final["kind"], "reason": final["reason"], "agreement": agreement,
                     "labeller_a": x["label"], "labeller_b": y["label"],
                     "judge_paper": bool(r.hallucinated), "judge_ref": bool(r.hallucinated_ref)})
    write_text(out / "gold_labels.jsonl", "".join(json.dumps(g, ensure_ascii=False) + "\n" for g in gold))
    g = pd.DataFrame(gold)
    agree = (g["labeller_a"] == g["labeller_b"]).mean()
    pa, pb = (g["labeller_a"] == "hallucinated").mean(), (g["labeller_b"] == "hallucinated").mean()
    pe = pa * pb + (1 - pa) * (1 - pb)
    print(f"{len(g)} answers; readers agree {agree:.3f} (Cohen's kappa {(agree - pe) / (1 - pe):.3f}); "
          f"{(g['agreement'] == 'adjudicated').sum()} adjudicated")
    g["gold"] = g["label"] == "hallucinated"
    for ds, part in g.groupby("dataset"):
        for judge in ("paper", "ref"):
            j = part[f"judge_{judge}"]
            pos, neg = part["gold"], ~part["gold"]
            print(f"{ds:10s} {judge:5s} Se {j[pos].mean():.3f} ({int(j[pos].sum())}/{int(pos.sum())})  "
                  f"Sp {(~j[neg]).mean():.3f} ({int((~j[neg]).sum())}/{int(neg.sum())})  "
                  f"J {j[pos].mean() + (~j[neg]).mean() - 1:+.3f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.gold_sample", description=__doc__.split("\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--per-cell", type=int, default=15)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--key", action="store_true", help="also write key.jsonl (after labelling)")
    ap.add_argument("--finalize", nargs="+", type=Path, metavar="LABELS",
                    help="labels of reader A, reader B and (for their disagreements) the adjudicator")
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
    write_text(a.out_dir / "blind_sample.jsonl", "".join(json.dumps(b, ensure_ascii=False) + "\n" for b in blind))
    if a.key:
        keys = sample[["bid", "dataset", "qid", "seed", "system", "b3_action"]].to_dict("records")
        write_text(a.out_dir / "key.jsonl", "".join(json.dumps(k) + "\n" for k in keys))
    if a.finalize:
        finalize(sample, blind, a.finalize, a.out_dir, a.run_dir.name)
        return 0
    cells = sample.groupby(["dataset", "system", "b3_action"]).size()
    print(f"{len(sample)} answers in {len(cells)} cells", file=sys.stderr)
    print(cells.to_string(), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
