"""The registry of benchmarks and ``load_benchmark``, the one entry point that finds a benchmark's files
(a user's path, the shared copy, or the hub) and checks its arguments.
"""

from __future__ import annotations

import os
import types
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np

from mdl_jax.evaluation.datasets import adarague, hub, rgb, shared
from mdl_jax.evaluation.datasets.files import ENV_BENCHMARK_DIR, ENV_DATA_DIR, DataError, benchmark_dir
from mdl_jax.evaluation.datasets.items import BenchmarkItem, BenchmarkSpec

_REGISTRY: dict[str, BenchmarkSpec] = {
    s.name: s for s in (rgb.SPEC, rgb.EQUAL_SPEC, *shared.SPECS, adarague.SPEC, *hub.SPECS)}

BENCHMARKS: Mapping[str, BenchmarkSpec] = types.MappingProxyType(_REGISTRY)
"""Every registered benchmark by name (read-only; ``register_benchmark`` adds one)."""

SHARED_BENCHMARKS = tuple(s.name for s in (rgb.SPEC, *shared.SPECS, adarague.SPEC))
"""The nine benchmarks with a copy in ``../shared/data/benchmarks`` (``rgb_en_fact_equal``, a second
reading of RGB's copy, is in ``BENCHMARKS`` only)."""

HUB_BENCHMARKS = tuple(s.name for s in hub.SPECS)
"""The benchmarks read from the hub (or a local export of it)."""


def register_benchmark(spec: BenchmarkSpec, *, replace: bool = False) -> BenchmarkSpec:
    """Add a benchmark to the registry, so ``load_benchmark(spec.name)`` loads it.

    Args:
        spec: the entry; its ``read`` function's docstring states the label rule.
        replace: allow replacing an entry of the same name.

    Returns:
        ``spec``.

    Raises:
        TypeError: ``spec`` is not a ``BenchmarkSpec``.
        ValueError: the name is taken (and ``replace`` is False), or empty.
    """
    if not isinstance(spec, BenchmarkSpec):
        raise TypeError(f"spec: expected a BenchmarkSpec, got {type(spec).__name__}")
    if not spec.name or not isinstance(spec.name, str):
        raise ValueError(f"spec.name: expected a non-empty string, got {spec.name!r}")
    if spec.name in _REGISTRY and not replace:
        raise ValueError(f"spec.name: {spec.name!r} is already registered; pass replace=True to replace it")
    _REGISTRY[spec.name] = spec
    return spec


def unregister_benchmark(name: str) -> BenchmarkSpec:
    """Remove a benchmark from the registry and return its entry.

    Raises:
        ValueError: no benchmark of that name (the known names are listed).
    """
    spec = _spec(name)
    del _REGISTRY[name]
    return spec


def _spec(name: object) -> BenchmarkSpec:
    if not isinstance(name, str) or name not in _REGISTRY:
        raise ValueError(f"name: expected one of {sorted(_REGISTRY)}, got {name!r}")
    return _REGISTRY[name]


_TEXT_FIELDS = ("qid", "group", "question", "condition")
_LABELS = ("should_adopt", "should_abstain", "has_conflict")


def _checked_items(name: str, got: object) -> list[BenchmarkItem]:
    """What a reader returned, as a list, once checked: a user's reader returning a string, a mapping,
    dicts, a memory set given as one string (read later as a set of its characters), a label that is
    no bool, or one qid twice (a user's gate scores are joined on it) is named here, not scored."""
    where = f"benchmark {name!r}: its reader returned"
    if isinstance(got, (str, bytes, Mapping)) or not isinstance(got, Iterable):
        raise TypeError(f"{where} {type(got).__name__}; expected a sequence of BenchmarkItem")
    items = list(got)
    first: dict[str, int] = {}
    for i, it in enumerate(items):
        if not isinstance(it, BenchmarkItem):
            raise TypeError(f"{where} items[{i}] of type {type(it).__name__}; expected BenchmarkItem")
        for f in _TEXT_FIELDS:
            if not isinstance(getattr(it, f), str):
                raise ValueError(f"{where} items[{i}].{f} = {getattr(it, f)!r}"[:200] + "; expected a string")
        if not isinstance(it.memories, (tuple, list)) or not all(isinstance(m, str) for m in it.memories):
            raise ValueError(f"{where} items[{i}].memories = {it.memories!r}"[:200] + "; expected a tuple of "
                             "memory texts")
        for f in _LABELS:
            # NumPy's bool too: a reader built on pandas or Parquet gives np.True_, scored as True
            if getattr(it, f) is not None and not isinstance(getattr(it, f), (bool, np.bool_)):
                raise ValueError(f"{where} items[{i}].{f} = {getattr(it, f)!r}; expected True, False or None")
        j = first.setdefault(it.qid, i)
        if j != i:
            raise ValueError(f"{where} items[{i}] with the qid {it.qid!r} of items[{j}]; expected each qid once")
    return items


