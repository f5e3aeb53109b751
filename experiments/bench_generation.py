"""Generation throughput of the local backend (tokens/s), reference and tuned side by side.

    python -m experiments.bench_generation [--quick]

Same 64 TruthfulQA prompts (with their memory stores, as B2 sends them), same sampling (T 0.7,
top-p 0.9), exactly 150 new tokens per prompt. Reference: transformers as a first try would call it (GGUF loaded with
transformers' default dtype, batch 16, prompts in file order). Tuned: what ``LocalBackend`` does
(``auto_dtype``: bfloat16 on CPUs with AVX512-BF16/AMX, else float32; batches of prompts sorted by
length so rows pad less) at batch 16, 32 and 64.
Prints a table, then one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from mdl_jax.prompts import chat
from mdl_repro.pipeline.data import load
from mdl_repro.pipeline.generation import auto_dtype, bundled_gguf
from mdl_repro.pipeline.stores import build_stores


def _run(tok, lm, chats, batch, sort, max_new):
    order = sorted(range(len(chats)), key=lambda i: len(str(chats[i]))) if sort else range(len(chats))
    order = list(order)
    n_tok, t0 = 0, time.perf_counter()
    for s in range(0, len(order), batch):
        texts = [tok.apply_chat_template(chats[i], tokenize=False, add_generation_prompt=True)
                 for i in order[s:s + batch]]
        enc = tok(texts, return_tensors="pt", padding=True)
        torch.manual_seed(s)
        with torch.inference_mode():
            # min_new_tokens = max_new_tokens: every row decodes the same number of tokens, so
            # tokens/s compares the engines, not how talkative one sample happened to be.
            ids = lm.generate(**enc, do_sample=True, temperature=0.7, top_p=0.9,
                              max_new_tokens=max_new, min_new_tokens=max_new,
                              pad_token_id=tok.pad_token_id)
        n_tok += int(ids[:, enc["input_ids"].shape[1]:].numel())
    dt = time.perf_counter() - t0
    return n_tok, dt


def main(argv=None):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="32 prompts, 32 new tokens")
    args = p.parse_args(argv)
    n, max_new = (32, 32) if args.quick else (64, 150)
    stores = build_stores(load("truthfulqa", limit=max(n, 8)))[:n]
    chats = [chat(s.item.question, s.texts) for s in stores]
    folder, gguf = bundled_gguf()
    tok = AutoTokenizer.from_pretrained(str(folder), gguf_file=gguf)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    res = {"prompts": n, "max_new_tokens": max_new, "torch_threads": torch.get_num_threads()}
    ref = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=gguf)
    res["reference_dtype"] = str(ref.dtype)
    t, dt = _run(tok, ref, chats, 16, False, max_new)
    res["reference_bs16"] = {"tokens": t, "s": dt, "tokens_per_s": t / dt}
    del ref
    res["tuned_dtype"] = auto_dtype("cpu")
    lm = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=gguf,
                                              dtype=getattr(torch, res["tuned_dtype"])).eval()
    for bs in (16, 32, 64):
        t, dt = _run(tok, lm, chats, bs, True, max_new)
        res[f"tuned_bs{bs}"] = {"tokens": t, "s": dt, "tokens_per_s": t / dt}
    best = max((k for k in res if k.startswith("tuned_bs")), key=lambda k: res[k]["tokens_per_s"])
    res["best"] = best
    res["ratio_best_vs_reference"] = res[best]["tokens_per_s"] / res["reference_bs16"]["tokens_per_s"]
    print(f"SmolLM2-135M generation, {n} B2 prompts, ≤{max_new} new tokens, {res['torch_threads']} threads")
    for k in ("reference_bs16", "tuned_bs16", "tuned_bs32", "tuned_bs64"):
        print(f"{k:16s} {res[k]['tokens_per_s']:8.1f} tokens/s ({res[k]['tokens']} tokens, {res[k]['s']:.1f} s)")
    print(f"best: {best}, {res['ratio_best_vs_reference']:.2f}× the reference "
          f"(reference dtype {res['reference_dtype']}, tuned dtype {res['tuned_dtype']})")
    print(json.dumps(res))
    return res


if __name__ == "__main__":
    main()
