"""How much an embedding backend's process grows over every batch shape its batching can make.

OpenVINO keeps compiled kernels for each input shape it has run; ONNX Runtime does not keep much. This
runs every shape ``OnnxEncoder.plan`` can produce for texts of 2 to ``max_seq_length`` tokens (batches
of at most 64 texts), each once, in a fresh child process per backend, and reports the resident set's
growth (VmRSS, after a warm-up batch) against the number of shapes run.

    python -m experiments.bench_embed_memory                 # onnx, openvino-bf16 (bucketed shapes)
    python -m experiments.bench_embed_memory --exact         # also openvino-bf16 at exact shapes (~2,100; slow)

The CPU's model name and ISA flags are printed first: name them beside any figure you quote. Last line:
JSON.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import tempfile
import time
from pathlib import Path

from experiments.bench_embed import cpu_flags


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def shapes(enc, bucketed: bool, batch_size: int = 64) -> list[tuple[int, int]]:
    """Every (rows, tokens) shape ``enc.plan`` makes for texts of 2..max_seq_length tokens: for each
    length, a batch it fills and each remainder a run of such texts can leave."""
    out = set()
    for n in range(2, enc.max_seq_length + 1):
        _, L, R = enc.plan([n] * 4096, batch_size, bucketed=bucketed)[0]
        out.add((R, L))
        for rest in range(1, R):
            _, L2, R2 = enc.plan([n] * rest, batch_size, bucketed=bucketed)[0]
            out.add((R2, L2))
    return sorted(out)


def _child(backend: str, cache: str, bucketed: bool, q) -> None:
    import numpy as np

    from mdl_jax.signals import onnx_encoder
    from mdl_jax.signals.embeddings import DEFAULT_MODEL, resolve_model

    try:
        enc = onnx_encoder.load(resolve_model(DEFAULT_MODEL)[0], cache, backend)
    except Exception as e:  # noqa: BLE001 - its extra missing, or no bfloat16 here: say so
        q.put({"backend": backend, "error": f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"})
        return
    todo = shapes(enc, bucketed)

    def feed(R: int, L: int) -> dict:
        return {"input_ids": np.ones((R, L), np.int64), "attention_mask": np.ones((R, L), np.int64),
                "token_type_ids": np.zeros((R, L), np.int64)}

    enc._infer(feed(1, 8))  # the runtime's own first-call allocations, outside the growth
    before = _rss_mb()
    t0 = time.perf_counter()
    for R, L in todo:
        enc._infer(feed(R, L))
    q.put({"backend": backend, "bucketed": bucketed, "shapes": len(todo), "rss_before_mb": round(before, 1),
           "growth_mb": round(_rss_mb() - before, 1), "seconds": round(time.perf_counter() - t0, 1)})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--exact", action="store_true",
                    help="also run openvino-bf16 at exact (unbucketed) shapes, as before the bucketing (slow)")
    args = ap.parse_args(argv)
    cpu = cpu_flags()
    print(f"CPU: {cpu['model']}, {cpu['cores']} cores, flags {' '.join(cpu['flags'])}")
    # each backend as the encoder batches for it: ONNX Runtime at exact shapes, OpenVINO bucketed
    runs = [("onnx", False), ("openvino-bf16", True)] + ([("openvino-bf16", False)] if args.exact else [])
    ctx = mp.get_context("spawn")  # a fresh process per backend: OpenVINO does not survive a fork
    res = []
    with tempfile.TemporaryDirectory(prefix="bench-embed-mem-") as cache:
        for backend, bucketed in runs:
            q = ctx.Queue()
            p = ctx.Process(target=_child, args=(backend, cache, bucketed, q))
            p.start()
            r = q.get(timeout=3600)
            p.join()
            res.append(r)
            name = f"{backend} ({'bucketed' if bucketed else 'exact'} shapes)"
            if "error" in r:
                print(f"{name}: skipped ({r['error']})")
                continue
            print(f"{name:32s} {r['shapes']:5d} shapes: +{r['growth_mb']:7.1f} MB over "
                  f"{r['rss_before_mb']:.0f} MB ({r['seconds']:.0f} s)", flush=True)
    print(json.dumps({"cpu": cpu, "runs": res}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
