"""How often does batching alone change an answer? (paired sampling)

Each row samples from its own generator seeded by (record seed, prompt), so the random numbers a row
draws do not depend on its batch. What can still differ is the row's logits: bf16 matmuls over a
batch of another shape (other neighbours, other padding width) round differently, and a sampled
token flips where two tokens nearly tie. This script answers the same 32 B2 prompts (TruthfulQA,
memories injected, record seeds of seed 0) three ways — batches of 8, batches of 5 (other neighbours
and padding), one at a time — and counts answers that differ, in bf16 and in float32.

    python experiments/batching_invariance.py [--n 32] [--max-new-tokens 48]

The experiment itself does not depend on this rate: its generation cache replays an answer wherever
the same prompt is sent again for the same record, so B3 Active = B2 exactly.
"""

import argparse
import json
import time

from mdl_jax.prompts import chat
from mdl_repro.pipeline.data import load
from mdl_repro.pipeline.generation import LocalBackend, record_seed
from mdl_repro.pipeline.stores import build_stores


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    ap.add_argument("--batches", type=int, nargs="+", default=[8, 5, 1],
                    help="batch sizes compared pairwise (1: each prompt alone)")
    args = ap.parse_args()
    stores = build_stores(load("truthfulqa"))[:args.n]
    chats = [chat(s.item.question, s.texts) for s in stores]
    seeds = [record_seed("truthfulqa", s.item.qid, 0) for s in stores]
    result = {}
    for dtype in args.dtypes:
        runs = {}
        for bs in args.batches:
            b = LocalBackend(batch_size=bs, dtype=dtype, max_new_tokens=args.max_new_tokens)
            t0 = time.perf_counter()
            runs[bs] = [g.text for g in b.generate(chats, seed=seeds)]
            print(f"{dtype} batch {bs}: {time.perf_counter() - t0:.0f} s", flush=True)
        result[dtype] = {"n": len(chats), "max_new_tokens": args.max_new_tokens}
        for i, a in enumerate(args.batches):
            for b in args.batches[i + 1:]:
                result[dtype][f"differ_{a}_vs_{b}"] = sum(x != y for x, y in zip(runs[a], runs[b]))
        print(json.dumps(result[dtype]), flush=True)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
