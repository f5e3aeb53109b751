"""Every GPU check of the controller in one call (the device budget is 15 minutes a session).

    PYTHONPATH=. python3 -m experiments.bench_gpu [--n 100000000] [--parity-n 1000000] [--reps 5]
    python -m experiments.bench_gpu --allow-cpu --n 100000 --parity-n 10000   # smoke test, no GPU

(1) Parity: the same records decided on the CPU (the native kernel; and the pure-JAX default) and
    on the GPU: the fused Pallas kernel (``mdl_jax.engines.fused``, what ``decide`` runs
    there) and the pure-JAX path (every product at HIGHEST precision; the same graph at DEFAULT
    precision, TF32 matmuls, beside it to show what HIGHEST buys). Target: every float within 1e-5
    of the CPU, 0 actions differing.
(2) Throughput at N = 10^8 on the device, in one run: the fused kernel alone, ``decide`` (the pure-JAX
    default) validated and unvalidated, ``decide(..., engine="auto")`` (the fused kernel on a GPU), and
    plain ``jit(vmap(decide_one))``. Targets: ``decide`` ≥ 10^10/s validated, ≥ 4× plain vmap. Then
    the kernel at a few block sizes × warps (its defaults are a guess until measured here), and with
    TF32x3 products (opt-in; its parity is measured in (1)).
(3) The sweep: the σ sweep (441 configs × 10 resamples × 3,600 records) with engine="fused" and
    engine="jax", first call and warm; and 441 configs × 2^20 records × 10 weight vectors for
    (config, record) pairs/s, end to end and for the fused kernel alone. Target ≥ 10^10 pairs/s.
(4) Tuning (15 runs × 500 steps on 3,600 records, gates and every field, one program), first and warm.

Prints each figure with its target, then one JSON object as the last line. On a GPU a failing section
(the Pallas kernel not lowering on this jax, say) is reported with its error and the rest still runs,
so one device run is never wasted. Exit status 2 when no GPU is present, unless ``--allow-cpu``: that
runs the same code on the CPU, the fused kernel in Pallas interpret mode at small sizes, and lets
every error through (so a test of this script fails loudly).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from os import environ as _environ

import jax
import jax.numpy as jnp
import numpy as np

from mdl_jax import MDLConfig, decide, decide_one
from mdl_jax.controller import decision as _decision
from mdl_jax.engines import fused, native

FLOATS = ("C", "alpha", "C_final", "v_meta", "energies", "norm", "g_A")
TARGETS = {"parity_abs": 1e-5, "parity_action_mismatches": 0, "decisions_per_s": 1e10,
           "fused_over_plain_vmap": 4.0, "sweep_pairs_per_s": 1e10}


def _accelerator(allow_cpu: bool):
    for kind in ("gpu", "cuda", "rocm"):
        try:
            return jax.devices(kind)[0]
        except RuntimeError:
            continue
    return jax.devices("cpu")[0] if allow_cpu else None


def _max_diffs(a, b) -> dict:
    out = {f: float(np.max(np.abs(np.asarray(getattr(a, f), np.float64)
                                  - np.asarray(getattr(b, f), np.float64)))) for f in FLOATS}
    out["action_mismatches"] = int(np.sum(np.asarray(a.action) != np.asarray(b.action)))
    return out


def _with_precision(precision):
    """A fresh jitted pure-JAX decide whose products use ``precision`` (decision.PRECISION at trace time)."""
    def f(M, R, A, cfg):
        saved = _decision.PRECISION
        _decision.PRECISION = precision
        try:
            return jax.vmap(decide_one, in_axes=(0, 0, 0, None))(M, R, A, cfg)
        finally:
            _decision.PRECISION = saved
    return jax.jit(f)


def _rate(fn, n: int, reps: int) -> float:
    jax.block_until_ready(fn())
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        ts.append(time.perf_counter() - t)
    return n / statistics.median(ts)


_PROBE = """
import numpy as np, jax
from mdl_jax import MDLConfig, config_grid
from mdl_jax.engines import fused
x = np.random.default_rng(0).uniform(size=(3, 5000)).astype(np.float32)
jax.block_until_ready(fused.decide(*x, MDLConfig()))
g = config_grid(MDLConfig(), sigma=[0.1, 0.2])
w = np.ones((1, 5000), np.float32)
print(fused.sweep_engine(g, 2, 5000, interpret=False)(*x, x[0] > 0.5, w)[1].sum())
"""


def _probe_fused(timeout: float = 240.0) -> str | None:
    """Compile and run both fused kernels once in a child process: None when they work, else why not.
    A compiler that crashes (a signal, not an exception) then costs the child, not this run."""
    import os
    import subprocess

    try:
        # this process holds most of the GPU's memory already (JAX preallocates 75%): the child
        # allocates on demand
        env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
        proc = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=timeout,
                              env=env, check=False)
    except subprocess.TimeoutExpired:
        return f"probe timed out after {timeout:.0f} s"
    if proc.returncode == 0:
        return None
    return f"probe exit status {proc.returncode}: {(proc.stderr or proc.stdout)[-3000:]}"


class _Sections:
    """Runs each check; on a GPU a failure is recorded (with its error) and the next check runs."""

    def __init__(self, res: dict, strict: bool):
        self.res, self.strict = res, strict

    def run(self, name: str, fn, fused_section: bool = False) -> None:
        t = time.perf_counter()
        if fused_section and fused.mode() == "off":
            self.res.setdefault("errors", {})[name] = "skipped: the fused kernel is off (see fused_probe)"
            return
        try:
            fn()
            print(f"[{name}] done in {time.perf_counter() - t:.1f} s", flush=True)
        except Exception as e:  # noqa: BLE001 - report whatever failed, keep the device run useful
            if self.strict:
                raise
            msg = f"{type(e).__name__}: {e}"
            self.res.setdefault("errors", {})[name] = msg[:4000]
            print(f"[{name}] FAILED: {msg[:2000]}", flush=True)
            traceback.print_exc(limit=4)
        self.res.setdefault("section_s", {})[name] = round(time.perf_counter() - t, 2)


def _met(value, target, higher=True) -> str:
    if value is None:
        return "not measured"
    ok = value >= target if higher else value <= target
    return "met" if ok else "NOT met"


def main(argv=None) -> dict:
    """Run the checks (see the module docstring); returns the results printed as the last line."""
    saved = _environ.get(fused.ENV_SWITCH)
    try:
        return _main(argv)
    finally:   # the pallas engine's interpret mode (set off a GPU) ends with the run: tests call main in-process
        if saved is None:
            _environ.pop(fused.ENV_SWITCH, None)
        else:
            _environ[fused.ENV_SWITCH] = saved


def _main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=100_000_000, help="records for the throughput check")
    p.add_argument("--parity-n", type=int, default=1_000_000, help="records for the parity check")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--allow-cpu", action="store_true", help="run on the CPU when no GPU is present")
    p.add_argument("--sweep-configs", type=int, default=441, help="σ values of the sweep checks")
    p.add_argument("--sweep-n", type=int, default=None,
                   help="records of the pairs/s sweep check (default 2^20 on a GPU, 3600 on the CPU)")
    p.add_argument("--tune-steps", type=int, default=500, help="steps of the tuning check")
    args = p.parse_args(argv)
    dev = _accelerator(args.allow_cpu)
    if dev is None:
        print("bench_gpu: no GPU visible to JAX (jax.devices() = "
              f"{jax.devices()}); install mdl-jax[cuda] on a GPU machine", file=sys.stderr)
        sys.exit(2)
    on_gpu = dev.platform != "cpu"
    # Off the GPU the fused kernel runs in Pallas interpret mode: correct, slow, so kept small there.
    interpret = not on_gpu
    if interpret:   # the pallas engine by name (sweep(engine="pallas")) then runs in interpret mode too
        _environ[fused.ENV_SWITCH] = "interpret"
    # (the CPU sizes reuse the programs compiled for parity and for the σ sweep: this keeps the test
    # that runs this script short)
    n_fused = args.n if on_gpu else min(args.n, args.parity_n)
    sweep_n = args.sweep_n or (1 << 20 if on_gpu else 3600)
    cfg = MDLConfig()
    res: dict = {"device": str(dev), "device_kind": getattr(dev, "device_kind", ""), "jax": jax.__version__,
                 "n": args.n, "n_fused": n_fused, "fused_interpret": interpret, "targets": TARGETS,
                 "fused_block": fused.BLOCK, "fused_num_warps": fused.NUM_WARPS}
    sections = _Sections(res, strict=not on_gpu)
    cpu = jax.devices("cpu")[0]
    if on_gpu:
        t = time.perf_counter()
        why = _probe_fused()
        res["fused_probe"] = {"ok": why is None, "s": round(time.perf_counter() - t, 1), "error": why}
        print(f"[fused probe] {'ok' if why is None else 'FAILED: ' + why[-2000:]} "
              f"({res['fused_probe']['s']} s)", flush=True)
        if why is not None:
            # keep this process off the kernel: decide and sweep run pure JAX, the fused rows say why
            import os

            os.environ[fused.ENV_SWITCH] = "0"

    # (1) parity, CPU vs device
    x = np.random.default_rng(0).uniform(size=(3, args.parity_n)).astype(np.float32)
    xc = [jax.device_put(v, cpu) for v in x]
    with jax.default_device(dev):
        # uncommitted (on the default device): the same compiled programs as the throughput arrays
        xd = [jax.device_put(v) for v in x]
    par: dict = {}
    res["parity"] = par
    ref: dict = {}

    def parity_xla():
        # the default's program unvalidated; on the committed CPU arrays it runs on the CPU
        ref["pure"] = decide(*xc, cfg, validate=False)
        # The native kernel, placed on the CPU explicitly: on a GPU machine decide() runs on the GPU.
        ref["native"] = ref["pure"]
        if native.load():
            with jax.default_device(cpu):
                ref["native"] = native.decide_variant(native.isa(), *xc, cfg)
        res["native_kernel"] = native.status()
        dev_hi = decide(*xd, cfg, validate=False)
        par["cpu_native_vs_device_highest"] = _max_diffs(ref["native"], dev_hi)
        par["cpu_pure_jax_vs_device_highest"] = _max_diffs(ref["pure"], dev_hi)
        par["cpu_pure_jax_vs_device_default_precision"] = _max_diffs(
            ref["pure"], _with_precision(jax.lax.Precision.DEFAULT)(*xd, cfg))
        res["parity_max_abs_diff"] = max(v for k, v in par["cpu_pure_jax_vs_device_highest"].items()
                                         if k in FLOATS)

    def parity_fused():
        with jax.default_device(dev):
            out = fused.decide(*xd, cfg, interpret=interpret)
        par["cpu_native_vs_fused"] = _max_diffs(ref["native"], out)
        par["cpu_pure_jax_vs_fused"] = _max_diffs(ref["pure"], out)
        worst = max(max(v[f] for f in FLOATS) for k, v in par.items() if k.endswith("_fused"))
        res["fused_parity_max_abs_diff"] = worst
        res["fused_parity_action_mismatches"] = max(v["action_mismatches"] for k, v in par.items()
                                                    if k.endswith("_fused"))

    def parity_fused_tf32x3():
        # the opt-in tensor-core products (fused.PRECISIONS): measured here before any default change
        with jax.default_device(dev):
            out = fused.decide(*xd, cfg, precision="tf32x3")
        par["cpu_native_vs_fused_tf32x3"] = _max_diffs(ref["native"], out)

    sections.run("parity_xla", parity_xla)
    if "pure" in ref:
        sections.run("parity_fused", parity_fused, fused_section=True)
        if on_gpu:
            sections.run("parity_fused_tf32x3", parity_fused_tf32x3, fused_section=True)
    # free the parity arrays before the throughput runs; emptied, not deleted, because the closures above
    # still name them
    ref.clear()
    xc.clear()
    xd.clear()

    # (2) throughput at N on the device; inputs generated there
    thr: dict = {}
    res["throughput"] = thr
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    with jax.default_device(dev):
        M, R, A = (jax.random.uniform(k, (args.n,), jnp.float32) for k in (k1, k2, k3))
    Mf, Rf, Af = M[:n_fused], R[:n_fused], A[:n_fused]
    plain = jax.jit(jax.vmap(decide_one, in_axes=(0, 0, 0, None)))

    def rate(key, fn, n, fused_section=False):
        def run():
            thr[key] = _rate(fn, n, args.reps)
            print(f"  {key}: {thr[key]:.3e} /s", flush=True)
        sections.run(key, run, fused_section)

    rate("fused_kernel", lambda: fused.decide(Mf, Rf, Af, cfg, interpret=interpret), n_fused, True)
    rate("decide", lambda: decide(M, R, A, cfg), args.n)
    rate("decide_unvalidated", lambda: decide(M, R, A, cfg, validate=False), args.n)
    rate("decide_auto", lambda: decide(M, R, A, cfg, engine="auto"), args.n)
    # which engine decide(engine="auto") took: the fused kernel (GPU), the native kernel (CPU), or pure
    # JAX after a failure (the default, decide(...), is always pure JAX)
    res["decide_path"] = ("fused" if on_gpu and fused.failed() is None and fused.mode() != "off"
                          else "native" if not on_gpu and native.status().get("ok") else "xla")
    res["fused_failed"] = fused.failed()
    rate("plain_vmap", lambda: plain(M, R, A, cfg), args.n)
    if "fused_kernel" in thr and "plain_vmap" in thr:
        thr["ratio_fused_kernel_vs_plain_vmap"] = thr["fused_kernel"] / thr["plain_vmap"]
    if "decide" in thr and "plain_vmap" in thr:
        thr["ratio_decide_vs_plain_vmap"] = thr["decide"] / thr["plain_vmap"]

    if on_gpu and fused.failed() is None and fused.mode() != "off":
        scan: dict = {}
        res["fused_block_scan"] = scan
        # one record a thread (64 × 2, 128 × 4, 256 × 8: no spills in ptxas), two (256 × 4, 512 × 8:
        # spills), and the tensor-core products
        for block, warps, prec in ((64, 2, "ieee"), (128, 4, "ieee"), (256, 8, "ieee"), (256, 4, "ieee"),
                                   (512, 8, "ieee"), (128, 4, "tf32x3"), (256, 8, "tf32x3")):
            key = f"block{block}_warps{warps}_{prec}"
            sections.run(f"scan_{key}", lambda b=block, w=warps, k=key, p=prec: scan.__setitem__(
                k, _rate(lambda: fused.decide(M, R, A, cfg, block=b, num_warps=w, precision=p), args.n,
                         args.reps)), True)
    M = R = A = Mf = Rf = Af = None  # free the N-record device arrays before the next checks

    # (3) sweep and (4) tuning on the device (random records: only speed is measured)
    from mdl_jax import bootstrap_weights, config_grid, sweep
    from mdl_jax.controller.tuning import FIELD_SETS, TuneSettings, tune_many

    rng = np.random.default_rng(1)
    Ms, Rs, As = rng.uniform(size=(3, 3600)).astype(np.float32)
    ys = rng.integers(0, 2, 3600)
    K = args.sweep_configs
    grid = config_grid(cfg, sigma=np.linspace(0.05, 0.5, K))
    w = bootstrap_weights(3600, 10, 0)

    def sigma_sweep(engine):
        def run():
            t = time.perf_counter()
            first = sweep(Ms, Rs, As, grid, adopt=ys, weights=w, engine=engine)
            first_s = time.perf_counter() - t
            warm = _rate(lambda: sweep(Ms, Rs, As, grid, adopt=ys, weights=w, engine=engine).counts,
                         K * 3600, args.reps)
            res[f"sweep_sigma_{engine}"] = {"first_s": first_s, "pairs_per_s": warm,
                                            "decisions_per_s": warm * 10, "result": first}
        return run

    xb = rng.uniform(size=(3, sweep_n)).astype(np.float32)
    yb = rng.integers(0, 2, sweep_n)
    wb = rng.integers(0, 3, (10, sweep_n)).astype(np.float32)  # 10 resample-like integer weight vectors

    def big_sweep(engine):
        def run():
            out = sweep(*xb, grid, adopt=yb, weights=wb, engine=engine)
            res[f"sweep_pairs_{engine}"] = {
                "pairs_per_s": _rate(lambda: sweep(*xb, grid, adopt=yb, weights=wb, engine=engine).counts,
                                     K * sweep_n,
                                     min(args.reps, 3)),
                "result": out}
        return run

    def fused_sweep_kernel():
        # the kernel alone on device-resident records: what the engine costs without the host's passes
        packed = [jax.device_put(a) for a in fused.pack_batch(grid, K)]
        xs = [jax.device_put(a) for a in (*xb, yb.astype(bool), wb)]
        st = fused.structure(grid)
        rec_block = min(fused.SWEEP_BLOCK, fused.pow2_at_least(sweep_n, fused.BLOCK))
        call = lambda: fused.sweep_jit(*xs, *packed, st=st, interpret=interpret,  # noqa: E731
                                        block=min(fused.BLOCK, rec_block), rec_block=rec_block,
                                        num_warps=fused.NUM_WARPS)
        res["sweep_fused_kernel_pairs_per_s"] = _rate(call, K * sweep_n, args.reps)

    with jax.default_device(dev):
        sections.run("sweep_sigma_fused", sigma_sweep("pallas"), True)
        sections.run("sweep_sigma_jax", sigma_sweep("jax"))
        sections.run("sweep_pairs_fused", big_sweep("pallas"), True)
        sections.run("sweep_pairs_jax", big_sweep("jax"))
        sections.run("sweep_fused_kernel", fused_sweep_kernel, True)
        # the engine sweep(engine="auto") takes here, under the key earlier versions printed
        res["sweep_sigma"] = res.get("sweep_sigma_fused" if on_gpu else "sweep_sigma_jax")
        for kind in ("sweep_sigma", "sweep_pairs"):
            a, b = res.get(f"{kind}_fused"), res.get(f"{kind}_jax")
            if a and b:
                ra, rb = a.pop("result"), b.pop("result")
                res[f"{kind}_fused_vs_jax"] = {
                    "counts_equal": bool(np.array_equal(ra.counts, rb.counts)),
                    "counts_max_abs_diff": float(np.max(np.abs(ra.counts - rb.counts))),
                    "mean_C_final_max_abs_diff": float(np.max(np.abs(ra.mean_C_final - rb.mean_C_final)))}
            for r in (a, b):
                if r:
                    r.pop("result", None)
        wt = np.stack([(np.arange(3600) % 5 != f).astype(np.float32) for f in range(5)] * 3)
        for fs in ("gates", "all"):
            def tune(fs=fs):
                kw = dict(train_weights=wt, val_weights=np.zeros_like(wt), field_sets=[FIELD_SETS[fs]] * 15,
                          seeds=[0] * 5 + [1] * 5 + [2] * 5, settings=TuneSettings(steps=args.tune_steps))
                t = time.perf_counter()
                tune_many(Ms, Rs, As, ys, **kw)
                first = time.perf_counter() - t
                t = time.perf_counter()
                tune_many(Ms, Rs, As, ys, **kw)
                res[f"tune_{fs}"] = {"first_s": first, "warm_s": time.perf_counter() - t}
            sections.run(f"tune_{fs}", tune)

    _print(res, args, K, sweep_n)
    print(json.dumps(res, default=str))
    return res


def _print(res: dict, args, K: int, sweep_n: int) -> None:
    print(f"\nMDL controller GPU checks on {res['device']} ({res['device_kind']}), jax {res['jax']}"
          + (" [CPU: fused kernel in Pallas interpret mode, small sizes]" if res["fused_interpret"] else ""))
    for k, v in res["parity"].items():
        worst = max(v[f] for f in FLOATS)
        line = f"parity {k:42s} max |Δ| {worst:.2e}  actions differing {v['action_mismatches']}"
        if k.endswith("_fused") or k.endswith("_tf32x3"):
            ok = max(v[f] for f in FLOATS) <= TARGETS["parity_abs"] and v["action_mismatches"] == 0
            line += f"   target ≤ 1e-5, 0 differing: {'met' if ok else 'NOT met'}"
        print(line)
    thr = res["throughput"]
    rows = ("fused_kernel", "decide", "decide_unvalidated", "decide_auto", "plain_vmap")
    for k in rows:
        n = res["n_fused"] if k == "fused_kernel" else res["n"]
        v = thr.get(k)
        tgt = ""
        if k == "decide":
            tgt = (f"   target ≥ 1e10/s: {_met(v, TARGETS['decisions_per_s'])} "
                   f"(path: {res.get('decide_path')})")
        fig = "not measured (see the errors below)" if v is None else f"{v:.3e} /s"
        print(f"throughput N={n:,} {k:22s} {fig}{tgt}")
    for k in ("ratio_fused_kernel_vs_plain_vmap", "ratio_decide_vs_plain_vmap"):
        v = thr.get(k)
        print(f"{k:42s} " + ("–" if v is None else f"{v:.2f}×") + f"   target ≥ 4×: {_met(v, 4.0)}")
    for k, v in res.get("fused_block_scan", {}).items():
        print(f"fused kernel {k:20s} {v:.3e} /s")
    for engine in ("fused", "jax"):
        s = res.get(f"sweep_sigma_{engine}")
        if s:
            print(f"sweep σ ({K} × 10 × 3,600), engine={engine:5s}: first {s['first_s']:.2f} s, "
                  f"{s['pairs_per_s']:.3e} pairs/s warm "
                  f"({s['decisions_per_s']:.3e} decisions/s with resamples)")
    for engine in ("fused", "jax"):
        s = res.get(f"sweep_pairs_{engine}")
        if s:
            tgt = ""
            if engine == "fused":
                tgt = f"   target ≥ 1e10: {_met(s['pairs_per_s'], TARGETS['sweep_pairs_per_s'])}"
            print(f"sweep {K} × {sweep_n:,} records × 10 weight vectors, engine={engine:5s}: "
                  f"{s['pairs_per_s']:.3e} (config, record) pairs/s{tgt}")
    if "sweep_fused_kernel_pairs_per_s" in res:
        v = res["sweep_fused_kernel_pairs_per_s"]
        print(f"fused sweep kernel alone ({K} × {sweep_n:,}): {v:.3e} pairs/s   target ≥ 1e10: "
              f"{_met(v, TARGETS['sweep_pairs_per_s'])}")
    for kind in ("sweep_sigma", "sweep_pairs"):
        c = res.get(f"{kind}_fused_vs_jax")
        if c:
            print(f"{kind} fused vs jax: counts equal {c['counts_equal']} "
                  f"(max |Δ| {c['counts_max_abs_diff']:g}), "
                  f"mean C_final max |Δ| {c['mean_C_final_max_abs_diff']:.1e}")
    for fs in ("gates", "all"):
        t = res.get(f"tune_{fs}")
        if t:
            print(f"tune 15 runs × {args.tune_steps} steps ({fs}): first {t['first_s']:.1f} s, "
                  f"warm {t['warm_s']:.2f} s")
    for k, v in res.get("errors", {}).items():
        print(f"ERROR in {k}: {v[:300]}")


if __name__ == "__main__":
    main()
