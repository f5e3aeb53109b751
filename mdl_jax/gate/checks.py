"""The gate's input checks: what a query, a memory list and a risk must be, with the message naming
the argument. ``MemoryGate``, ``mdl-jax gate``'s rows and the Ray Data component check their inputs
with these, so that one input gets one answer wherever it enters.
"""

from __future__ import annotations

import inspect
import math
import numbers
import re
from collections.abc import Callable, Mapping, Sequence

from mdl_jax.signals.aggregation import MAX_MEMORIES


def unit_float(name: str, x) -> float:
    """``x`` as a float in [0, 1], else a ValueError that begins with ``name``."""
    if type(x) is float and 0.0 <= x <= 1.0:  # the common case, without the ABC check (NaN fails it)
        return x
    try:
        f = None if isinstance(x, bool) or not isinstance(x, numbers.Real) else float(x)
    except OverflowError:   # an int past a double's range
        f = None
    if f is None or not math.isfinite(f) or not 0.0 <= f <= 1.0:
        try:
            got = repr(x)[:200]
        except ValueError:   # an int past Python's 4,300-digit str limit
            got = "an int of more than 4,300 digits"
        raise ValueError(f"{name}: expected a number in [0, 1], got {got}")
    return f


# a lone surrogate: a code point of UTF-16's pairs standing alone, which UTF-8 cannot encode
LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def surrogate_fault(text: str) -> str | None:
    """Why ``text`` is not Unicode text (a lone surrogate, which JSON's ``\\ud800`` escapes and
    ``surrogateescape`` decoding make: no tokenizer, UTF-8 writer, Arrow or Parquet file takes it),
    or None. The one check behind the gate's inputs and ``mdl-jax gate``'s rows.

    Args:
      text: a string.

    Returns:
      A message naming the character and its position, or None.
    """
    if text.isascii():  # constant time in CPython: the common text costs no scan
        return None
    m = LONE_SURROGATE.search(text)
    return None if m is None else (f"holds a lone surrogate ({m.group()!r} at character {m.start()}), "
                                   "which is not Unicode text (it cannot be written as UTF-8)")


def check_query(name: str, q) -> str:
    """``q`` if it is a non-empty string of Unicode text, else a ValueError that begins with ``name``."""
    return _text(name, q, "a non-empty string")


def _text(name: str, x, what: str) -> str:
    # ``x`` if it is a non-empty string of Unicode text, else a ValueError naming ``name`` and ``what``
    if not isinstance(x, str) or not x.strip():
        raise ValueError(f"{name}: expected {what}, got {x!r}"[:200])
    why = surrogate_fault(x)
    if why:
        raise ValueError(f"{name}: {why}")
    return x


def memory_texts(name: str, memories) -> list[str]:
    """The texts of one memory list; ValueError naming ``name`` (and the item) when malformed."""
    if type(memories) is list and len(memories) <= MAX_MEMORIES \
            and all(type(m) is str and m and not m.isspace() and (m.isascii() or not LONE_SURROGATE.search(m))
                    for m in memories):
        # the common case (a list of non-blank strings; JSON rows parse to it) without the ABC checks
        # below, which are a visible share of a bulk call's per-row cost (bench_gate)
        # (``m.isspace()`` is ``not m.strip()`` for a non-empty m)
        return list(memories)
    if isinstance(memories, (str, bytes, Mapping)) or not isinstance(memories, Sequence):
        raise ValueError(f"{name}: expected a list of memory texts or dicts with a 'text' field, "
                         f"got {type(memories).__name__}")
    if len(memories) > MAX_MEMORIES:  # checked before any work: the pairwise arrays grow as S²
        raise ValueError(f"{name}: expected at most {MAX_MEMORIES:,} memories (MAX_MEMORIES in "
                         f"mdl_jax.signals.aggregation: the pairwise work grows as their square), "
                         f"got {len(memories):,}")
    texts = []
    for j, m in enumerate(memories):
        if isinstance(m, Mapping):
            if "text" not in m:
                raise ValueError(f"{name}[{j}]: a memory dict needs a 'text' field "
                                 f"(got fields {sorted(map(str, m))})")
            m = m["text"]
        texts.append(_text(f"{name}[{j}]", m, "a non-empty memory text"))
    return texts


def risk_table(risk: Mapping) -> Callable[[str, str | None], float]:
    """A {category: risk} table as the assessor (query, category) → A, its values checked once; a
    category outside it is a ValueError naming ``category``."""
    if not risk:
        raise ValueError("risk: the {category: risk} table is empty")
    table = {str(k): unit_float(f"risk[{k!r}]", v) for k, v in risk.items()}
    if len(table) < len(risk):  # categories are read as text: 1 and "1" would be one category
        seen: dict[str, object] = {}
        for k in risk:
            if str(k) in seen:
                raise ValueError(f"risk: the keys {seen[str(k)]!r} and {k!r} name one category ({str(k)!r})")
            seen[str(k)] = k

    def lookup(q, c):
        if c is None or str(c) not in table:
            raise ValueError(f"category: {c!r} is not in the risk table (known: "
                             f"{sorted(table)[:8]}{' ...' if len(table) > 8 else ''})")
        return table[str(c)]
    return lookup


def risk_callable(risk: Callable) -> Callable[[str, str | None], float]:
    """A user's risk callable as the assessor, refused at once where it cannot be called as
    ``risk(query, category)``; each value it gives is checked to lie in [0, 1]."""
    try:
        inspect.signature(risk).bind("query", None)
    except TypeError as e:   # it cannot be called as risk(query, category)
        raise ValueError(f"risk: expected a callable (query, category) -> A in [0, 1]; {e}") from None
    except ValueError:       # a builtin whose signature cannot be read: called as given
        pass

    def call(q, c):
        return unit_float(f"risk: the risk callable's value for {q[:60]!r}", risk(q, c))
    return call
