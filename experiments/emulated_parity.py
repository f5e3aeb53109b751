"""The embedding backends' parity on a CPU this machine does not have, run under an emulator: dump each
backend's vectors and gate actions on ``bench_embed --quick``'s texts and rows, natively and under
emulation, then compare. Parity only: an emulator's timings say nothing of the real CPU.

    python -m experiments.emulated_parity dump native.npz torch onnx        # natively
    scripts/emulate_avx2.sh python -m experiments.emulated_parity dump emu.npz onnx   # as an AVX2-only EPYC
    python -m experiments.emulated_parity compare emu.npz:onnx native.npz:torch

``dump OUT BACKEND...``  vectors of the 526 texts (``Embedder.model.encode``, batch 64, as ``bench_embed``)
                         and ``MemoryGate.columns``'s actions on the 120 rows, per backend, with what ran
                         (the backend "auto" picked, its warnings) and what the process saw of the CPU
                         (NumPy's runtime features, torch's capability, the native kernel's variant).
``compare A:b B:c``      min / mean cosine of b's vectors in A to c's in B, vectors bit-equal, and the share
                         of gate actions equal (parity: cosine ≥ 0.999, ≥ 99.5 % of actions).
"""

from __future__ import annotations

import json
import sys
import tempfile
import warnings

import numpy as np


def dump(out: str, backends: list[str]) -> None:
    """Write ``out`` (.npz): per backend b, ``b/vecs`` (526, 384) float32 and ``b/actions`` (120,) int,
    and ``info`` (JSON: what ran, what the process saw of the CPU). Raises ValueError for an unknown
    backend (``Embedder``'s message); nothing is written unless every backend ran."""
    from experiments.bench_embed import run_data
    from mdl_jax.engines import native
    from mdl_jax.gate.core import MemoryGate
    from mdl_jax.signals.embeddings import Embedder

    rows, texts, _, _ = run_data(60)
    arrays: dict[str, np.ndarray] = {}
    info: dict = {"n_texts": len(texts), "n_rows": len(rows), "numpy": native.numpy_features(),
                  "native_isa": native.isa(), "backends": {}}
    try:
        import torch

        info["torch"] = torch.backends.cpu.get_cpu_capability()
    except ImportError:
        pass
    for b in backends:
        with tempfile.TemporaryDirectory(prefix=f"emulated-parity-{b}-") as work, \
                warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            e = Embedder(cache_dir=work, backend=b)
            arrays[f"{b}/vecs"] = np.asarray(e.model.encode(texts, batch_size=64), np.float32)
            cols = MemoryGate(embedder=e).columns([q for q, _ in rows], [m for _, m in rows])
            arrays[f"{b}/actions"] = np.asarray(cols["action"])
            info["backends"][b] = {"ran": e.backend, "model_id": e.model_id,
                                   "warnings": [str(w.message)[:300] for w in caught]}
        print(json.dumps({b: info["backends"][b]}), flush=True)
    arrays["info"] = np.array(json.dumps(info))
    np.savez(out, **arrays)  # type: ignore[arg-type]  # numpy stubs read a keyword as allow_pickle
    print(f"wrote {out}: {', '.join(backends)} on {len(texts)} texts and {len(rows)} rows; native kernel "
          f"{info['native_isa']}, torch {info.get('torch')}")


def compare(a: str, b: str) -> dict:
    """``a`` and ``b`` as ``FILE.npz:BACKEND``: the parity of a's vectors and actions to b's (same texts
    and rows, in order). Raises OSError for a missing file, KeyError for a backend the file lacks,
    ValueError for arrays of different shapes."""
    (fa, ba), (fb, bb) = (s.rsplit(":", 1) for s in (a, b))
    A, B = np.load(fa), np.load(fb)
    va, vb = A[f"{ba}/vecs"], B[f"{bb}/vecs"]
    if va.shape != vb.shape:
        raise ValueError(f"vectors of shape {va.shape} in {a} against {vb.shape} in {b}: not the same texts")
    cos = (va * vb).sum(1) / (np.linalg.norm(va, axis=1) * np.linalg.norm(vb, axis=1))
    same = A[f"{ba}/actions"] == B[f"{bb}/actions"]
    res = {"n_texts": len(cos), "min_cos": float(cos.min()), "mean_cos": float(cos.mean()),
           "bit_equal_vectors": int((va == vb).all(1).sum()), "n_rows": len(same),
           "actions_equal": float(same.mean())}
    ok = res["min_cos"] >= 0.999 and res["actions_equal"] >= 0.995
    print(f"{a} against {b}: {len(cos)} texts, min cosine {res['min_cos']:.7f}, mean {res['mean_cos']:.7f}, "
          f"{res['bit_equal_vectors']} vectors bit-equal; {len(same)} rows, actions equal "
          f"{100 * res['actions_equal']:.2f}%: parity {'met' if ok else 'NOT met'} (cosine ≥ 0.999, ≥ 99.5%)")
    print(json.dumps(res))
    return res


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if len(argv) >= 3 and argv[0] == "dump":
            dump(argv[1], argv[2:])
        elif len(argv) == 3 and argv[0] == "compare" and all(":" in s for s in argv[1:]):
            compare(argv[1], argv[2])
        else:
            print(__doc__, file=sys.stderr)
            return 2
    except (OSError, KeyError, ValueError) as e:  # a missing file, a backend it lacks, an unknown backend
        print(f"emulated_parity: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
