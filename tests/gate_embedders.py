"""Embedders for ``mdl-jax gate --embedder tests.gate_embedders:NAME`` in the CLI's failure-path tests
(kill -9 mid-run): deterministic vectors from each text's hash, no model to load. The real MiniLM is
used by the CLI's end-to-end test."""

import hashlib
import time

import numpy as np


def hashed(texts):
    """(N, 16) vectors seeded by sha256(text): equal texts give equal vectors, across processes."""
    return np.stack([np.random.default_rng(int.from_bytes(hashlib.sha256(t.encode()).digest()[:8],
                                                          "little")).normal(size=16) for t in texts])


def slow(texts):
    """``hashed``, 0.1 s per call: a chunk takes long enough to be killed mid-run."""
    time.sleep(0.1)
    return hashed(texts)


def broken(texts):
    """An embedder that fails on its first call: a run that crashes before any part is written."""
    raise RuntimeError("embedder down")


def bad_argument(texts):
    """An embedder whose own code raises a ValueError (not a fault of a result it returned)."""
    raise ValueError("texts must be lower-case")


CALLS = [0]  # the calls ``fails_after_one`` took: a test sets it to 0 first


def fails_after_one(texts):
    """``hashed`` on its first call, then down: a run that fails after its first part is written."""
    CALLS[0] += 1
    if CALLS[0] > 1:
        raise ConnectionError("the embedding service went away")
    return hashed(texts)


class _Service:
    """An object with ``embed(texts)`` (no ``desc``): unit rows of ``hashed`` on its first call, then
    its own ValueError."""

    def __init__(self):
        self.calls = 0

    def embed(self, texts):
        self.calls += 1
        if self.calls > 1:
            raise ValueError("the service says the texts are too long")
        v = hashed(texts)
        return v / np.linalg.norm(v, axis=1, keepdims=True)


SERVICE = _Service()  # a test sets SERVICE.calls to 0 first
