"""ONNX Runtime and OpenVINO, imported without their telemetry, and the CPU's bfloat16 kind.

Its own module because importing a runtime has side effects a library must not leave to chance, and
both the exporter (``onnx_export``: int8 quantisation imports ONNX Runtime) and the encoder
(``onnx_encoder``) import them, so they do it here, once, the same way.

Telemetry: ``import openvino`` sends a usage event unless its user opted out; ``import_openvino``
imports it without (the gate loads it by default on CPUs with bfloat16). ``import onnxruntime`` starts
ONNX Runtime's telemetry, which writes a device id and a queue of events under the user's cache folder
(``~/.cache/Microsoft/DeveloperTools/.onnxruntime/``); ``import_onnxruntime`` imports it with its
telemetry off (``ORT_DISABLE_TELEMETRY=1``, unless the user set that variable), and nothing is written.
"""

from __future__ import annotations

import os


def bf16_supported(core=None) -> bool:
    """Whether OpenVINO reports bfloat16 support for this CPU (the ``"openvino-bf16"`` backend runs only there).

    Args:
        core: an ``openvino.Core`` to ask (None: a new one).

    Returns:
        True when the CPU plugin lists ``BF16`` among its optimisation capabilities.

    Raises:
        ImportError: openvino is not installed (the ``openvino`` extra).
    """
    if core is None:
        core = import_openvino().Core()
    return "BF16" in core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")


def cpu_bf16_kind() -> str | None:
    """The CPU's bfloat16 matrix instructions as ``/proc/cpuinfo`` names them: ``"amx_bf16"``,
    ``"avx512_bf16"``, or None (none, or not Linux). Read without importing OpenVINO, so "auto" can
    decide cheaply; OpenVINO's own check (``bf16_supported``) still decides when the backend loads.

    Also part of the backend's cache key (``Embedder``): AMX and AVX512-BF16 accumulate in different
    orders, so their bfloat16 vectors differ in the last bits, and one cache must not mix them.
    """
    from mdl_jax.engines.cpu import cpu_flags  # the flags line, read once per process

    return next((k for k in ("amx_bf16", "avx512_bf16") if k in cpu_flags()), None)


def import_openvino():
    """``import openvino``, without the usage event its import sends.

    ``import openvino`` runs OpenVINO's model-conversion telemetry (``openvino.tools.ovc``): unless the
    user ran ``opt_in_out --opt_out``, it writes ``~/intel/openvino_ga_cid`` and sends a Google
    Analytics event (seen here as a DNS query from the import). A library the gate loads by default
    must not phone home for its user, so the first import made here runs with ``openvino_telemetry``
    unimportable, and OpenVINO takes its own no-op stub, as it does when that package is not
    installed. A process that imported openvino before keeps what it had; one that imports
    ``openvino_telemetry`` itself later gets the real package.
    """
    import sys

    if "openvino" in sys.modules:
        return sys.modules["openvino"]
    blocked = "openvino_telemetry" not in sys.modules
    if blocked:
        sys.modules["openvino_telemetry"] = None  # its import raises ImportError
    try:
        import openvino
    finally:
        if blocked and sys.modules.get("openvino_telemetry", 0) is None:
            del sys.modules["openvino_telemetry"]
    return openvino


TELEMETRY_ENV = "ORT_DISABLE_TELEMETRY"


def import_onnxruntime():
    """``import onnxruntime``, with ONNX Runtime's telemetry off.

    Its import starts the telemetry, which on Linux writes a device id and a database of queued events
    under ``$XDG_CACHE_HOME`` or ``~/.cache`` (``Microsoft/DeveloperTools/.onnxruntime/``). A library the
    gate loads by default must not do that for its user, so the first import made here runs with
    ``ORT_DISABLE_TELEMETRY=1`` (read once, at that import; the variable is removed again after it,
    and ``disable_telemetry_events`` is called too). A user who set the variable keeps their setting;
    a process that imported onnxruntime before keeps what it had.

    Returns:
        The ``onnxruntime`` module.

    Raises:
        ImportError: onnxruntime is not installed, or fails to import.
    """
    import sys

    if sys.modules.get("onnxruntime") is not None:
        return sys.modules["onnxruntime"]
    ours = TELEMETRY_ENV not in os.environ
    if ours:
        os.environ[TELEMETRY_ENV] = "1"
    try:
        import onnxruntime
    finally:
        if ours:
            os.environ.pop(TELEMETRY_ENV, None)
    if ours and hasattr(onnxruntime, "disable_telemetry_events"):
        onnxruntime.disable_telemetry_events()
    return onnxruntime
