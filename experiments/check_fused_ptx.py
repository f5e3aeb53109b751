"""Compile the fused kernels for an NVIDIA GPU without one: registers and spills from ptxas.

    pip install triton          # not a dependency of mdl-jax: about 1 GB, for this check only
    PYTHONPATH=. python -m experiments.check_fused_ptx [--arch 90]

JAX lowers each kernel (``mdl_jax.engines.fused``) for CUDA to Triton IR on this CPU (cross-platform
lowering, as tests/test_fused.py does); PyPI's Triton then compiles that IR to PTX and a cubin for
sm_<arch>a, and ptxas reports registers per thread and spills for each block size × warps. That is
what chose the kernel's default (one record a thread: no spills) in a session without a GPU.
Caveats: PyPI's Triton is not the one inside jaxlib that a GPU run uses (their passes may differ),
and registers are not a timing: ``experiments/bench_gpu.py`` on a GPU is the measurement.
Prints one line per variant and a JSON object as the last line.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import subprocess
import tempfile

import jax
import jax.numpy as jnp

from mdl_jax import MDLConfig, config_grid
from mdl_jax.engines import fused

VARIANTS = ((64, 2, "ieee"), (128, 4, "ieee"), (256, 8, "ieee"), (256, 4, "ieee"), (512, 8, "ieee"),
            (128, 4, "tf32x3"))


def triton_ir() -> dict:
    """{variant name: (Triton IR text, num_warps)} for decide's kernel and the sweep kernel."""
    with fused.captured_triton_ir() as modules:
        cfg = MDLConfig()
        x = jax.ShapeDtypeStruct((1 << 20,), jnp.float32)
        names = []
        for block, warps, prec in VARIANTS:
            fused.decide_jit.trace(x, x, x, *fused.pack(cfg), st=fused.structure(cfg), interpret=False,
                                    block=block, num_warps=warps, precision=prec).lower(lowering_platforms=("cuda",))
            names.append((f"decide_b{block}_w{warps}_{prec}", warps))
        grid = config_grid(cfg, sigma=[0.1, 0.2, 0.3])
        xs = jax.ShapeDtypeStruct((1 << 18,), jnp.float32)
        fused.sweep_jit.trace(xs, xs, xs, jax.ShapeDtypeStruct((1 << 18,), bool),
                               jax.ShapeDtypeStruct((10, 1 << 18), jnp.float32), *fused.pack_batch(grid, 3),
                               st=fused.structure(grid), interpret=False, block=fused.BLOCK,
                               rec_block=fused.SWEEP_BLOCK, num_warps=fused.NUM_WARPS).lower(lowering_platforms=("cuda",))
        names.append((f"sweep_b{fused.BLOCK}_w{fused.NUM_WARPS}", fused.NUM_WARPS))
    return {n: (m.operation.get_asm(enable_debug_info=False), w) for (n, w), m in zip(names, modules)}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", type=int, default=90, help="compute capability (90: H100/H200)")
    args = p.parse_args(argv)
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # what the GPU path does (FMA contraction)
    import triton
    from triton.backends.compiler import GPUTarget

    ptxas = sorted(glob.glob(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas*")))
    if not ptxas:
        raise SystemExit("check_fused_ptx: this triton has no bundled ptxas")
    res = {"triton": triton.__version__, "jax": jax.__version__, "arch": args.arch, "variants": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (ir, warps) in triton_ir().items():
            src = os.path.join(tmp, name + ".ttir")
            with open(src, "w") as f:
                f.write(ir)
            kernel = triton.compile(src, target=GPUTarget("cuda", args.arch, 32),
                                    options={"num_warps": warps, "num_stages": 1})
            ptx = os.path.join(tmp, name + ".ptx")
            with open(ptx, "w") as f:
                f.write(kernel.asm["ptx"])
            for exe in ptxas:  # Triton bundles more than one; the older may not read this PTX version
                proc = subprocess.run([exe, f"--gpu-name=sm_{args.arch}a", "-v", ptx, "-o", os.devnull],
                                      capture_output=True, text=True, check=False)
                if proc.returncode == 0:
                    break
            else:
                raise SystemExit(f"check_fused_ptx: ptxas failed on {name}: {proc.stderr[-1000:]}")
            out = proc.stderr
            used = re.search(r"Used (\d+) registers", out)
            if used is None:
                raise SystemExit(f"check_fused_ptx: ptxas printed no register count for {name}: {out[-1000:]}")
            regs = int(used.group(1))
            spill = re.search(r"(\d+) bytes spill stores", out)
            row = {"registers": regs, "spill_store_bytes": int(spill.group(1)) if spill else 0,
                   "shared_bytes": kernel.metadata.shared,
                   "ptx_instructions": sum(1 for line in kernel.asm["ptx"].splitlines()
                                           if re.match(r"\s+(@%p\d+\s+)?[a-z][a-z0-9_.]*\s", line))}
            res["variants"][name] = row
            print(f"{name:28s} registers {regs:3d}  spill stores {row['spill_store_bytes']:5d} B  "
                  f"shared {row['shared_bytes']:6d} B  PTX instructions {row['ptx_instructions']}")
    print(json.dumps(res))
    return res


if __name__ == "__main__":
    main()