def load_benchmark(name: str, *, path: str | os.PathLike | None = None, limit: int | None = None,
                   split: str | None = None) -> list[BenchmarkItem]:
    """Load a benchmark as ``BenchmarkItem``s (question, memory set, labels), in a fixed order.

    Where the files come from, in order: ``path``; else the benchmark's folder in ``$MDL_JAX_BENCHMARK_DIR``,
    or in ``benchmarks/`` of ``$MDL_JAX_DATA_DIR``, or in ``../shared/data/benchmarks`` beside the
    repository; else the hub, for benchmarks that have a hub reader (it needs a network).

    Args:
        name: a registry name (``BENCHMARKS``; ``BENCHMARKS[name].label_rule`` states its labels).
        path: the benchmark's folder in its upstream layout (for hub-only benchmarks: an export of the hub
            rows, one file or a folder of ``<split>.jsonl`` files).
        limit: read only ``limit`` source rows (questions), each with all its memory sets: the first ones
            of a one-file set; for the shared conflict and abstention sets with several splits (files),
            taken from the splits in turn; AdaRAGUE and the hub-only sets count across their splits in
            order (``mdl-jax benchmarks`` reads AdaRAGUE one split at a time).
        split: one of the benchmark's splits (``BENCHMARKS[name].splits``), or None for all.

    Returns:
        The items (a fresh list; the items are frozen).

    Raises:
        ValueError: an unknown ``name`` (the known names are listed), a ``limit`` below 1, or a ``split`` the
            benchmark does not have; an item from the reader with a field of the wrong type (a memory set
            that is one string, a label that is no bool) or a qid another item has (naming the item).
        TypeError: ``limit`` is not an int, ``split`` not a string, ``path`` not a path; the reader returned
            no sequence of ``BenchmarkItem``.
        DataError: the files are missing or malformed (the file, line and expected content are named), or
            no copy is found and the benchmark has no hub reader.
    """
    spec = _spec(name)
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise TypeError(f"limit: expected a positive int or None, got {type(limit).__name__}")
        if limit < 1:
            raise ValueError(f"limit: expected a positive int or None, got {limit}")
    if split is not None:
        if not isinstance(split, str):
            raise TypeError(f"split: expected a string or None, got {type(split).__name__}")
        if spec.splits is not None and split not in spec.splits:
            known = f"one of {list(spec.splits)}" if spec.splits else "None (it has one split)"
            raise ValueError(f"split: expected {known} for benchmark {name!r}, got {split!r}")
    if path is not None:
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path: expected a path or None, got {type(path).__name__}")
        p = Path(path)
        if not p.exists():
            raise DataError(f"path: {p} not found; expected the files of benchmark {name!r}")
        if spec.folder and not p.is_dir():
            raise DataError(f"path: {p} is a file; expected the folder holding the files of benchmark {name!r} "
                            f"(as in {spec.folder}/)")
        return _checked_items(name, spec.read(p, split, limit))
    root = benchmark_dir()
    if spec.folder and root is not None and (root / spec.folder).is_dir():
        return _checked_items(name, spec.read(root / spec.folder, split, limit))
    if spec.hub is not None:
        return _checked_items(name, spec.hub(split, limit))
    where = f"{root / spec.folder}" if root is not None else "no benchmark folder"
    raise DataError(f"benchmark {name!r}: no local copy ({where}); pass path=, or set {ENV_BENCHMARK_DIR} (or "
                    f"{ENV_DATA_DIR}, with a benchmarks/ folder) to a folder holding {spec.folder}/. "
                    f"Source: {spec.source}")
