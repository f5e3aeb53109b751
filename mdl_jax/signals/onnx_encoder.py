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

The pieces it runs on have modules of their own: ``model_folder`` (what the model folder declares:
its pooling, where it truncates, its content hash), ``onnx_export`` (the graph's export, its int8
quantisation and the sha256 check before each use) and ``onnx_runtimes`` (the runtimes imported
without their telemetry, the CPU's bfloat16 kind). This module is the encoder, its batching and the
one encoder per (folder, backend) per process; the other modules' names are importable from here too.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from mdl_jax.signals.embedding_models import ModelFolderError
from mdl_jax.signals.model_folder import (  # noqa: F401  (re-exported)
    folder_hash,
    max_seq_length,
    model_pooling,
    reading_fault,
    within_positions,
)
from mdl_jax.signals.onnx_export import DIGEST_SUFFIX, OPSET, damaged, digest_fault, export  # noqa: F401
from mdl_jax.signals.onnx_runtimes import (  # noqa: F401  (re-exported)
    TELEMETRY_ENV,
    bf16_supported,
    cpu_bf16_kind,
    import_onnxruntime,
    import_openvino,
)

BACKENDS = ("torch", "onnx", "onnx-int8", "openvino-bf16")
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

        # the tokenizer first: a folder it cannot read faithfully is refused before a costly export
        self.tokenizer = AutoTokenizer.from_pretrained(str(path))
        cfg = json.loads((path / "config.json").read_text()) if (path / "config.json").is_file() else {}
        cfg = cfg if isinstance(cfg, dict) else {}
        why = reading_fault(len(self.tokenizer), cfg.get("vocab_size"))
        if why:
            raise ModelFolderError(f"embedder: the model {str(path)!r} cannot embed texts faithfully: {why}")
        self.max_seq_length = within_positions(max_seq_length(path, self.tokenizer), cfg, path)
        self.graph = export(path, cache_dir, int8=int8)
        self.pooling = model_pooling(path)
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
            # see onnx_export) is written again once, rather than failing every later process. Any
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
        which bounds them to ``shape_bound`` at a few per cent more padded tokens. A bucketed batch holds
        the texts of one bucket only: padded to a longer neighbour's bucket, a text's bfloat16 vector
        moved in its last bits (about 1 text in 100), so its vector would depend on what it was embedded
        with; padded to its own bucket it is the same in any batch (tests/test_embed_backends.py).
        ``bucketed``: None (the default) buckets for OpenVINO only.
        """
        if bucketed is None:
            bucketed = self.runtime == "openvino-bf16"
        lengths = [int(n) for n in lengths]  # NumPy's unsigned ints would wrap when negated below
        cap = max(self.max_seq_length, max(lengths, default=0))  # never pad past what the model was given
        order = sorted(range(len(lengths)), key=lambda k: -lengths[k])  # stable: ties keep their order
        out = []
        i = 0
        def width(k: int) -> int:
            n = max(1, lengths[k])
            return min(bucket_tokens(n), cap) if bucketed else n

        while i < len(order):
            L = width(order[i])
            full = max(1, min(max(1, batch_size), TOKENS_PER_BATCH // L))
            end = min(i + full, len(order))
            if bucketed:  # (sorted longest first: a bucket's texts stand together)
                end = next((j for j in range(i + 1, end) if width(order[j]) != L), end)
            rows = order[i:end]
            R = min(full, 1 << (len(rows) - 1).bit_length()) if bucketed else len(rows)
            out.append((rows, L, R))
            i = end
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
        # (float32 rounding: cosine to the one-text vector ≥ 0.99999); bucketed, a text is padded to
        # its own bucket in any batch (``plan``).
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


def load(model_path: str, cache_dir: str | Path, backend: str, model_id: str | None = None):
    """One encoder per (folder, backend, cache id) per process, shared like the torch models: a
    folder's new version (a new ``model_id``) is loaded anew."""
    key = (str(model_path), backend, model_id)
    with _LOCK:
        if key not in _SESSIONS:
            _SESSIONS[key] = OnnxEncoder(model_path, cache_dir, int8=backend == "onnx-int8",
                                         runtime="openvino-bf16" if backend == "openvino-bf16" else "onnxruntime")
        return _SESSIONS[key]
