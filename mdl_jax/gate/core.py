"""The memory gate: MDL for any query and the memories a retriever returned.

    gate = MemoryGate()                                 # bundled MiniLM, A = 0.5, paper defaults
    d = gate.decide("Is it safe to eat raw cookie dough?", ["Raw flour can carry E. coli", ...])
    d.action_name, d.scalars["C_final"], d.memories, d.messages

The gate holds four replaceable parts and runs the same code as the benchmark pipeline:
  embedder   ``mdl_jax.signals.embeddings.Embedder`` (a sentence-transformers name or path; cached on
             disk; run by OpenVINO in bfloat16 on a CPU with it, else ONNX Runtime, ``embed_backend``),
             an object with ``embed(texts)``, or any callable texts → (N, d) array
  risk       A: a constant, the presets ``"truthfulqa"`` (category table) / ``"halueval"`` (whole-word
             keywords on the query), a {category: risk} table, or a callable (query, category) → A
  conflict   φ's pairwise detector: texts → S×S booleans (default: the paper's lexical detector)
  config     an ``MDLConfig`` or the path of a config file (``save_config``)
M, R and φ come from ``mdl_jax.signals.aggregation.memory_signals`` (the pipeline's function), the
action from ``mdl_jax.decide``. Memories are texts or dicts with a ``"text"`` field; other fields
(source, trust, time, ...) are carried through untouched: MDL's signals are computed from the texts
alone, as in the paper. torch is imported only when a text is first embedded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import inspect
import time
from collections.abc import Callable, Mapping, Sequence
from os import PathLike
from typing import Any

import numpy as np

from mdl_jax.controller.config import MDLConfig
from mdl_jax.controller.config_file import load_config
from mdl_jax.controller.decision import ACTION_LABELS, Action
from mdl_jax.controller.validation import ArrayLike

# the input checks live in checks.py; these names stay importable from here, where callers found them
from mdl_jax.gate.checks import LONE_SURROGATE as LONE_SURROGATE
from mdl_jax.gate.checks import check_query as check_query
from mdl_jax.gate.checks import memory_texts as memory_texts
from mdl_jax.gate.checks import risk_callable, risk_table
from mdl_jax.gate.checks import surrogate_fault as surrogate_fault
from mdl_jax.gate.checks import unit_float as unit_float
from mdl_jax.prompts import ABSTENTION, chat, memory_block
from mdl_jax.signals.aggregation import RELEVANCE_THRESHOLD, memory_signals
from mdl_jax.signals.conflict import checked_conflict, pair_flags
from mdl_jax.signals.embeddings import AUTO, DEFAULT_MODEL, Embedder, check_backend
from mdl_jax.signals.risk import halueval_risk, truthfulqa_risk

ACTION_NAMES = ACTION_LABELS  # the gate's name for the paper's spelling (controller.decision)
SCALARS = ("M", "R", "A", "phi", "C", "alpha", "C_final", "E_wm", "E_r", "E_a")
RISK_PRESETS = ("truthfulqa", "halueval")


# --- the four parts ---------------------------------------------------------------------------------

class _CallableEmbedder:
    """A user's callable texts → (N, d) vectors behind the ``embed`` interface; rows are L2-normalised
    (the signals are cosines)."""

    def __init__(self, fn: Callable[[list[str]], Any]):
        self.fn = fn

    def embed(self, texts: Sequence[str], desc: str = "") -> np.ndarray:
        texts = list(texts)
        got = self.fn(texts)  # what the callable raises is its own error, not a fault of its result
        try:
            out = np.asarray(got, dtype=np.float32)
        except (TypeError, ValueError) as e:
            raise ValueError(f"embedder: the callable's result is not an array of numbers ({e})") from None
        if out.ndim != 2 or out.shape[0] != len(texts) or out.shape[1] < 1:
            raise ValueError(f"embedder: expected an (N, d) array for N = {len(texts)} texts, "
                             f"got shape {out.shape}")
        if not np.isfinite(out).all():
            raise ValueError("embedder: the callable returned NaN or infinite values")
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)


class _EmbedWithoutDesc:
    """An object whose ``embed(texts)`` takes no ``desc`` (what the gate documents) behind the
    ``embed(texts, desc=...)`` that ``memory_signals`` calls; its other attributes are the object's."""

    def __init__(self, inner: Any):
        self.inner = inner

    def embed(self, texts: Sequence[str], desc: str = "") -> Any:
        return self.inner.embed(texts)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _takes_desc(embed: Any) -> bool:
    """Whether ``embed`` takes a ``desc`` keyword (or any keyword); True where its signature cannot be
    read (a builtin), which is then called as before."""
    try:
        params = inspect.signature(embed).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.name == "desc" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
               or p.kind == p.VAR_KEYWORD for p in params)


