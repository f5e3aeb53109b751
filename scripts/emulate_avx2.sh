#!/usr/bin/env bash
# Run a command's Python as on an AVX2-only AMD EPYC (Zen 3: AVX2, FMA, no AVX-512, no BF16) on any x86-64
# Linux host, for parity checks (never timings: the emulator is ~100x slower and unlike the real CPU).
#   sudo apt-get install qemu-user      # QEMU >= 7.2: its TCG emulates AVX2
#   scripts/emulate_avx2.sh python -m experiments.emulated_parity dump emu.npz onnx
# QEMU's user mode passes the host's /proc/cpuinfo through, which mdl-jax reads (the OpenVINO and native
# kernel choices): a copy without the AVX-512 / AMX / GFNI / VNNI flags is mounted over it in a private
# mount namespace (needs root, or unprivileged user namespaces). The native kernel builds into a cache
# folder of its own (MDL_JAX_CACHE_DIR, default ./.emulated-avx2-cache) with a g++ run under the same
# emulated CPU, so -march=native means the emulated one.
set -euo pipefail
[ "${1:-}" = "python" ] || { echo "usage: $0 python ARGS..." >&2; exit 2; }
shift
command -v qemu-x86_64 >/dev/null || { echo "$0: qemu-x86_64 not found: apt-get install qemu-user" >&2; exit 2; }
CPU=${EMULATED_CPU:-EPYC-Milan}
PY=$(python3 -c 'import sys; print(sys.executable)')   # the interpreter itself, not a pyenv shim script
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
printf '#!/bin/bash\nexec qemu-x86_64 -cpu %s /usr/bin/g++ "$@" 2> >(grep -v "TCG doesn.t support" >&2)\n' "$CPU" > "$WORK/g++"
chmod +x "$WORK/g++"
export MDL_JAX_CACHE_DIR=${MDL_JAX_CACHE_DIR:-$PWD/.emulated-avx2-cache} CXX="$WORK/g++" PYTHONPATH=${PYTHONPATH:-$PWD}
"$PY" -m experiments.avx2_proxy cpuinfo "$WORK/cpuinfo"   # (natively: the flags an AVX2-only CPU lacks removed)
unshare -m --propagation private bash -c 'mount --bind "$0" /proc/cpuinfo && exec qemu-x86_64 -cpu "$1" "$2" "${@:3}"' \
  "$WORK/cpuinfo" "$CPU" "$PY" "$@" 2> >(grep -v "TCG doesn't support requested feature" >&2)
