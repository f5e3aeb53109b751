"""What one ``mdl-jax gate`` run is asked to do (``GateJob``), and what every step of the run shares:
its error (``GateInputError``), the columns it adds, and the bounds of a part and of its messages.

The command line builds one ``GateJob`` from its flags and hands it to ``mdl_jax.gate.files.run``;
the reading, manifest and writing modules beside this one take the job, or the few of its fields they
need, never the parsed arguments. A job is checked once, when it is made, with the flag's name in
each message, so a bad value is one line and exit 2 before any file is opened.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import Any

from mdl_jax.gate.core import SCALARS
from mdl_jax.signals.embeddings import EMBED_BACKENDS

OUT_SUFFIXES = (".parquet", ".jsonl")
ON_BAD_ROW = ("error", "skip")  # ``--on-bad-row``: a bad row stops the run, or is skipped and counted
# The columns the gate adds to each row. An input row holding one of them is refused (exit 2): re-gating
# a gated file would overwrite its first decisions.
OUT_COLUMNS = ("mdl_row", "mdl_action", *(f"mdl_{k}" for k in SCALARS), "mdl_n_relevant")
OUT_COLUMN_SET = frozenset(OUT_COLUMNS)  # one set test a row, not one per column

# Bounds of a run's bookkeeping (the bounds of reading a row are in mdl_jax.gate.reading):
#   MAX_BAD_MESSAGES   skipped-row messages kept in the manifest and printed (the first ones); every
#                      skipped row is counted. Each message is cut to MAX_MESSAGE_CHARS.
#   MAX_RISK_TABLE_BYTES  a --risk JSON table: read whole, refused past this.
MAX_RISK_TABLE_BYTES = 1 << 24
MAX_BAD_MESSAGES = 100
MAX_MESSAGE_CHARS = 500
# Rows per part (``--chunk-size``'s default): a part's rows and columns are in memory at once (~3 KB a
# row of 6 memories: ~12 MB), and each part costs two fsyncs and a call's fixed work; with every text
# cached, larger parts stream faster until memory is the bound (bench_gate). A run resumed
# without --chunk-size keeps the size its parts were cut at (its manifest's).
CHUNK_SIZE = 4096


class GateInputError(ValueError):
    """Bad input or arguments for ``mdl-jax gate``; printed as one line, exit 2."""


def refuse_output_columns(names, *, where: str, what: str = "IN", columns: tuple[str, ...] = OUT_COLUMNS) -> None:
    """Refuse input that holds a column the gate writes, so no decision is overwritten silently (``mdl-jax
    gate``'s rows; ``MemoryGateBatch``'s batches, with the columns it writes).

    Args:
      names: the input's field or column names (a row dict, a list of column names).
      where: what the message begins with (the file and row, or "batch").
      what: the input, as the message names it ("IN", "the dataset").
      columns: the columns the caller writes.

    Raises:
      GateInputError: (a ValueError) naming the first of ``columns`` among ``names``.
    """
    clash = [c for c in columns if c in names]
    if clash:
        raise GateInputError(f"{where}: field {clash[0]!r} is one of the gate's output columns "
                             f"({', '.join(columns[:3])}, ...): is {what} already gated? Drop or rename its "
                             "mdl_* columns first, so no decision is overwritten")


def one_line(e: BaseException) -> str:
    """``e``'s message on one line, cut to 300 characters (for a message that quotes a library's)."""
    return " ".join(str(e).split())[:300]


def changed(what: str, detail: str) -> str:
    """What a resume onto a changed input, config, risk table or embedder is told."""
    return (f"{what} changed since it began ({detail}): resuming would join rows decided over both in one "
            "output; run again with --restart to start over")


def canonical(x: Any) -> Any:
    """A dataset value JSON has no type for, as a stable JSON value (never an address: PIL's repr has one)."""
    if isinstance(x, (bytes, bytearray)):
        return x.hex()
    if hasattr(x, "tolist"):
        return x.tolist()
    if hasattr(x, "tobytes"):  # an image
        return hashlib.sha256(x.tobytes()).hexdigest()
    return f"{type(x).__name__}:{x}"


@dataclasses.dataclass(frozen=True)
class RowFields:
    """Where a row keeps the gate's inputs: what ``reading.parse_row`` needs of a job.

    Attributes:
      query_field: the field holding the query.
      memories_field: the field holding the memories (a list of texts or of dicts with "text").
      category_field: the field holding the category, or None.
      risk_field: the field holding A in [0, 1], or None.
      kind: the input's kind (``reading.source_kind``): a "csv" cell holds the memories as JSON text.
    """

    query_field: str
    memories_field: str
    category_field: str | None
    risk_field: str | None
    kind: str


def _text(name: str, value: Any, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str):
        want = "a string or None" if optional else "a string"
        raise TypeError(f"GateJob.{name}: expected {want}, got {type(value).__name__}")


@dataclasses.dataclass(frozen=True)
class GateJob:
    """One ``mdl-jax gate IN --out OUT`` run: the input, the output and how rows are read and decided.

    Frozen and checked when made; each field is the flag of the same name (``--query-field`` is
    ``query_field``), with its default.

    Args:
      input: IN: a .jsonl / .parquet / .csv file, a dataset folder or a Hugging Face dataset name.
      out: OUT: a .parquet or .jsonl file name; its parts go to the folder ``OUT.parts`` beside it.
      query_field: the field holding the query.
      memories_field: the field holding the memories: a list of texts or of objects with "text".
      risk_field: a field holding A in [0, 1] (overrides ``risk``), or None.
      category_field: a field holding the category, for a category table, or None.
      risk: A for every row as the flag gives it: a number in [0, 1], "truthfulqa", "halueval", or the
        path of a JSON file {category: risk}.
      config: the path of an MDL config file, or None for the paper's Table 2.
      embedder: a sentence-transformers name or path, or ``module:function`` (texts -> (N, d)).
      embed_backend: what runs a named embedder (``EMBED_BACKENDS``).
      cache_dir: the embedding cache folder, or None for the default.
      split: the split of a Hugging Face dataset.
      chunk_size: rows per part, >= 1; None: ``CHUNK_SIZE``, or a resumed run's own.
      on_bad_row: "error" (a bad row stops the run) or "skip" (it is skipped and counted).
      restart: remove an unfinished run of OUT and start over.
      no_progress: no progress bar.

    Raises:
      TypeError: a field of the wrong type, naming it.
      GateInputError: (a ValueError) naming the flag: OUT without a .parquet or .jsonl suffix, a
        chunk size below 1, an ``on_bad_row`` or ``embed_backend`` outside its choices.
    """

    input: str
    out: str
    query_field: str = "query"
    memories_field: str = "memories"
    risk_field: str | None = None
    category_field: str | None = None
    risk: str = "0.5"
    config: str | None = None
    embedder: str = "all-MiniLM-L6-v2"
    embed_backend: str = "auto"
    cache_dir: str | None = None
    split: str = "train"
    chunk_size: int | None = None
    on_bad_row: str = "error"
    restart: bool = False
    no_progress: bool = False

    def __post_init__(self) -> None:
        for name in ("input", "out", "query_field", "memories_field", "risk", "embedder", "embed_backend",
                     "split", "on_bad_row"):
            _text(name, getattr(self, name))
        for name in ("risk_field", "category_field", "config", "cache_dir"):
            _text(name, getattr(self, name), optional=True)
        for name in ("restart", "no_progress"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"GateJob.{name}: expected a bool, got {type(getattr(self, name)).__name__}")
        c = self.chunk_size
        if c is not None and (isinstance(c, bool) or not isinstance(c, int)):
            raise TypeError(f"GateJob.chunk_size: expected an int or None, got {type(c).__name__}")
        # the command line's first checks, in its order and words
        if self.out_format not in OUT_SUFFIXES:
            raise GateInputError(f"--out: {Path(self.out)}: expected a .parquet or .jsonl file name")
        if c is not None and c < 1:
            raise GateInputError(f"--chunk-size: expected a positive int, got {c}")
        if self.on_bad_row not in ON_BAD_ROW:
            raise GateInputError(f"--on-bad-row: expected one of {list(ON_BAD_ROW)}, got {self.on_bad_row!r}")
        if self.embed_backend not in EMBED_BACKENDS:
            raise GateInputError(f"--embed-backend: expected one of {list(EMBED_BACKENDS)}, "
                                 f"got {self.embed_backend!r}")

    @property
    def out_format(self) -> str:
        """OUT's suffix, lower-cased: ".parquet" or ".jsonl"."""
        return Path(self.out).suffix.lower()

    @property
    def parts_folder(self) -> Path:
        """``OUT.parts``, where the parts and the manifest of an unfinished run are kept."""
        out = Path(self.out)
        return out.with_name(out.name + ".parts")

    def row_fields(self, kind: str) -> RowFields:
        """The fields rows are read by, for an input of ``kind`` (``reading.source_kind``)."""
        return RowFields(self.query_field, self.memories_field, self.category_field, self.risk_field, kind)