def _make_embedder(embedder, cache_dir, batch_size, backend="auto"):
    check_backend(backend, name="embed_backend")
    if isinstance(embedder, (str, PathLike)):
        return Embedder(str(embedder), cache_dir=cache_dir, batch_size=batch_size, backend=backend)
    if backend != AUTO:  # an object runs its own model: a backend asked for here would be ignored
        raise ValueError(f"embed_backend: applies to a named embedder; the embedder given is a "
                         f"{type(embedder).__name__} (make it with the backend you want, e.g. "
                         f"Embedder(name, backend={backend!r}))")
    if hasattr(embedder, "embed"):
        return embedder if _takes_desc(embedder.embed) else _EmbedWithoutDesc(embedder)
    if callable(embedder):
        return _CallableEmbedder(embedder)
    raise ValueError("embedder: expected a sentence-transformers model name or path, an object with "
                     f"embed(texts), or a callable texts -> (N, d) array; got {type(embedder).__name__}")


def _missing(c) -> bool:
    # None, NaN of any float type, NaT, pandas' NA: what a table's empty cell reads as
    if c is None:
        return True
    try:
        return bool(c != c)
    except (TypeError, ValueError):   # pandas' NA (its comparisons are NA, whose truth is an error), an array
        return type(c).__name__ == "NAType"


def _category_text(c) -> str:
    # The preset's category: a missing one is "no category" (the table's default)
    if isinstance(c, str):
        return c
    if _missing(c):
        return ""
    raise ValueError(f"category: expected a string or None for the 'truthfulqa' risk preset, got {c!r}")


def _make_risk(risk) -> Callable[[str, str | None], float]:
    """The risk assessor (query, category) → A as a function; checks the spec once."""
    if isinstance(risk, str):
        if risk == "truthfulqa":
            return lambda q, c: truthfulqa_risk(_category_text(c))
        if risk == "halueval":
            return lambda q, c: halueval_risk(q)
        raise ValueError(f"risk: expected a number in [0, 1], one of {list(RISK_PRESETS)}, a "
                         f"{{category: risk}} table or a callable; got the string {risk!r}")
    if isinstance(risk, Mapping):
        return risk_table(risk)
    if callable(risk):
        return risk_callable(risk)
    a = unit_float("risk", risk)
    return lambda q, c: a


def _make_config(config) -> MDLConfig:
    if config is None:
        return MDLConfig()
    if isinstance(config, MDLConfig):
        return config
    if isinstance(config, (str, PathLike)):
        try:
            return load_config(config)
        except ValueError as e:  # ConfigFileError names the file and the field
            raise ValueError(f"config: {e}") from None
    if isinstance(config, Mapping):  # its fields, as a framework component's serialised form holds them
        try:
            fields: dict[str, Any] = {str(k): tuple(v) if isinstance(v, list) else v for k, v in config.items()}
            return MDLConfig(**fields)
        except (TypeError, ValueError) as e:
            raise ValueError(f"config: expected the fields of an MDLConfig ({e})") from None
    raise ValueError(f"config: expected an MDLConfig, the path of a config file or a dict of its fields, got "
                     f"{type(config).__name__}")


