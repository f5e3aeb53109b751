"""How close can int8 matrix products bring MiniLM's vectors to float32's? A simulation, not a backend.

The target is an embedding path ≥ 2.5× torch's uncached gate rows/s with cosine ≥ 0.999 to torch's
vectors; without bfloat16 only int8 arithmetic offers that speed, and ONNX Runtime's dynamic int8 graph
misses the parity (min cosine 0.954, docs/benchmarks.md). This probe asks whether any common W8A8 scheme
could meet it before anyone builds one: it quantises and dequantises ("fake quantisation") the inputs
and weights of every ``nn.Linear`` of the bundled MiniLM in torch, float32 otherwise, so the vectors
carry exactly the rounding an int8 kernel with that scheme would add (the int32 accumulation itself is
exact), and reports the cosine to the float32 vectors over the bundled texts, by token count.

Schemes (weights: int8 symmetric per output channel in all of them):
  per-tensor       activations int8 with one scale per tensor (what ONNX Runtime's dynamic graph does)
  per-token        one scale per token (row) of the activations
  +smooth a        SmoothQuant: input channel j divided by s_j = max|x_j|^a / max|W_j|^(1-a) (calibrated
                   on every fifth text), weight column j multiplied by it
  +outliers k      the k input channels of largest calibrated max|x_j| kept in float32 (their weight
                   columns too): LLM.int8()-style mixed precision
  weights only / activations only   one side quantised, to see which side the error comes from

    python -m experiments.int8_parity_probe            # every scheme (about 4 min on 2 cores)

The CPU does not matter for the result (float32 arithmetic throughout); no timing is taken.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

BINS = ((0, 8), (8, 16), (16, 10_000))  # token counts (with [CLS] and [SEP])


def _q(x, dim):
    """Symmetric int8 fake quantisation with one scale per slice along ``dim``."""
    s = x.abs().amax(dim=dim, keepdim=True).clamp(min=1e-8) / 127
    return (x / s).round().clamp(-127, 127) * s


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--questions", type=int, default=300, help="questions per dataset (texts: theirs and their stores')")
    args = ap.parse_args(argv)

    import torch
    from sentence_transformers import SentenceTransformer

    from experiments.bench_embed import bundled_rows, distinct_texts
    from mdl_jax.signals.embeddings import resolve_model

    rows = bundled_rows(args.questions)
    texts = distinct_texts(rows)
    model = SentenceTransformer(resolve_model("all-MiniLM-L6-v2")[0], device="cpu")
    ntok = np.array([len(x) for x in model.tokenizer(texts, truncation=True, max_length=model.max_seq_length)["input_ids"]])
    with torch.no_grad():
        ref = model.encode(texts, batch_size=64, normalize_embeddings=True)
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    w0 = {n: m.weight.detach().clone() for n, m in linears}

    amax: dict = {}  # per input channel max |x| of each Linear, on every fifth text

    def calib(name):
        def hook(mod, inp, out):
            x = inp[0].detach().abs().reshape(-1, inp[0].shape[-1]).amax(0)
            amax[name] = torch.maximum(amax[name], x) if name in amax else x
        return hook

    hooks = [m.register_forward_hook(calib(n)) for n, m in linears]
    with torch.no_grad():
        model.encode(texts[::5], batch_size=64)
    for h in hooks:
        h.remove()

    def run(acts: str | None, weights: bool, alpha: float | None = None, k: int = 0):
        hooks = []
        for n, m in linears:
            s = torch.ones(w0[n].shape[1])
            if alpha is not None:
                s = (amax[n].clamp(min=1e-5) ** alpha / w0[n].abs().amax(0).clamp(min=1e-5) ** (1 - alpha)).clamp(min=1e-5)
            keep = torch.zeros(w0[n].shape[1], dtype=torch.bool)  # float32 input channels
            if k:
                keep[torch.topk(amax[n] / s, k).indices] = True
            w = w0[n] * s
            if weights:
                w[:, ~keep] = _q(w[:, ~keep], dim=1)
            m.weight.data = w

            def pre(mod, inp, s=s, keep=keep):
                x = inp[0] / s
                if acts is None:
                    return (x,)
                xq = x.clone()
                part = x[..., ~keep]
                xq[..., ~keep] = _q(part, dim=-1) if acts == "token" else _q(part.reshape(-1), dim=0).reshape(part.shape)
                return (xq,)
            hooks.append(m.register_forward_pre_hook(pre))
        try:
            with torch.no_grad():
                v = model.encode(texts, batch_size=64, normalize_embeddings=True)
        finally:
            for h in hooks:
                h.remove()
            for n, m in linears:
                m.weight.data = w0[n].clone()
        return (v * ref).sum(1)

    schemes: list[tuple[str, dict]] = [("per-tensor", dict(acts="tensor", weights=True)),
               ("per-token", dict(acts="token", weights=True)),
               ("per-token +smooth 0.5", dict(acts="token", weights=True, alpha=0.5)),
               ("per-token +smooth 0.65", dict(acts="token", weights=True, alpha=0.65)),
               ("per-token +outliers 16", dict(acts="token", weights=True, k=16)),
               ("per-token +outliers 32", dict(acts="token", weights=True, k=32)),
               ("per-token +smooth 0.5 +outliers 16", dict(acts="token", weights=True, alpha=0.5, k=16)),
               ("weights only", dict(acts=None, weights=True)),
               ("weights only +outliers 16", dict(acts=None, weights=True, k=16)),
               ("activations only (per-token)", dict(acts="token", weights=False))]
    def label(a, b):
        return f"{a}+" if b >= BINS[-1][1] else f"{a}-{b - 1}"

    print(f"{len(texts)} bundled texts ({np.mean(ntok):.1f} tokens on average; "
          + ", ".join(f"{np.mean((ntok >= a) & (ntok < b)):.0%} with {label(a, b)}" for a, b in BINS)
          + " tokens); cosine to float32's vectors, target ≥ 0.999 for every text\n")
    head = f"{'scheme':38s} {'min':>8s} {'mean':>8s} " + " ".join(f"{'min ' + label(a, b):>10s}" for a, b in BINS)
    print(head + "  worst text")
    out = {}
    for name, kw in schemes:
        c = run(**kw)
        worst = int(np.argmin(c))
        by_len = [float(c[(ntok >= a) & (ntok < b)].min()) for a, b in BINS]
        out[name] = {"min": float(c.min()), "mean": float(c.mean()), "min_by_tokens": by_len}
        print(f"{name:38s} {c.min():8.5f} {c.mean():8.5f} " + " ".join(f"{x:10.5f}" for x in by_len)
              + f"  {texts[worst][:30]!r} ({ntok[worst]} tokens)", flush=True)
    print(json.dumps({"n_texts": len(texts), "schemes": out}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
