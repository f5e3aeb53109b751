"""Generation engines on this CPU in one run: tokens/s single-stream and batched.

    python -m experiments.bench_generation_engines [--quick] [--rounds 2] [--engines ...]

The same B2 prompts (TruthfulQA questions with their memory stores), the same sampling (temperature
0.7, top-p 0.9, no top-k, no repetition penalty) and exactly ``--new`` new tokens per prompt (the end
of text is suppressed), for every engine:

  torch-float32    the local backend's path on a CPU without AVX512-BF16: transformers ``generate``
                   with the per-row sampler (``RowSampler``), float32 weights and activations
  torch-bfloat16   the same in bf16 (what ``auto_dtype`` picks here, where the CPU has AVX512-BF16)
  ct2-int8         CTranslate2 ``Generator.generate_batch``, int8 weights (converted once from the
                   bundled GGUF, ``mdl_repro.pipeline.generation.ct2``), its own sampler
  llama.cpp-Q4_1   llama-cpp-python on the bundled GGUF file itself (Q4_1 weights); single-stream
                   through ``Llama.generate``, batched through the low-level API (one sequence per
                   prompt in one ``llama_batch``, the sampling in NumPy)
  llama.cpp-Q8_0   the same peer on the Q8_0 copy of the GGUF that ``LlamaCppBackend`` runs
                   (``weights="auto"``): not counted as a peer (the file a user has is Q4_1), it shows
                   how much of the backend's lead is the weights and how much its own loop
  backend-ct2      ``CT2Backend.generate``, the backend's engine="ctranslate2": the ct2 engine plus
                   its paired sampling (row-seeded, ``ct2.py``) and the rest of the interface
  backend-llama.cpp ``LlamaCppBackend.generate``, engine="llama.cpp": llama.cpp's logits, the torch
                   path's sampler in NumPy, continuous batching (``llamacpp.py``)

Single-stream: ``--single`` prompts one at a time. Batched: all prompts, length-sorted batches of
``--batch``. Engines alternate inside each round, so they share the load of the moment; every figure
is also given as a ratio to torch-float32 in the same round, and ranges are over rounds. The CPU's
flags are printed with the figures. Prints a table, then one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8", "avx_vnni")


def cpu_flags() -> tuple[str, list[str]]:
    """(model name, the flags among ``FLAGS`` this CPU has), from /proc/cpuinfo (``experiments._machine``)."""
    from experiments._machine import cpu_flags as flags
    from experiments._machine import cpu_model

    return cpu_model(), flags(FLAGS)


def _prompts(n: int):
    from mdl_jax.prompts import chat
    from mdl_repro.pipeline.data import load
    from mdl_repro.pipeline.stores import build_stores

    stores = build_stores(load("truthfulqa", limit=max(n, 8)))[:n]
    return [chat(s.item.question, s.texts) for s in stores]


def _ids(tok, chats):
    texts = [tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in chats]
    return [list(tok(t, add_special_tokens=False)["input_ids"]) for t in texts]


def _batches(ids, batch):
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    return [order[s:s + batch] for s in range(0, len(order), batch)]


# -- engines: each is a function (ids, batch, new) -> (new tokens generated, seconds)

def _torch_engine(dtype: str):
    import torch

    from mdl_repro.pipeline.generation import BUNDLED, RowSampler, load_local, row_seed

    tok, lm = load_local(BUNDLED, dtype)

    def run(ids, batch, new):
        n_tok, t0 = 0, time.perf_counter()
        for idx in _batches(ids, batch):
            width = max(len(ids[i]) for i in idx)
            x = torch.full((len(idx), width), tok.pad_token_id, dtype=torch.long)
            m = torch.zeros((len(idx), width), dtype=torch.long)
            for r, i in enumerate(idx):  # left padding, as LocalBackend
                x[r, width - len(ids[i]):] = torch.tensor(ids[i])
                m[r, width - len(ids[i]):] = 1
            proc = RowSampler([row_seed(i, ids[i]) for i in idx], 0.7, 0.9)
            with torch.inference_mode():
                out = lm.generate(input_ids=x, attention_mask=m, do_sample=False, max_new_tokens=new,
                                  min_new_tokens=new, logits_processor=[proc], pad_token_id=tok.pad_token_id,
                                  temperature=None, top_p=None, top_k=None)
            n_tok += int(out[:, width:].numel())
        return n_tok, time.perf_counter() - t0

    return run


def _ct2_engine():
    import ctranslate2

    from mdl_repro.pipeline.generation.ct2 import ct2_model

    path, tok = ct2_model()
    gen = ctranslate2.Generator(str(path), device="cpu", compute_type="int8", intra_threads=os.cpu_count() or 1)

    def run(ids, batch, new):
        n_tok, t0 = 0, time.perf_counter()
        for idx in _batches(ids, batch):
            res = gen.generate_batch([tok.convert_ids_to_tokens(ids[i]) for i in idx], max_length=new,
                                     min_length=new, include_prompt_in_result=False, sampling_topk=0,
                                     sampling_topp=0.9, sampling_temperature=0.7)
            n_tok += sum(len(r.sequences_ids[0]) for r in res)
        return n_tok, time.perf_counter() - t0

    return run


def _backend_ct2_engine():
    from mdl_repro.pipeline.generation.ct2 import CT2Backend

    be = CT2Backend(batch_size=32)

    def run(ids, batch, new):
        be.batch_size = batch
        t0, n0 = be.seconds, be.tokens_generated
        be.generate_ids(ids, seed=list(range(len(ids))), max_new_tokens=new, min_new_tokens=new)
        return be.tokens_generated - n0, be.seconds - t0

    return run


def _backend_llama_engine():
    from mdl_repro.pipeline.generation.llamacpp import LlamaCppBackend

    be = LlamaCppBackend(batch_size=32)

    def run(ids, batch, new):
        be.batch_size = batch
        t0, n0 = be.seconds, be.tokens_generated
        be.generate_ids(ids, seed=list(range(len(ids))), max_new_tokens=new, min_new_tokens=new)
        return be.tokens_generated - n0, be.seconds - t0

    return run


def _llama_engine(weights: str = "file"):
    import ctypes

    import llama_cpp
    import numpy as np

    from mdl_repro.pipeline.generation import bundled_gguf
    from mdl_repro.pipeline.generation.llamacpp import q8_0_copy

    folder, gguf = bundled_gguf()
    path = folder / gguf if weights == "file" else q8_0_copy(folder / gguf)
    threads = os.cpu_count() or 1
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=1024, n_threads=threads,
                          n_threads_batch=threads, n_batch=1024, verbose=False, seed=0)
    eos = llm.token_eos()
    ctxs: dict[int, object] = {}

    def single(toks, new):
        n = 0
        llm.reset()
        for _t in llm.generate(toks, temp=0.7, top_p=0.9, top_k=0, min_p=0.0, repeat_penalty=1.0,
                              logits_processor=llama_cpp.LogitsProcessorList([_no_eos(eos)])):
            n += 1
            if n >= new:
                break
        return n

    def batched(idx_ids, new, ctx_len):
        # one sequence per prompt in one context: prefill each prompt, then decode all rows together
        b = len(idx_ids)
        key = b * 10_000 + ctx_len
        if key not in ctxs:
            cp = llama_cpp.llama_context_default_params()
            cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = ctx_len * b, 1024, 512, b
            cp.n_threads = cp.n_threads_batch = threads
            ctxs.clear()
            ctxs[key] = llama_cpp.llama_init_from_model(llm.model, cp)
        ctx = ctxs[key]
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
        vocab = llama_cpp.llama_n_vocab(llama_cpp.llama_model_get_vocab(llm.model))
        bt = llama_cpp.llama_batch_init(max(1024, b), 0, b)
        rng = np.random.default_rng(0)
        try:
            pos = []
            for s, toks in enumerate(idx_ids):
                for a in range(0, len(toks), 1024):
                    chunk = toks[a:a + 1024]
                    bt.n_tokens = len(chunk)
                    for j, t in enumerate(chunk):
                        bt.token[j], bt.pos[j], bt.n_seq_id[j] = t, a + j, 1
                        bt.seq_id[j][0] = s
                        bt.logits[j] = a + j == len(toks) - 1
                    if llama_cpp.llama_decode(ctx, bt) != 0:
                        raise RuntimeError("llama_decode failed (prefill)")
                logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, len(chunk) - 1),
                                               shape=(vocab,)).copy()
                pos.append((len(toks), logits))
            n_tok = 0
            last = np.stack([lg for _, lg in pos])
            cur = [p for p, _ in pos]
            for _ in range(new):
                nxt = _sample_np(last, eos, rng)
                n_tok += b
                bt.n_tokens = b
                for s in range(b):
                    bt.token[s], bt.pos[s], bt.n_seq_id[s] = int(nxt[s]), cur[s], 1
                    bt.seq_id[s][0] = s
                    bt.logits[s] = True
                    cur[s] += 1
                if llama_cpp.llama_decode(ctx, bt) != 0:
                    raise RuntimeError("llama_decode failed (decode)")
                ptr = llama_cpp.llama_get_logits(ctx)
                last = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)),
                                             shape=(b, vocab)).copy()
            return n_tok
        finally:
            llama_cpp.llama_batch_free(bt)

    def run(ids, batch, new):
        t0 = time.perf_counter()
        if batch == 1:
            n_tok = sum(single(t, new) for t in ids)
        else:
            n_tok = 0
            longest = max(len(t) for t in ids) + new + 8
            for idx in _batches(ids, batch):
                n_tok += batched([ids[i] for i in idx], new, longest)
        return n_tok, time.perf_counter() - t0

    return run


def _no_eos(eos):
    import numpy as np

    def proc(input_ids, scores):
        scores[eos] = -np.inf
        return scores

    return proc


def _sample_np(logits, eos, rng, temperature=0.7, top_p=0.9):
    """Temperature + top-p per row in NumPy (the end of text suppressed), for the llama.cpp batch."""
    import numpy as np

    z = logits / temperature
    z[:, eos] = -np.inf
    k = 256
    idx = np.argpartition(-z, k, axis=1)[:, :k]
    top = np.take_along_axis(z, idx, 1)
    o = np.argsort(-top, axis=1)
    idx, top = np.take_along_axis(idx, o, 1), np.take_along_axis(top, o, 1)
    zmax = z.max(1, keepdims=True)
    lse = zmax + np.log(np.exp(z - zmax).sum(1, keepdims=True))
    p = np.exp(top - lse)
    keep = (np.cumsum(p, 1) - p) < top_p
    p = np.where(keep, p, 0)
    p /= p.sum(1, keepdims=True)
    u = rng.random((len(p), 1))
    j = (np.cumsum(p, 1) < u).sum(1).clip(0, k - 1)
    return idx[np.arange(len(p)), j]


ENGINES = {"torch-float32": lambda: _torch_engine("float32"),
           "torch-bfloat16": lambda: _torch_engine("bfloat16"),
           "ct2-int8": _ct2_engine,
           "llama.cpp-Q4_1": _llama_engine,
           "llama.cpp-Q8_0": lambda: _llama_engine("q8_0"),
           "backend-ct2": _backend_ct2_engine,
           "backend-llama.cpp": _backend_llama_engine}
PEERS = ("ct2-int8", "llama.cpp-Q4_1")


def backend_engines() -> tuple[str, ...]:
    """The backend's engines on this CPU: LocalBackend's torch path runs at ``auto_dtype``'s choice (the
    same sampler and batching as torch-<dtype> here), so torch-float32 on a CPU without AVX512-BF16 or AMX
    and torch-bfloat16 on one with them; then the ctranslate2 and llama.cpp engines behind the interface."""
    from mdl_repro.pipeline.generation import auto_dtype

    return (f"torch-{auto_dtype('cpu')}", "backend-ct2", "backend-llama.cpp")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="16 prompts, 32 new tokens, 4 single-stream")
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--new", type=int, default=150, help="new tokens per prompt (exactly)")
    p.add_argument("--single", type=int, default=8, help="prompts for the single-stream figure")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--engines", nargs="+", default=[e for e in ENGINES if e != "llama.cpp-Q8_0"],
                   choices=list(ENGINES), help="default: all but llama.cpp-Q8_0 (informational, not a peer)")
    args = p.parse_args(argv)
    if args.quick:
        args.prompts, args.new, args.single = 16, 32, 4
    import torch

    from mdl_repro.pipeline.generation import BUNDLED, load_local

    name, flags = cpu_flags()
    tok, _ = load_local(BUNDLED, "float32")
    ids = _ids(tok, _prompts(args.prompts))
    runners, skipped = {}, {}
    for e in args.engines:
        try:
            runners[e] = ENGINES[e]()
        except Exception as err:  # noqa: BLE001 - a missing engine is reported, the others still run
            skipped[e] = f"{type(err).__name__}: {err}"
    for e in runners:  # warm-up: first calls allocate, convert, compile
        runners[e](ids[:2], 2, 4)
        runners[e](ids[:1], 1, 4)
    rounds: list[dict] = []
    for _ in range(args.rounds):
        r = {}
        for e, run in runners.items():
            t, s = run(ids[:args.single], 1, args.new)
            tb, sb = run(ids, args.batch, args.new)
            r[e] = {"single": t / s, "batched": tb / sb, "single_tokens": t, "batched_tokens": tb}
        rounds.append(r)
    ref = "torch-float32" if "torch-float32" in runners else next(iter(runners))
    res: dict = {"cpu": name, "flags": flags, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                 "prompts": args.prompts, "new_tokens": args.new, "single_prompts": args.single,
                 "batch": args.batch, "rounds": rounds, "skipped": skipped, "reference": ref,
                 "load_average": os.getloadavg()}
    summary = {}
    for e in runners:
        row = {}
        for mode in ("single", "batched"):
            v = [r[e][mode] for r in rounds]
            x = [r[e][mode] / r[ref][mode] for r in rounds]
            row[mode] = {"median": statistics.median(v), "min": min(v), "max": max(v),
                         "ratio_median": statistics.median(x), "ratio_min": min(x), "ratio_max": max(x)}
        summary[e] = row
    res["summary"] = summary
    print(f"SmolLM2-135M generation engines: {name}, {os.cpu_count()} cores, flags {' '.join(flags)}")
    print(f"{args.prompts} B2 prompts, exactly {args.new} new tokens, T 0.7 top-p 0.9; single-stream over "
          f"{args.single} prompts; batched at {args.batch}; {args.rounds} rounds, load {res['load_average'][0]:.1f}")
    print(f"{'engine':16s} {'single tok/s':>14s} {'× ' + ref:>20s} {'batched tok/s':>15s} {'× ' + ref:>20s}")
    for e, row in summary.items():
        s, b = row["single"], row["batched"]
        print(f"{e:16s} {s['median']:8.1f} ({s['min']:.0f}-{s['max']:.0f}) {s['ratio_min']:8.2f}-{s['ratio_max']:.2f}× "
              f"{b['median']:8.1f} ({b['min']:.0f}-{b['max']:.0f}) {b['ratio_min']:8.2f}-{b['ratio_max']:.2f}×")
    for e, why in skipped.items():
        print(f"{e:16s} skipped: {why}")
    peers = [e for e in PEERS if e in summary]
    mine = [e for e in backend_engines() if e in summary]
    if mine and peers:
        targets = {}
        for e in mine:
            for mode in ("single", "batched"):
                # per round: this backend engine against the best peer of that round (same load)
                x = [r[e][mode] / max(r[q][mode] for q in peers) for r in rounds]
                targets[f"{e}:{mode}"] = {"ratio_min": min(x), "ratio_max": max(x), "met": min(x) >= 0.95}
                print(f"{e} against the best peer ({'/'.join(peers)}), {mode}: {min(x):.2f}-{max(x):.2f}×")
        res["target_per_engine"] = targets
        best = {}
        for mode in ("single", "batched"):
            # the target: the backend, on the engine a user picks for the mode (all behind the
            # same interface, paired sampling and the generation cache working), ≥ the best peer
            x = [max(r[e][mode] for e in mine) / max(r[q][mode] for q in peers) for r in rounds]
            pick = max(mine, key=lambda e: statistics.median(r[e][mode] for r in rounds))
            best[mode] = {"engine": pick, "ratio_min": min(x), "ratio_max": max(x), "met": min(x) >= 1}
            print(f"target: the backend ≥ the best peer, {mode} (its fastest engine here: {pick}): "
                  f"{min(x):.2f}-{max(x):.2f}× ({'met' if min(x) >= 1 else 'within 5%' if min(x) >= 0.95 else 'not met'})")
        res["target"] = best
        if backend_engines()[0] != "torch-float32":
            print("(this CPU has bfloat16, so the backend's torch path runs torch-bfloat16; the target "
                  "is set for a CPU without it)")
    print(json.dumps(res))
    return res


if __name__ == "__main__":
    main()
