"""Label scoring (CRAG grades, Self-RAG reflections): options packed behind one prompt vs one pass each.

    python -m experiments.bench_scoring [--n-questions 16]

Prompts: CRAG's grading prompt for the first ``--n-questions`` TruthfulQA questions with their memory
stores as B2 retrieves them (5 documents each), options Correct / Incorrect / Ambiguous; and Self-RAG's
ISSUP prompt (3 options) and ISUSE prompt (5 options) for the same questions with a fixed draft. The
reference is the scoring used until 2026-11-30 (one prompt + option sequence per option, batched and
right-padded, the vocabulary projection in the model's dtype, kept here verbatim in
``score_per_option``); the measured path is ``LocalBackend.score`` (each prompt once, its options packed
behind a 4-d attention mask, the projection of the label positions in float32). Both run in this process on the same
model and dtype (``auto``: bf16 here). Prints seconds, the speed-up, the largest |difference| of a
log-likelihood and the share of decisions (argmax label) that agree, then one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def score_per_option(backend, prompts, options):
    """The reference: one forward pass per (prompt, option), as ``LocalBackend.score`` did before."""
    import torch

    tok, lm = backend._lm()
    seqs, spans, owner = [], [], []
    for i, (p, opts) in enumerate(zip(prompts, options)):
        text = tok.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
        pid = tok(text, add_special_tokens=False)["input_ids"]
        for o in opts:
            oid = tok(o, add_special_tokens=False)["input_ids"]
            seqs.append(pid + oid)
            spans.append((len(pid), len(pid) + len(oid)))
            owner.append(i)
    res = [0.0] * len(seqs)
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    for start in range(0, len(order), backend.batch_size):
        idx = order[start:start + backend.batch_size]
        width = max(len(seqs[i]) for i in idx)
        ids = torch.full((len(idx), width), tok.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(idx), width), dtype=torch.long)
        for r, i in enumerate(idx):
            ids[r, :len(seqs[i])] = torch.tensor(seqs[i])
            mask[r, :len(seqs[i])] = 1
        with torch.inference_mode():
            hidden = lm.model(input_ids=ids, attention_mask=mask).last_hidden_state
            for r, i in enumerate(idx):
                a, b = spans[i]
                logp = torch.log_softmax(lm.lm_head(hidden[r, a - 1:b - 1]).float(), -1)
                res[i] = float(logp.gather(1, torch.tensor(seqs[i][a:b])[:, None]).sum())
    out, k = [], 0
    for opts in options:
        out.append(res[k:k + len(opts)])
        k += len(opts)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n-questions", type=int, default=16)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args(argv)
    from mdl_repro.pipeline.data import load
    from mdl_repro.pipeline.generation import LocalBackend
    from mdl_repro.pipeline.stores import build_stores
    from mdl_repro.pipeline.systems import CRAG_EVAL, GRADES, ISSUP, ISSUP_Q, ISUSE, ISUSE_Q

    stores = build_stores(load("truthfulqa"))[:args.n_questions]
    prompts, options = [], []
    for st in stores:
        question = st.item.question
        for m in st.texts:
            prompts.append([{"role": "user", "content": CRAG_EVAL.format(q=question, m=m)}])
            options.append(list(GRADES))
        mem = "\n".join(f"- {m}" for m in st.texts)
        draft = st.item.correct[0]
        prompts.append([{"role": "user", "content": ISSUP_Q.format(q=question, mem=mem, d=draft)}])
        options.append(list(ISSUP))
        prompts.append([{"role": "user", "content": ISUSE_Q.format(q=question, d=draft)}])
        options.append(list(ISUSE))
    be = LocalBackend()
    be.score(prompts[:4], options[:4])  # load the model and warm up
    packed_s, ref_s = [], []
    for _ in range(args.repeats):
        t = time.perf_counter()
        ref = score_per_option(be, prompts, options)
        ref_s.append(time.perf_counter() - t)
        t = time.perf_counter()
        got = be.score(prompts, options)
        packed_s.append(time.perf_counter() - t)
    diff = max(abs(a - b) for x, y in zip(got, ref) for a, b in zip(x, y))
    same = float(np.mean([int(np.argmax(x)) == int(np.argmax(y)) for x, y in zip(got, ref)]))
    speed = [r / g for r, g in zip(ref_s, packed_s)]
    res = {"prompts": len(prompts), "options": sum(map(len, options)), "dtype": be.dtype,
           "per_option_s": ref_s, "packed_s": packed_s, "speedup": speed, "max_abs_diff": diff,
           "same_decision": same}
    print(f"{len(prompts)} prompts ({args.n_questions} questions: 5 CRAG grades, ISSUP, ISUSE), "
          f"{res['options']} options, {be.dtype}")
    print(f"one pass per option (reference): {', '.join(f'{x:.1f}' for x in ref_s)} s")
    print(f"options packed behind the prompt: {', '.join(f'{x:.1f}' for x in packed_s)} s → "
          f"{min(speed):.1f}-{max(speed):.1f}× faster")
    print(f"largest |Δ log-likelihood| {diff:.3f}; same decision for {same:.1%} of prompts")
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
