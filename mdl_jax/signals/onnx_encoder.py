"""A sentence-transformers model run through ONNX Runtime on the CPU, optionally with int8 weights.

``Embedder(backend="onnx")`` (or ``"onnx-int8"``) encodes with this instead of torch. The ONNX graph is
exported once from the local model folder (the bundled MiniLM, or any sentence-transformers folder whose
pooling is mean or CLS), offline, with ``torch.onnx.export``, and kept in the cache folder beside the
embeddings, keyed by the model folder's content hash, like the native kernel's build: a second process
loads it in well under a second.

Why our own exporter: sentence-transformers' ``backend="onnx"`` needs ``optimum``, whose ONNX exporter
pins transformers < 4.58, older than the transformers the local LLM backend needs. The graph here is the
transformer alone (input ids, attention mask, token type ids → last hidden state); tokenisation
(truncation at the model's ``max_seq_length``; texts sorted longest first and cut into batches of at
most ``TOKENS_PER_BATCH`` padded tokens, each padded to its longest text), mean / CLS pooling
and the L2 normalisation are done in NumPy exactly as sentence-transformers does them, so the vectors
match torch's to float32 rounding (cosine ≥ 0.99999 on the bundled data; int8: see the benchmark).

int8: ``onnxruntime.quantization.quantize_dynamic`` (weights int8, activations quantised per batch at
run time), applied once to the exported graph and cached too.

``"openvino-bf16"``: the same exported graph, compiled by OpenVINO's CPU plugin with bfloat16 inference
precision (its matrix products on AMX or AVX512-BF16, accumulated in float32; the vectors come back
float32). Only on a CPU that OpenVINO reports bfloat16 support for: elsewhere OpenVINO would run it in
float32, slower than ONNX Runtime, so the backend refuses and names ``"onnx"``. The vectors are not
float32's (bfloat16 keeps 8 bits of mantissa): cosine ≥ 0.9999 to torch's on the bundled data (see the
benchmark), below the ≥ 0.99999 of ``"onnx"``, and every gate action of the bundled rows unchanged:
within the parity the tests hold, so ``"auto"`` picks it on such a CPU. They differ between AMX and
AVX512-BF16 CPUs in the last bits, so its cache key names the CPU's kind (``cpu_bf16_kind``).

Memory: OpenVINO keeps the kernels it prepared for each input shape (batch, tokens), about 0.9 MB a
shape here. Batching at exact shapes can make 2,082 of them (tokens 2-256, batches up to 64 texts and
512 tokens), and a process that met all of them grew by 1,414-1,842 MB. So for OpenVINO the batches are
bucketed (``bucket_tokens``, ``OnnxEncoder.plan``): at most ``shape_bound()`` = 148 shapes at the default
batch size of 64 (159 at any batch size, for 256-token texts), which grew
a process by 70-74 MB (``experiments/bench_embed_memory.py``), for 7% more padded tokens (the warm
encoder slightly slower than with exact batching) and the same parity in the benchmark. (Limiting OpenVINO's own per-shape cache,
``CPU_RUNTIME_CACHE_CAPACITY=0``, had cut the growth to a third but changed one gate action in 120.)

Fork: neither runtime survives a fork whole. OpenVINO's compiled model hangs in a forked child, and a
new one aborts it (a limitation OpenVINO's maintainers closed as won't fix): there the encoder raises a clear error, and
``Embedder(backend="auto")`` goes on with ONNX Runtime instead (where ONNX Runtime cannot run, it raises
``ModelLoadError``: torch segfaults in a forked child of an OpenVINO process, measured;
``forked_after_openvino``). A forked child that then exits through
the interpreter's normal teardown (``sys.exit``) hangs in the runtime's exit handlers, whether or not it
touched the encoder: OpenVINO's, and ONNX Runtime's too (1.32: a bare ``import onnxruntime``, fork
and ``sys.exit`` hangs in ``pthread_cond_destroy``). ``multiprocessing``'s fork workers are not
affected, since they leave through ``os._exit``. Processes that should embed are started with ``spawn``.

Telemetry: ``import openvino`` sends a usage event unless its user opted out; ``import_openvino``
imports it without (the gate loads it by default on CPUs with bfloat16). ``import onnxruntime`` starts
ONNX Runtime's telemetry, which writes a device id and a queue of events under the user's cache folder
(``~/.cache/Microsoft/DeveloperTools/.onnxruntime/``); ``import_onnxruntime`` imports it with its
telemetry off (``ORT_DISABLE_TELEMETRY=1``, unless the user set that variable), and nothing is written.

Integrity: each exported file's sha256 is recorded beside it at export (``model.onnx.sha256``) and
checked before the file is used (``digest_fault``): a graph damaged with its size kept still loads and
gives wrong vectors, which the embedding cache would then keep as right.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from mdl_jax._io import atomic_path
from mdl_jax._paths import own_folder

BACKENDS = ("torch", "onnx", "onnx-int8", "openvino-bf16")
OPSET = 17
TOKENS_PER_BATCH = 512  # padded tokens per ONNX Runtime call (see ``OnnxEncoder.encode``)
_SESSIONS: dict = {}
_LOCK = threading.Lock()


def bucket_tokens(n: int) -> int:
    """``n`` tokens rounded up to one of four steps per doubling (…, 8, 10, 12, 14, 16, 20, 24, …, 256,
    320, …): at most 25% more tokens (17 → 20); up to 8 tokens, exact. Over the gate's 2,578 bundled
    texts the bucketed batches hold 7% more padded tokens than exact ones (61,388 against 57,362)."""
    if n <= 8:
        return max(1, n)
    step = 1 << ((n - 1).bit_length() - 3)
    return -(-n // step) * step


# The process that last compiled an OpenVINO model, if any: a fork copies it, so a child can tell that an
# ancestor ran OpenVINO (``forked_after_openvino``), where neither OpenVINO nor torch can run.
_OV_COMPILED_PID: int | None = None


# OpenVINO's Python binding fills function-local statics (pybind11's table of NumPy's C API, and others
# on the way to an infer request) on a process's first use, and threads making that first use at once
# deadlock: one holds a static's init guard and waits for the GIL, another holds the GIL and waits on
# the guard (openvino 2026.4.1: the test suite hung once in an xdist worker; a script starting 2 or 8
# threads on a fresh process's first infers hung in about 1 run in 12, in `infer` and in
# `create_infer_request`). So a process's first request and infer run under this lock; later ones run
# in parallel as before (a fork copies the filled statics and the flag).
_OV_FIRST_INFER = threading.Lock()
_OV_INFERRED = False


def forked_after_openvino() -> bool:
    """Whether this process is a forked child (or later descendant) of a process that compiled an
    OpenVINO model. There OpenVINO's compiled model hangs, a new one aborts the process, and torch's
    first layer norm segfaults (or hangs, where the parent ran torch too: seen with torch 2.13 and
    openvino 2025); ONNX Runtime runs."""
    return _OV_COMPILED_PID is not None and _OV_COMPILED_PID != os.getpid()


def shape_bound(max_tokens: int = 256, batch_size: int = 64) -> int:
    """How many distinct (rows, tokens) shapes OpenVINO's bucketed batching (``OnnxEncoder.plan``) can
    run for texts of at most ``max_tokens`` tokens: every bucket's full batch and each power of two
    below it. For the bundled MiniLM (256 tokens, batches of 64): 148."""
    shapes: set[tuple[int, int]] = set()
    for n in range(1, max_tokens + 1):
        L = min(bucket_tokens(n), max_tokens)
        full = max(1, min(batch_size, TOKENS_PER_BATCH // L))
        shapes.update((min(full, 1 << k), L) for k in range(full.bit_length()))
        shapes.add((full, L))
    return len(shapes)


def _folder_hash(path: Path) -> str:
    """sha256 over the model folder's files that define the graph and the tokenizer (names + bytes)."""
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        if p.is_file() and p.suffix in (".json", ".safetensors", ".bin", ".txt", ".model"):
            h.update(str(p.relative_to(path)).encode())
            with open(p, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
    return h.hexdigest()[:16]


_MODULES_REPRODUCED = ("Transformer", "Pooling", "Normalize")  # what ``encode`` below does in NumPy
_POOLING_FLAGS = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls"}  # < 6's names


def model_pooling(path: Path) -> str:
    """The model's pooling mode ("mean" or "cls"), after checking that this module reproduces the model's
    whole sentence-transformers pipeline; else a ValueError that says what it does not reproduce.

    Reproduced: a Transformer, one Pooling of mean or CLS (the flags of sentence-transformers < 6 or
    its ``pooling_mode`` of 6+), an optional Normalize (``encode`` normalises anyway). Not: any other
    module (Dense, a second pooling, ...), more than one pooling mode at once, a default prompt, or a
    lower-casing the tokenizer does not do itself. Without this check such a model's vectors would come
    out silently different from torch's (a probe found a Dense 384→128 model embedded at 384 dims).
    """
    def refuse(what: str) -> ValueError:
        return ValueError(f"embedder: backend onnx reproduces a Transformer with mean or CLS pooling "
                          f"(and Normalize); {path} {what}")

    st_cfg = path / "config_sentence_transformers.json"
    if st_cfg.is_file() and json.loads(st_cfg.read_text()).get("default_prompt_name"):
        raise refuse("sets a default prompt")
    bert_cfg = path / "sentence_bert_config.json"
    if bert_cfg.is_file() and json.loads(bert_cfg.read_text()).get("do_lower_case"):
        raise refuse("lower-cases its texts (do_lower_case)")
    mods = path / "modules.json"
    if not mods.is_file():
        return "mean"  # a plain transformers folder: sentence-transformers adds mean pooling
    pooling = "mean"
    for m in json.loads(mods.read_text()):
        kind = str(m.get("type", "")).rsplit(".", 1)[-1]
        if kind not in _MODULES_REPRODUCED:
            raise refuse(f"has a {kind or 'nameless'} module")
        if kind != "Pooling":
            continue
        cfg = json.loads((path / m["path"] / "config.json").read_text())
        mode = cfg.get("pooling_mode")  # sentence-transformers 6+
        modes = [mode] if isinstance(mode, str) else [
            _POOLING_FLAGS.get(k, k.removeprefix("pooling_mode_")) for k, v in cfg.items()
            if k.startswith("pooling_mode_") and v is True]
        if len(modes) != 1 or modes[0] not in ("mean", "cls"):
            raise refuse(f"pools by {modes or 'no mode'}")
        pooling = modes[0]
    return pooling


def _max_seq_length(path: Path, tokenizer) -> int:
    """Where sentence-transformers truncates: its config's ``max_seq_length``, else the smaller of the
    tokenizer's ``model_max_length`` (1e30 when a tokenizer states none) and the model's position
    embeddings, as its ``Transformer`` module takes them."""
    st_cfg = path / "sentence_bert_config.json"
    if st_cfg.is_file():
        n = json.loads(st_cfg.read_text()).get("max_seq_length")
        if n:
            return int(n)
    cfg = path / "config.json"
    pos = json.loads(cfg.read_text()).get("max_position_embeddings") if cfg.is_file() else None
    limits = [int(x) for x in (getattr(tokenizer, "model_max_length", None), pos)
              if isinstance(x, (int, float)) and 0 < x < 1 << 31]
    return min(limits) if limits else 512


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
    global _BF16_KIND
    if _BF16_KIND is None:
        flags: set[str] = set()
        try:
            with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
                for line in f:
                    if line.startswith("flags"):
                        flags = set(line.split(":", 1)[1].split())
                        break
        except OSError:
            pass
        _BF16_KIND = next((k for k in ("amx_bf16", "avx512_bf16") if k in flags), "")
    return _BF16_KIND or None


_BF16_KIND: str | None = None


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


def _atomic_save(write, target: Path) -> None:
    """``write(path)`` (an exporter that takes a file name) into a fresh private folder beside the
    target, then fsync and rename (``mdl_jax._io.atomic_path``): a reader never sees half a graph,
    and a name planted at the target or beside it is replaced, never followed."""
    with atomic_path(target) as tmp:
        write(str(tmp))


DIGEST_SUFFIX = ".sha256"  # model.onnx's digest, recorded at export: model.onnx.sha256


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _record_digest(graph: Path) -> None:
    digest = _sha256(graph)
    _atomic_save(lambda tmp: Path(tmp).write_text(digest + "\n"), graph.with_name(graph.name + DIGEST_SUFFIX))


def digest_fault(graph: Path) -> str | None:
    """Why ``graph`` is not the file that was exported: its sha256 differs from the digest recorded
    beside it at export (``model.onnx.sha256``: bit rot, flipped bytes, another file written over it),
    or no digest was recorded; None when it matches.

    A graph damaged with its size kept still parses and loads, and its vectors come out silently
    wrong and would be cached as right, so each file is checked before use, not only parsed.

    Args:
        graph: the path of an exported ``.onnx`` file.

    Returns:
        A phrase naming what is wrong, or None.
    """
    try:
        recorded = graph.with_name(graph.name + DIGEST_SUFFIX).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return "has no digest recorded at export"
    try:
        actual = _sha256(graph)
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    return None if actual == recorded else (f"is damaged (its sha256 {actual[:16]}… is not the digest recorded "
                                            f"at export, {recorded[:16]}…)")


def _verified(graph: Path, redo) -> None:
    """Check ``graph`` against its digest; where it fails, warn and ``redo()`` (export it again), or raise
    a ValueError naming the file where it cannot be written again (a read-only cache)."""
    why = digest_fault(graph)
    if why is None:
        return
    import warnings

    try:
        warnings.warn(f"embedder: the exported graph {graph} {why}; exporting it again", RuntimeWarning,
                      stacklevel=3)
        redo()
    except (OSError, ValueError) as e:
        raise ValueError(f"embedder: the exported graph {graph} {why}, and it cannot be exported again "
                         f"({type(e).__name__}: {' '.join(str(e).split())[:200]}); remove it, or give a "
                         "writable cache_dir") from e


def export(model_path: str | Path, cache_dir: str | Path, *, int8: bool = False,
           force: bool = False) -> Path:
    """The ONNX graph of a local sentence-transformers folder, exported (and quantised) on first use.

    Args:
        model_path: a local model folder (``resolve_model`` gives the bundled MiniLM's).
        cache_dir: where the graphs are kept (``<cache_dir>/onnx/<name>-<content hash>/``).
        int8: also quantise the weights to int8 (dynamic quantisation) and return that graph.
        force: write the graph asked for again even if it is cached (a damaged one: it is replaced
          by an atomic rename, so a process reading it meanwhile sees the old file or the new one).

    Each file written gets its sha256 recorded beside it (``model.onnx.sha256``), and a cached file is
    checked against it before it is returned (``digest_fault``): one that differs, or has no digest, is
    exported again with a RuntimeWarning naming it.

    Returns:
        The path of ``model.onnx`` (or ``model.int8.onnx``), its bytes those exported.

    Raises:
        ValueError: ``model_path`` is not a local folder, or its pooling is neither mean nor CLS; a graph
          folder under ``cache_dir`` is a symlink or not ours (``own_folder``); a cached graph that
          fails its digest where it cannot be exported again (naming the file).
    """
    path = Path(model_path)
    if not path.is_dir():
        raise ValueError(f"embedder: backend onnx needs a local model folder (the bundled MiniLM or a "
                         f"path), got {str(model_path)!r}")
    model_pooling(path)  # refuse an unsupported pooling before exporting anything
    out = Path(cache_dir) / "onnx" / f"{path.name}-{_folder_hash(path)}"
    fp32 = out / "model.onnx"

    def writable() -> None:
        # Before anything is written, both folders we make are checked to be real folders of ours: a
        # symlink planted at either would have the graphs written (and later loaded) wherever it
        # points. A cache that only needs reading (another account's, a read-only mount) is not.
        own_folder(Path(cache_dir) / "onnx", what="cache_dir")
        own_folder(out, what="cache_dir")

    if fp32.is_file() and not (force and not int8):  # (the int8 graph is made from it)
        _verified(fp32, lambda: export(model_path, cache_dir, force=True))
    if not fp32.is_file() or (force and not int8):
        writable()
        import torch
        from transformers import AutoModel

        class Body(torch.nn.Module):
            """The transformer with keyword inputs: positional order differs across transformers versions."""

            def __init__(self):
                super().__init__()
                # eager attention: the classic MatMul-Softmax pattern that ORT's BERT optimizer fuses
                self.m = AutoModel.from_pretrained(str(path), attn_implementation="eager").eval()

            def forward(self, input_ids, attention_mask, token_type_ids):
                return self.m(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).last_hidden_state

        model = Body().eval()
        ids = torch.ones((2, 8), dtype=torch.long)
        names = ["input_ids", "attention_mask", "token_type_ids"]
        dyn = {n: {0: "batch", 1: "seq"} for n in names}
        dyn["last_hidden_state"] = {0: "batch", 1: "seq"}

        def write(tmp):
            import warnings

            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the exporter's tracer warnings say nothing to a user
                # the TorchScript exporter (dynamo=False): one self-contained file, no onnxscript needed
                torch.onnx.export(model, (ids, ids, torch.zeros_like(ids)), tmp, input_names=names,
                                  output_names=["last_hidden_state"], dynamic_axes=dyn, opset_version=OPSET,
                                  dynamo=False)
        _atomic_save(write, fp32)
        _record_digest(fp32)
    if not int8:
        return fp32
    q8 = out / "model.int8.onnx"
    if q8.is_file() and not force:
        _verified(q8, lambda: export(model_path, cache_dir, int8=True, force=True))
    if not q8.is_file() or force:
        import_onnxruntime()  # (its telemetry off before the quantization package imports it)
        from onnxruntime.quantization import QuantType, quantize_dynamic

        writable()
        if force and damaged(fp32):  # the float32 graph it is made from is damaged too
            export(model_path, cache_dir, force=True)
        # per-channel weight scales: per-tensor int8 loses too much (min cosine 0.84 vs 0.97 to fp32)
        _atomic_save(lambda tmp: quantize_dynamic(str(fp32), tmp, weight_type=QuantType.QInt8,
                                                  per_channel=True), q8)
        _record_digest(q8)
    return q8


def damaged(graph: Path) -> bool:
    """Whether ``graph`` is not a readable ONNX model (truncated or overwritten on disk).

    Args:
        graph: the path of an ``.onnx`` file.

    Returns:
        True when ``onnx`` cannot parse it, or it lacks a graph with nodes and outputs, or an opset;
        False otherwise, and when ``onnx`` is not installed (nothing can tell then) or runs out of
        memory reading it. Never raises.
    """
    try:
        import onnx
    except ImportError:
        return False
    try:
        m = onnx.load(str(graph), load_external_data=False)
    except MemoryError:
        return False
    except Exception:  # noqa: BLE001 - DecodeError, OSError, ...: the file is not a model
        return True
    # protobuf parses an empty file, or one cut between two fields, as a model missing them
    return not (m.HasField("graph") and len(m.graph.node) and len(m.graph.output) and len(m.opset_import))


class OnnxEncoder:
    """``encode(texts, ...)`` with sentence-transformers' signature, run by ONNX Runtime or OpenVINO.

    Args:
        model_path: a local sentence-transformers folder.
        cache_dir: where the exported graphs are kept.
        int8: run the int8-quantised graph (ONNX Runtime only).
        threads: how many batches run at once, each on one core (None: the cores this process may
          use). One single-threaded session run from that many threads beat ONNX Runtime's own
          intra-op threads on the small batches below, and a text's vector then
          depends only on its batch, never on how many threads ran.
        runtime: ``"onnxruntime"`` (float32 or int8) or ``"openvino-bf16"`` (OpenVINO's CPU plugin in
          bfloat16; see the module docstring).

    Raises:
        ValueError: an unknown ``runtime``; ``int8`` with OpenVINO; ``"openvino-bf16"`` on a CPU that
          OpenVINO reports no bfloat16 support for.
    """

    def __init__(self, model_path: str | Path, cache_dir: str | Path, *, int8: bool = False,
                 threads: int | None = None, runtime: str = "onnxruntime"):
        from transformers import AutoTokenizer

        if runtime not in ("onnxruntime", "openvino-bf16"):
            raise ValueError(f"runtime: expected 'onnxruntime' or 'openvino-bf16', got {runtime!r}")
        if runtime == "openvino-bf16" and int8:
            raise ValueError("int8: the openvino-bf16 runtime runs the float32 graph in bfloat16, not int8")
        path = Path(model_path)
        self.runtime = runtime
        if runtime == "openvino-bf16":
            self._ov_core = import_openvino().Core()
            if not bf16_supported(self._ov_core):  # before the export: nothing is written for a CPU that cannot
                caps = self._ov_core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")
                raise ValueError(f"embedder: backend 'openvino-bf16' needs a CPU with bfloat16 support "
                                 f"(AMX or AVX512-BF16); OpenVINO reports {list(caps)} for this one. Use "
                                 f"backend 'onnx' (float32, ONNX Runtime)")
        if runtime == "onnxruntime":
            import_onnxruntime()  # a missing or broken runtime fails here, before a costly export

        self.graph = export(path, cache_dir, int8=int8)
        self.pooling = model_pooling(path)
        self.tokenizer = AutoTokenizer.from_pretrained(str(path))
        self.max_seq_length = _max_seq_length(path, self.tokenizer)
        if threads is None:
            try:
                threads = len(os.sched_getaffinity(0))
            except AttributeError:  # not Linux
                threads = os.cpu_count() or 1
        self.threads = max(1, int(threads))
        self._pool = None
        self._pool_pid = 0
        self._pool_lock = threading.Lock()
        try:
            self._open()
        except ImportError:  # the runtime is not installed: the graph is not at fault
            raise
        except Exception as e:  # noqa: BLE001 - the runtimes raise their own types for a bad file
            # A cached graph that is damaged on disk (truncated or overwritten: ours are written whole,
            # see _atomic_save) is written again once, rather than failing every later process. Any
            # other failure (memory, file descriptors, a runtime too old for the graph, an option)
            # is raised as it is, and the graph is left alone.
            if not damaged(self.graph):
                raise
            import warnings

            warnings.warn(f"embedder: the cached graph {self.graph} is damaged ({type(e).__name__}: "
                          f"{' '.join(str(e).split())[:200]}); exporting it again", RuntimeWarning,
                          stacklevel=2)
            self.graph = export(path, cache_dir, int8=int8, force=True)
            try:
                self._open()
            except Exception as e2:  # noqa: BLE001
                raise ValueError(f"embedder: the graph {self.graph}, exported again, still does not load "
                                 f"({type(e2).__name__}: {' '.join(str(e2).split())[:300]})") from e2
        # The fast tokenizer's Rust core, truncating as the tokenizer call above would: it gives the
        # same ids (tests/test_embed_backends.py) without transformers' per-text conversion to Python
        # dicts, a visible share of the uncached gate's time.
        self._fast = None
        core = getattr(self.tokenizer, "backend_tokenizer", None)
        if core is not None:
            from tokenizers import Tokenizer

            self._fast = Tokenizer.from_str(core.to_str())
            self._fast.no_padding()
            self._fast.enable_truncation(self.max_seq_length)

    def _open(self) -> None:
        """Load ``self.graph`` into the runtime (ONNX Runtime session or OpenVINO compiled model)."""
        if self.runtime == "onnxruntime":
            ort = import_onnxruntime()
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = 1
            opts.inter_op_num_threads = 1
            self.session = ort.InferenceSession(str(self.graph), opts, providers=["CPUExecutionProvider"])
            self._inputs = {i.name for i in self.session.get_inputs()}
        else:
            self._ov_compile()
            self._inputs = {i.get_any_name() for i in self.session.inputs}

    def _ov_compile(self) -> None:
        # One single-threaded stream per pool thread, as ONNX Runtime's sessions above: each request
        # runs on one core, so a text's vector depends on its batch only, never on the thread count.
        self.session = self._ov_core.compile_model(str(self.graph), "CPU", {
            "INFERENCE_PRECISION_HINT": "bf16", "NUM_STREAMS": self.threads,
            "INFERENCE_NUM_THREADS": self.threads, "PERFORMANCE_HINT": "LATENCY"})
        self._requests = threading.local()  # an infer request per thread (a request is not shared)
        self._ov_pid = os.getpid()
        global _OV_COMPILED_PID
        _OV_COMPILED_PID = os.getpid()

    def _infer(self, feed: dict) -> np.ndarray:
        """The graph's last hidden state for one padded batch."""
        feed = {k: v for k, v in feed.items() if k in self._inputs}
        if self.runtime == "onnxruntime":
            return self.session.run(None, feed)[0]
        if self._ov_pid != os.getpid():
            # OpenVINO does not survive a fork (tried here: the parent's compiled model hangs in the
            # child, and a new one with two streams aborts it): a clear error, not a hang
            raise RuntimeError(f"embedder: backend 'openvino-bf16' was loaded in process {self._ov_pid} and "
                               f"cannot run in its forked child {os.getpid()}: start the child with "
                               f"multiprocessing's 'spawn' (or 'forkserver') and load it there, or use "
                               f"backend 'onnx'")
        global _OV_INFERRED
        if not _OV_INFERRED:
            with _OV_FIRST_INFER:  # the process's first request and infer run alone: see _OV_FIRST_INFER
                out = self._ov_run(feed)
                _OV_INFERRED = True
                return out
        return self._ov_run(feed)

    def _ov_run(self, feed: dict) -> np.ndarray:
        req = getattr(self._requests, "r", None)
        if req is None:
            req = self._requests.r = self.session.create_infer_request()
        return np.array(req.infer(feed)[0])  # a copy: the request reuses its output buffer

    def _executor(self):
        # made on first use, and again in a forked child (a fork copies no threads)
        with self._pool_lock:
            if self._pool is None or self._pool_pid != os.getpid():
                from concurrent.futures import ThreadPoolExecutor

                self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="mdl-onnx")
                self._pool_pid = os.getpid()
            return self._pool

    def _token_ids(self, texts: list[str]) -> tuple[list[list[int]], list[list[int]] | None]:
        """Each text's token ids and token type ids, truncated at ``max_seq_length``, unpadded."""
        if self._fast is not None:
            encs = self._fast.encode_batch(texts)
            return [e.ids for e in encs], [e.type_ids for e in encs]
        enc = self.tokenizer(texts, truncation=True, max_length=self.max_seq_length)
        return enc["input_ids"], enc.get("token_type_ids")

    def plan(self, lengths: Sequence[int], batch_size: int = 64, *,
             bucketed: bool | None = None) -> list[tuple[list[int], int, int]]:
        """How ``encode`` batches texts of these token counts: (the texts' indices, padded tokens, padded rows)
        per batch.

        Longest first, as sentence-transformers orders them, so a batch pads little; at most
        ``TOKENS_PER_BATCH`` padded tokens per batch (and at most ``batch_size`` texts), so the
        activations of a small batch stay in the CPU's caches: on the gate's 526 bundled texts, 512
        tokens per batch ran faster than 4,096, and both faster than batches of 64 texts padded to
        their longest (docs/benchmarks.md).

        ONNX Runtime runs each batch at its own shape (its longest text, its number of texts). OpenVINO
        keeps kernels for every shape it has run, about 0.9 MB each, which over the up to 2,082 shapes
        of exact batching grew a process by 1,414-1,842 MB; so for OpenVINO the shapes are bucketed
        (``bucket_tokens``; a batch's rows padded to a power of two, or to the bucket's full batch),
        which bounds them to ``shape_bound`` at a few per cent more padded tokens. ``bucketed``: None
        (the default) buckets for OpenVINO only.
        """
        if bucketed is None:
            bucketed = self.runtime == "openvino-bf16"
        lengths = [int(n) for n in lengths]  # NumPy's unsigned ints would wrap when negated below
        cap = max(self.max_seq_length, max(lengths, default=0))  # never pad past what the model was given
        order = sorted(range(len(lengths)), key=lambda k: -lengths[k])  # stable: ties keep their order
        out = []
        i = 0
        while i < len(order):
            L = max(1, int(lengths[order[i]]))
            if bucketed:
                L = min(bucket_tokens(L), cap)
            full = max(1, min(max(1, batch_size), TOKENS_PER_BATCH // L))
            rows = order[i:i + full]
            R = min(full, 1 << (len(rows) - 1).bit_length()) if bucketed else len(rows)
            out.append((rows, L, R))
            i += full
        return out

    def encode(self, texts: Sequence[str], batch_size: int = 64, convert_to_numpy: bool = True,
               normalize_embeddings: bool = True, show_progress_bar: bool = False) -> np.ndarray:
        """The texts' sentence vectors, in the texts' order.

        Args:
          texts: N strings (any, empty ones included; longer than ``max_seq_length`` tokens: truncated).
          batch_size: at most this many texts per ONNX Runtime call (each call also holds at most
            ``TOKENS_PER_BATCH`` padded tokens).
          convert_to_numpy, show_progress_bar: accepted for sentence-transformers' signature; ignored
            (the result is always NumPy, and no bar is shown).
          normalize_embeddings: L2-normalise each vector.

        Returns:
          (N, dim) float32, unit norm when ``normalize_embeddings``; (0, 0) for no texts.
        """
        texts = list(texts)
        if not texts:
            return np.zeros((0, 0), np.float32)
        # One tokenizer call for all texts (unpadded), then batches cut by tokens, longest first (``plan``).
        # A text's vector depends on its batch only through padding, which its attention mask hides
        # (float32 rounding: cosine to the one-text vector ≥ 0.99999).
        ids, types = self._token_ids(texts)
        pad = self.tokenizer.pad_token_id or 0
        batches = self.plan([len(x) for x in ids], batch_size)

        def run(batch: tuple[list[int], int, int]) -> np.ndarray:
            rows, L, R = batch
            feed = {"input_ids": np.full((R, L), pad, np.int64),
                    "attention_mask": np.zeros((R, L), np.int64),
                    "token_type_ids": np.zeros((R, L), np.int64)}
            feed["attention_mask"][len(rows):, 0] = 1  # filler rows (bucketed shapes): one token each, no empty softmax
            for r, k in enumerate(rows):
                x = ids[k]
                feed["input_ids"][r, :len(x)] = x
                feed["attention_mask"][r, :len(x)] = 1
                if types is not None:
                    feed["token_type_ids"][r, :len(x)] = types[k]
            h = self._infer(feed)[:len(rows)]
            if self.pooling == "cls":
                return h[:, 0]
            m = feed["attention_mask"][:len(rows), :, None].astype(np.float32)  # mean over the real tokens,
            return (h * m).sum(1) / np.maximum(m.sum(1), 1e-9)                    # as sentence-transformers' Pooling

        if len(batches) > 1 and self.threads > 1:
            results = list(self._executor().map(run, batches))  # both runtimes release the GIL
        else:
            results = [run(b) for b in batches]
        vecs = np.zeros((len(texts), results[0].shape[1]), np.float32)
        for (rows, _, _), v in zip(batches, results):
            vecs[rows] = v
        if normalize_embeddings:
            vecs = vecs / np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12)
        return vecs


def load(model_path: str, cache_dir: str | Path, backend: str):
    """One encoder per (folder, backend) per process, shared like the torch models."""
    key = (str(model_path), backend)
    with _LOCK:
        if key not in _SESSIONS:
            _SESSIONS[key] = OnnxEncoder(model_path, cache_dir, int8=backend == "onnx-int8",
                                         runtime="openvino-bf16" if backend == "openvino-bf16" else "onnxruntime")
        return _SESSIONS[key]

_pooling = model_pooling  # the earlier private name, which tests and sibling modules still use