def _jsonable(x):
    # A memory's metadata as JSON kinds (built-in types: any JSON writer takes them): NumPy scalars as
    # Python's, arrays, sets and other sequences (a stored vector, a pandas Series) as lists, dates in
    # ISO form, anything else JSON has no kind for (a UUID, a Decimal, bytes) as its str()
    if isinstance(x, np.datetime64):
        return str(np.datetime_as_string(x))
    if isinstance(x, np.ndarray) and x.dtype.kind == "M":
        return np.datetime_as_string(x).tolist()
    if isinstance(x, np.generic):
        return x.item()
    if x is None or type(x) in (str, bool, int, float):
        return x
    if isinstance(x, (str, int, float)):   # a subclass (an IntEnum, a str subclass): the plain value
        return str(x) if isinstance(x, str) else float(x) if isinstance(x, float) else int(x)
    if isinstance(x, Mapping):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if hasattr(x, "isoformat"):
        return x.isoformat()
    if hasattr(x, "tolist"):   # NumPy arrays, pandas Series, torch tensors
        return _jsonable(x.tolist())
    if isinstance(x, (bytes, bytearray)) or not hasattr(x, "__iter__"):
        return str(x)
    return [_jsonable(v) for v in x]


# --- the decision --------------------------------------------------------------------------------


PAUSE_COLLECTOR_ROWS = 256


@contextlib.contextmanager
def collector_paused(n: int):
    """The garbage collector off while ``n`` ≥ PAUSE_COLLECTOR_ROWS decisions are built, if it was on.

    A bulk call builds ~4 objects per row (the decision, its scalars, two tuples), none in a cycle, yet
    every 700 allocations start a collection that walks the young objects, and every tenth of those the
    older ones: a sizeable share of ``decide_batch``'s time on large calls, for objects that can
    never be garbage (docs/benchmarks.md, bench_gate). Paused only here, for the objects' making; it runs again at the next allocation after. A caller that turned it off keeps it
    off (it is re-enabled only if this call turned it off)."""
    if n < PAUSE_COLLECTOR_ROWS or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@dataclasses.dataclass(frozen=True)
class GateDecision:
    """One gated decision. ``action``: ``mdl_jax.Action``; ``scalars``: M, R, A, φ, C, α, C_final and
    the subspace energies E_wm, E_r, E_a (plain floats); ``retrieved``: the memories as given;
    ``memories``: those to inject (all for Active / Supp, none for Silent / Opt-Out).

    Frozen; built by ``MemoryGate.decide`` / ``decide_batch``.

    Attributes:
      query: the query, as given.
      action: the ``Action`` (Active, Supp, Silent or Opt-Out).
      scalars: {"M", "R", "A", "phi", "C", "alpha", "C_final", "E_wm", "E_r", "E_a"}: plain floats
        (``SCALARS``): the signals, φ (conflict rate), the controller's C, α, C_final and the
        subspace energies ‖Π_k v_meta‖².
      retrieved: the memories as given (texts or dicts), a tuple.
      texts: the memories' texts, a tuple in the same order.
      abstention: the answer for Opt-Out (no model call).
    """

    query: str
    action: Action
    scalars: dict
    retrieved: tuple
    texts: tuple
    abstention: str = ABSTENTION

    @property
    def action_name(self) -> str:
        """"Active" | "Supp" | "Silent" | "Opt-Out"."""
        return ACTION_NAMES[self.action]

    @property
    def injects(self) -> bool:
        """True for Active and Supp, the actions that inject the memories."""
        return self.action in (Action.ACTIVE, Action.SUPP)

    @property
    def memories(self) -> list:
        """The memories to inject, as given (texts or dicts); [] for Silent and Opt-Out."""
        return list(self.retrieved) if self.injects else []

    @property
    def messages(self) -> list[dict] | None:
        """[system, user] messages for this query under this action (the benchmark's prompts: the
        memories for Active and Supp, with Supp's caution); None for Opt-Out, whose answer is
        ``abstention`` without a model call."""
        if self.action == Action.OPT_OUT:
            return None
        return chat(self.query, self.texts if self.injects else (), caution=self.action == Action.SUPP)

    def build_messages(self, messages: Sequence[Mapping]) -> list[dict] | None:
        """Apply the action to a caller's chat (OpenAI-style dicts with "role" and "content").

        Active: the memory block goes in front of the last user message's content; Supp: the block and
        the caution; Silent: the chat unchanged; Opt-Out: None (answer with ``abstention``). The input
        is not modified; a copy is returned.

        Args:
          messages: the chat, a list of dicts with a "role" and a "content" (a string, or a list of
            content parts: the memories then become a first text part); at least one "user" message.

        Returns:
          A new list of new dicts, or None for Opt-Out.

        Raises:
          ValueError: ``messages`` is not a list of dicts with a "role", has no user message, or the
            last user message's content is neither a string nor a list (naming the index).
        """
        if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
            raise ValueError("messages: expected a list of chat messages (dicts with 'role' and "
                             f"'content'), got {type(messages).__name__}")
        out = []
        for i, m in enumerate(messages):
            if not isinstance(m, Mapping) or "role" not in m:
                raise ValueError(f"messages[{i}]: expected a dict with a 'role' field, got {m!r}"[:200])
            out.append(dict(m))
        users = [i for i, m in enumerate(out) if m["role"] == "user"]
        if not users:
            raise ValueError("messages: expected at least one message with role 'user'")
        if self.action == Action.OPT_OUT:
            return None
        if not self.injects:
            return out
        block = memory_block(self.texts, caution=self.action == Action.SUPP)
        last = out[users[-1]]
        content = last.get("content")
        if isinstance(content, str):
            last["content"] = block + content
        elif isinstance(content, list):  # multi-part content: the memories as a first text part
            last["content"] = [{"type": "text", "text": block}] + list(content)
        else:
            raise ValueError(f"messages[{users[-1]}]: expected 'content' to be a string or a list of "
                             f"parts, got {type(content).__name__}")
        return out

    def to_dict(self) -> dict:
        """JSON-able: {"action": ``action_name``, "scalars": ``scalars``, "memories": ``memories``}, a
        memory's metadata in JSON kinds (arrays and sets as lists, dates in ISO form, other values
        JSON has no kind for, such as a UUID or bytes, as their ``str``)."""
        return {"action": self.action_name, "scalars": dict(self.scalars),
                "memories": _jsonable(self.memories)}


