#!/usr/bin/env bash
# Run a command with every runtime held to its AVX2 code paths, at full speed, on an AVX-512 x86-64 host:
# a proxy for timings on an AVX2-only CPU (AMD Zen 2 and 3; Intel desktop and laptop CPUs from Haswell to Comet Lake) that
# this machine is not. See experiments/avx2_proxy.py for how each runtime is held and the proxy's limits.
#   scripts/hold_avx2.sh python -m experiments.bench_embed --backends onnx onnx-int8
# torch, MKL, oneDNN, NumPy, OpenBLAS, XLA and the native kernel by their own switches; ONNX Runtime from
# a patched copy of the installed package (DEST below, made once per installed version); mdl-jax's own
# CPU checks (the native kernel's variant, "auto"'s backend, OpenVINO's bfloat16 check) from a copy of
# /proc/cpuinfo without the AVX-512 / AMX / VNNI / GFNI flags, mounted in a private mount namespace
# (as root, or as a user where unprivileged user namespaces are allowed). A host whose CPU has features
# ONNX Runtime selects kernels by from CPUID alone (AVX-VNNI) is refused: it would still run them.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 COMMAND [ARGS...]   (e.g. $0 python -m experiments.bench_embed)" >&2; exit 2; }
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEST=${MDL_JAX_AVX2_PROXY_DIR:-$ROOT/.avx2-proxy}
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$ROOT
case "$(basename "$1")" in python*) PY=$1 ;; *) PY=python3 ;; esac   # the interpreter that patches: the command's own
"$PY" -m experiments.avx2_proxy patch "$DEST" >/dev/null
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
"$PY" -m experiments.avx2_proxy cpuinfo "$WORK/cpuinfo"
export MDL_JAX_AVX2_PROXY=1 PYTHONPATH="$DEST:$PYTHONPATH" ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 \
  ONEDNN_MAX_CPU_ISA=AVX2 MDL_JAX_NATIVE_ISA=avx2 XLA_FLAGS="${XLA_FLAGS:-} --xla_cpu_max_isa=AVX2" \
  OPENBLAS_CORETYPE=Haswell \
  NPY_DISABLE_CPU_FEATURES="X86_V4 AVX512_ICL AVX512_SPR AVX512F AVX512CD AVX512_SKX AVX512_CLX AVX512_CNL AVX512_KNL AVX512_KNM"
echo "hold_avx2: AVX2 code paths on $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) (a proxy: this host's cores, caches and clock)" >&2
if [ "$(id -u)" -eq 0 ]; then NS=(unshare -m --propagation private); else NS=(unshare -r -m --propagation private); fi
"${NS[@]}" bash -c 'mount --bind "$0" /proc/cpuinfo && exec "$@"' "$WORK/cpuinfo" "$@"
