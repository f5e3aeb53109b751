"""The gate inside the MDL gateway: decisions made off the event loop, batched across concurrent
requests (``GateBatcher``), and an embedder whose memory stays bounded (``BoundedEmbedder``).

Both exist apart from the HTTP side because they answer to other limits: a decision is CPU work that
must not block the event loop, and the memories it embeds come from clients, so their vectors must
neither pile up in memory nor be written to disk. ``mdl_jax.serving.gateway`` uses both.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from mdl_jax.serving.protocol import LIMITS, APIError
from mdl_jax.signals.embeddings import DEFAULT_MODEL, Embedder, resolve_model


class GateBatcher:
    """Decisions off the event loop: requests that arrive within a few ms share one ``decide_batch``
    (one embedding pass, one controller call) in a worker thread."""

    def __init__(self, gate, max_batch: int = 64, wait_s: float = 0.003):
        self.gate, self.max_batch, self.wait_s = gate, max_batch, wait_s
        self.items: list = []
        self.wake = asyncio.Event()
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="mdl-gate")
        self.seconds = 0.0

    async def decide(self, query: str, memories: list, category, risk):
        fut = asyncio.get_running_loop().create_future()
        self.items.append((query, memories, category, risk, fut))
        self.wake.set()
        return await fut

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self.wake.wait()
            await asyncio.sleep(self.wait_s)
            batch, self.items = self.items[:self.max_batch], self.items[self.max_batch:]
            if not self.items:
                self.wake.clear()
            if not batch:
                continue
            try:
                t = time.perf_counter()
                ds = await loop.run_in_executor(self.pool, self._decide, batch)
                took = time.perf_counter() - t
                for it, d in zip(batch, ds):
                    it[4].set_result((d, took, len(batch)))
            except Exception as e:  # noqa: BLE001 - one failed batch fails its requests only
                for it in batch:
                    if not it[4].done():
                        it[4].set_exception(APIError(500, f"MDL decision failed: {type(e).__name__}: "
                                                          f"{str(e)[:200]}", "server_error"))

    def _decide(self, batch):
        t = time.perf_counter()
        out = self.gate.decide_batch([b[0] for b in batch], [b[1] for b in batch],
                                     [b[2] for b in batch], [b[3] for b in batch])
        self.seconds += time.perf_counter() - t
        return out


class BoundedEmbedder:
    """The gate's embedder inside the gateway. Memories come from clients, so their vectors must not
    pile up: ``Embedder``'s SQLite cache keeps every text ever seen (+601 kB per request of 256 new
    memories); this keeps at most ``max_texts`` vectors and ``max_bytes`` bytes in memory, least
    recently used dropped first, and writes nothing to disk. Each vector is kept under a digest of its
    text, never the text: a kept 900 kB memory costs what a short one does. Same contract:
    ``embed(texts)`` → (N, dim) float32, unit norm.

    Args:
      model: a sentence-transformers name or path (``resolve_model``).
      max_texts: vectors kept at most (>= 1).
      max_bytes: bytes kept at most (>= 1), as ``entry_bytes`` counts them; ``nbytes`` is the sum
        over what is kept, never above it.
      batch_size, device: the model's encoding batch size and device.

    Raises:
      ValueError: ``max_texts`` or ``max_bytes`` below 1.
    """

    def __init__(self, model: str = DEFAULT_MODEL, *, max_texts: int = LIMITS.embed_cache_texts,
                 max_bytes: int = LIMITS.embed_cache_bytes, batch_size: int = 64, device: str | None = None):
        if max_texts < 1:
            raise ValueError(f"max_texts: expected >= 1, got {max_texts}")
        if max_bytes < 1:
            raise ValueError(f"max_bytes: expected >= 1, got {max_bytes}")
        self.model_name = model
        self.load_path, self.model_id = resolve_model(model)
        self.max_texts, self.max_bytes, self.batch_size, self.device = max_texts, max_bytes, batch_size, device
        self.cache: collections.OrderedDict[bytes, np.ndarray] = collections.OrderedDict()  # digest → vector
        self.nbytes = 0  # Σ entry_bytes over the cache
        self._lock = threading.Lock()
        self.n_embedded = self.n_cached = 0
        self._source: Embedder | None = None
        self._key: str | None = None  # the source's model_id that the kept vectors came under

    @classmethod
    def like(cls, e: Embedder, max_texts: int = LIMITS.embed_cache_texts,
             max_bytes: int = LIMITS.embed_cache_bytes) -> BoundedEmbedder:
        out = cls(e.model_name, max_texts=max_texts, max_bytes=max_bytes, batch_size=e.batch_size,
                  device=e.device)
        out._source = e  # encode with e's own model: its backend (torch, onnx, onnx-int8) is kept
        return out

    @staticmethod
    def key(text: str) -> bytes:
        """What a text's vector is kept under: its SHA-256 (32 bytes)."""
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()

    @staticmethod
    def entry_bytes(key: bytes, vec: np.ndarray) -> int:
        """What one kept vector counts against ``max_bytes``: the Python size of its key and of the
        vector (which owns its data; the dictionary's own slot is not counted)."""
        return sys.getsizeof(key) + sys.getsizeof(vec)

    def _clear(self) -> None:
        self.cache.clear()
        self.nbytes = 0

    def _keep(self, key: bytes, vec: np.ndarray) -> None:
        """Under the lock: keep ``vec``, first dropping the least recently used until it fits."""
        vec = np.array(vec, np.float32, copy=True)  # its own buffer, not a row of the batch's
        size = self.entry_bytes(key, vec)
        old = self.cache.pop(key, None)
        if old is not None:
            self.nbytes -= self.entry_bytes(key, old)
        if size > self.max_bytes:
            return
        while self.cache and (len(self.cache) >= self.max_texts or self.nbytes + size > self.max_bytes):
            k, v = self.cache.popitem(last=False)
            self.nbytes -= self.entry_bytes(k, v)
        self.cache[key] = vec
        self.nbytes += size

    @property
    def model(self):
        if self._source is not None:
            return self._source.model
        from mdl_jax.signals.embeddings import load_model  # one copy of the weights per process

        return load_model(self.load_path, self.device or "cpu", self.model_id)

    def embed(self, texts: Sequence[str], desc: str = "embedding") -> np.ndarray:
        texts = [str(t) for t in texts]
        if not texts:
            raise ValueError("texts: expected at least one text")
        keys = {t: self.key(t) for t in texts}
        with self._lock:
            if self._source is not None and self._key not in (None, self._source.model_id):
                # the source switched backend ("auto" after a failure): its old vectors are not served
                self._clear()
                self._key = self._source.model_id
            found = {t: self.cache[keys[t]] for t in keys if keys[t] in self.cache}
            for t in found:
                self.cache.move_to_end(keys[t])
        todo = [t for t in dict.fromkeys(texts) if t not in found]
        if todo:
            key = None
            if self._source is None:
                vecs = np.asarray(self.model.encode(todo, batch_size=self.batch_size, convert_to_numpy=True,
                                                    normalize_embeddings=True, show_progress_bar=False),
                                  np.float32)
            else:
                # through the source Embedder, so that a backend failing at inference under "auto"
                # hands over to the next one as it does for the gate elsewhere
                while True:
                    vecs, key = self._source.encode_uncached(todo)
                    with self._lock:
                        switched = self._key not in (None, key)
                        if switched:  # the kept vectors are the old backend's: forget them
                            self._clear()
                        self._key = key
                    if not (switched and found):
                        break
                    # and the call's own kept ones: every text again, in one encode (a switch marks a
                    # backend failed, so this ends)
                    todo, found = list(dict.fromkeys(texts)), {}
            self.n_embedded += len(todo)
            found.update(zip(todo, vecs))
            with self._lock:
                for t, v in zip(todo, vecs if self._key == key or self._source is None else ()):
                    self._keep(keys[t], v)
        fresh = set(todo)
        self.n_cached += sum(1 for t in texts if t not in fresh)
        out = np.stack([found[t] for t in texts]).astype(np.float32)
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