# --- the gate ----------------------------------------------------------------------------------------

class MemoryGate:
    """MDL between a retriever and a model, for any query and memories.

    Examples:
      >>> gate = MemoryGate(risk=0.5)           # bundled MiniLM, paper defaults
      >>> d = gate.decide("Is it safe to eat raw cookie dough?", ["Raw flour can carry E. coli"])
      >>> d.action_name, d.scalars["C_final"], d.memories      # doctest: +SKIP

    Args:
      embedder: a sentence-transformers model name or local path (default: the bundled
        all-MiniLM-L6-v2; vectors cached on disk under ``cache_dir``), an object with
        ``embed(texts) -> (N, d)``, or a callable ``texts -> (N, d)`` array (rows are L2-normalised).
      risk: A for every query: a number in [0, 1]; ``"truthfulqa"`` (the category table; an unknown or
        missing category gets 0.5) or ``"halueval"`` (whole-word keywords on the query); a
        {category: risk} table (a category outside it is an error); or a callable
        ``(query, category) -> float`` in [0, 1]. ``decide(..., risk=x)`` overrides it per call.
      conflict: ``texts -> S×S`` booleans, the pairs that contradict; default the paper's lexical
        detector (``mdl_jax.signals.conflict.pair_flags``).
      config: an ``MDLConfig``, the path of a config file or a dict of an ``MDLConfig``'s fields (as a
        serialised framework component holds it); default the paper's Table 2 settings.
      cache_dir: for a named embedder: its vector cache folder (default: the embedder's own).
      batch_size: for a named embedder: its encoding batch size.
      embed_backend: for a named embedder: what runs it (``Embedder``'s ``backend``). The default
        ``"auto"`` (``Embedder``'s ``auto_backend``), where the model can be exported and the
        ``signals`` extra's runtimes are installed: OpenVINO in bfloat16 on a CPU with AMX or
        AVX512-BF16 (within the parity the tests hold: cosine ≥ 0.9999 to torch's, every bundled gate
        action equal; the fastest uncached backend there, docs/benchmarks.md), else ONNX Runtime in
        float32 (torch's vectors to float32 rounding, faster than torch); else torch. ``"torch"`` pins
        sentence-transformers, ``"onnx"`` float32.
      relevance_threshold: the cosine above which a memory counts as relevant to the query (for R
        and φ; the paper's 0.3), in [0, 1].
      abstention: the answer an Opt-Out returns (no model call), a non-empty string.

    Raises:
      ValueError: naming the argument: an embedder that is neither a name, an object with
        ``embed`` nor a callable; an unknown ``embed_backend``, or one other than "auto" with an
        embedder that is not a name; a risk outside [0, 1], an unknown preset or an empty table; a
        conflict that is not callable; a config that is neither an ``MDLConfig`` nor a readable
        config file; a relevance threshold outside [0, 1]; an empty abstention.
    """

    def __init__(self, embedder: Any = DEFAULT_MODEL, risk: Any = 0.5,
                 conflict: Callable[[list[str]], Any] | None = None,
                 config: MDLConfig | str | PathLike | Mapping | None = None, *,
                 cache_dir: str | PathLike | None = None, batch_size: int = 64,
                 embed_backend: str = "auto",
                 relevance_threshold: float = RELEVANCE_THRESHOLD, abstention: str = ABSTENTION):
        self.config = _make_config(config)
        self.embedder = _make_embedder(embedder, cache_dir, batch_size, embed_backend)
        self.risk = _make_risk(risk)
        if conflict is not None and not callable(conflict):
            raise ValueError(f"conflict: expected a callable texts -> S×S flags, got "
                             f"{type(conflict).__name__}")
        # the default detector named explicitly stays itself: the small-store path's native flags are for it
        # (by identity: ``in`` would call a user's detector's own __eq__, which may return an array)
        self.conflict: Callable[[list[str]], Any] = (pair_flags if conflict is None or conflict is pair_flags
                                                      else checked_conflict(conflict))
        self.relevance_threshold = unit_float("relevance_threshold", relevance_threshold)
        if not isinstance(abstention, str) or not abstention:
            raise ValueError(f"abstention: expected a non-empty string, got {abstention!r}")
        self.abstention = abstention

    # -- columns: the array path the CLI and the benchmark use ---------------------------------------
    def check(self, queries: Sequence[str], memories_lists: Sequence[Sequence],
              categories: Sequence | None = None, risks: Sequence | None = None,
              ) -> tuple[list[str], list[list[str]], list, np.ndarray]:
        """Validate a batch of B queries and compute their risk A.

        Args:
          queries: B non-empty strings.
          memories_lists: B lists of memories (texts, or dicts with a "text" field), one per query.
          categories: None or B categories for the risk assessor.
          risks: None or B values: a number in [0, 1] overrides the assessor for that query, None
            keeps it.

        Returns:
          (queries, texts per query, categories, A as a (B,) float32 array).

        Raises:
          ValueError: naming the argument and index: a query that is not a non-empty string, a
            malformed memory list, a query or memory text holding a lone surrogate (not Unicode
            text: no tokenizer or UTF-8 writer takes it, whatever the embedder), a length that is
            not B, a risk outside [0, 1], a category outside the risk table or not a string for the
            "truthfulqa" preset (named by its index).
        """
        if isinstance(queries, (str, bytes)) or not isinstance(queries, Sequence):
            raise ValueError(f"queries: expected a list of strings, got {type(queries).__name__}")
        if isinstance(memories_lists, (str, bytes)) or not isinstance(memories_lists, Sequence):
            raise ValueError("memories_lists: expected one list of memories per query, got "
                             f"{type(memories_lists).__name__}")
        B = len(queries)
        if len(memories_lists) != B:
            raise ValueError(f"memories_lists: expected {B} lists (one per query), got {len(memories_lists)}")
        for name, xs in (("categories", categories), ("risks", risks)):
            if xs is not None and (isinstance(xs, (str, bytes)) or not hasattr(xs, "__len__") or len(xs) != B):
                raise ValueError(f"{name}: expected None or {B} values (one per query), got {type(xs).__name__}")
        qs = [check_query(f"queries[{i}]", q) for i, q in enumerate(queries)]
        texts = [memory_texts(f"memories_lists[{i}]", m) for i, m in enumerate(memories_lists)]
        cats = list(categories) if categories is not None else [None] * B
        A = np.empty(B, np.float32)
        for i in range(B):
            r = None if risks is None else risks[i]
            if r is not None:
                A[i] = unit_float(f"risks[{i}]", r)
                continue
            try:
                A[i] = self.risk(qs[i], cats[i])
            except ValueError as e:   # a category's error names its row
                if not str(e).startswith("category:"):
                    raise
                raise ValueError(f"categories[{i}]:{str(e)[len('category:'):]}") from None
        return qs, texts, cats, A

    def columns(self, queries: Sequence[str], memories_lists: Sequence[Sequence],
                categories: Sequence | None = None, risks: Sequence | None = None, *,
                progress: bool = False, timings: dict | None = None) -> dict[str, np.ndarray]:
        """The decision as columns: {"action": (B,) int32, "M", "R", "A", "phi", "C", "alpha",
        "C_final", "E_wm", "E_r", "E_a": (B,) float32, "n_relevant": (B,) int32}.

        ``timings``, if given, accumulates seconds per stage: "checks" (input checks and risk),
        "embedding", "conflict", "aggregation" (see ``memory_signals``) and "decision" (the controller).

        Args:
          queries: as ``check``.
          memories_lists: as ``check``.
          categories: as ``check``.
          risks: as ``check``.
          progress: a progress bar while embedding.
          timings: a dict to accumulate seconds per stage into (see above), or None.

        Returns:
          The columns above, one row per query.

        Raises:
          ValueError: as ``check``; an embedder whose output is not an (N, d) finite array of
            unit-norm rows (a callable's rows are normalised first); a conflict detector whose output
            is not an S×S matrix of booleans or 0/1.
        """
        t = timings if timings is not None else {}
        t0 = time.perf_counter()
        qs, texts, _, A = self.check(queries, memories_lists, categories, risks)
        t["checks"] = t.get("checks", 0.0) + time.perf_counter() - t0
        return self.columns_checked(qs, texts, A, progress=progress, timings=t)

    def columns_checked(self, qs: list[str], texts: list[list[str]], A: np.ndarray, *, progress: bool = False,
                         timings: dict | None = None) -> dict[str, np.ndarray]:
        """``columns`` on what ``check`` returns (queries, texts per query, A): for ``mdl-jax gate``,
        whose row parsing has checked each row already (a second check was a tenth of its time)."""
        t = timings if timings is not None else {}
        sig = memory_signals(qs, texts, self.embedder, conflict=self.conflict,
                             threshold=self.relevance_threshold, progress=progress, timings=t, engine="auto",
                             validate=False)
        t0 = time.perf_counter()
        out = self.decide_signals(sig["M"], sig["R"], A, phi=sig["phi"], n_relevant=sig["n_relevant"])
        t["decision"] = t.get("decision", 0.0) + time.perf_counter() - t0
        return out

    def decide_signals(self, M: ArrayLike, R: ArrayLike, A: ArrayLike, *, phi: ArrayLike | None = None,
                       n_relevant: ArrayLike | None = None) -> dict[str, np.ndarray]:
        """The controller on (B,) signals → the columns of ``columns`` (phi / n_relevant passed through).

        Args:
          M: (B,) relevance in [0, 1].
          R: (B,) reliability in [0, 1].
          A: (B,) task risk in [0, 1].
          phi: optional (B,) conflict rates, passed through (zeros when None).
          n_relevant: optional (B,) counts of relevant memories, passed through (no column when None).

        Returns:
          {"action": (B,) int32, "M", "R", "A", "phi", "C", "alpha", "C_final", "E_wm", "E_r",
            "E_a": (B,) float32[, "n_relevant": (B,) int32]}.

        Raises:
          ValueError: a signal outside [0, 1] (``decide``'s check, naming it and the index).
        """
        from mdl_jax.controller import api

        M, R, A = (np.ascontiguousarray(x, np.float32).reshape(-1) for x in (M, R, A))
        n = len(M)
        # Pad to a power-of-two length: a stream of chunks of varying length (skipped rows, the last
        # chunk) then compiles the controller for a handful of shapes, not one per length. The gate is
        # per-query middleware, so it asks for the fastest engine that can run here.
        p = max(16, 1 << max(n - 1, 0).bit_length()) - n
        sig = [np.concatenate([x, np.full(p, 0.5, np.float32)]) if p else x for x in (M, R, A)]
        d = api.decide(sig[0], sig[1], sig[2], self.config, engine="auto")
        e = np.asarray(d.energies, np.float32)[:n]
        out = {"action": np.asarray(d.action, np.int32)[:n], "M": M, "R": R, "A": A,
               "phi": np.zeros(n, np.float32) if phi is None else np.asarray(phi, np.float32),
               "C": np.asarray(d.C, np.float32)[:n], "alpha": np.asarray(d.alpha, np.float32)[:n],
               "C_final": np.asarray(d.C_final, np.float32)[:n], "E_wm": e[:, 0], "E_r": e[:, 1], "E_a": e[:, 2]}
        if n_relevant is not None:
            out["n_relevant"] = np.asarray(n_relevant, np.int32)
        return out

    # -- decisions ---------------------------------------------------------------------------------
    def decide_batch(self, queries: Sequence[str], memories_lists: Sequence[Sequence],
                     categories: Sequence | None = None, risks: Sequence | None = None, *,
                     progress: bool = False) -> list[GateDecision]:
        """One ``GateDecision`` per query: all texts embedded in batches, the controller run once.

        Args:
          queries: as ``check``.
          memories_lists: as ``check``.
          categories: as ``check``.
          risks: as ``check``.
          progress: a progress bar while embedding.

        Returns:
          B ``GateDecision``, in the order of ``queries``.

        Raises:
          ValueError: as ``check`` and ``columns``.
        """
        qs, texts, _, A = self.check(queries, memories_lists, categories, risks)
        return self._decisions(qs, texts, memories_lists, A, progress)

    def _decisions(self, qs: list[str], texts: list[list[str]], memories_lists: Sequence[Sequence],
                   A: np.ndarray, progress: bool = False) -> list[GateDecision]:
        # decide_batch after its checks (decide checks its own arguments, under their own names)
        cols = self.columns_checked(qs, texts, A, progress=progress)
        rows = [cols[k].tolist() for k in SCALARS]  # one conversion per column, not per value
        acts = list(Action)  # Action(i) is acts[i]: a list index, not an enum call per row
        with collector_paused(len(qs)):
            return [GateDecision(q, acts[a], dict(zip(SCALARS, vals)), tuple(given), tuple(t), self.abstention)
                    for q, a, vals, given, t in zip(qs, cols["action"].tolist(), zip(*rows), memories_lists, texts)]

    def decide(self, query: str, memories: Sequence, category: str | None = None,
               risk: float | None = None) -> GateDecision:
        """The decision for one query and its memories (texts or dicts with a "text" field).

        ``category`` feeds a table / preset / callable risk assessor; ``risk`` (a number in [0, 1])
        overrides the assessor for this call.

        Args:
          query: a non-empty string.
          memories: the retrieved memories: texts, or dicts with a "text" field (other fields are
            carried through untouched).
          category: the query's category, for a table, preset or callable risk assessor.
          risk: A for this call, a number in [0, 1]; None: the gate's assessor.

        Returns:
          The ``GateDecision``.

        Raises:
          ValueError: naming the argument: an empty query, a malformed memory, a query or memory
            holding a lone surrogate, a risk outside [0, 1], a category outside the risk table or
            not a string for the "truthfulqa" preset.
        """
        check_query("query", query)
        texts = memory_texts("memories", memories)
        A = np.array([self.risk(query, category) if risk is None else unit_float("risk", risk)], np.float32)
        return self._decisions([query], [texts], [memories], A)[0]
