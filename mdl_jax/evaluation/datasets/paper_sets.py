"""The paper's two data sets: TruthfulQA (generation task) and HaluEval-QA, from local files or the hub.

Questions with their reference answers (``Item``), which the paper's reproduction builds memory stores
from (``mdl_repro.pipeline.stores``) and the framework examples use as a small real corpus. They are not
registered benchmarks (``registry``): they carry no memory set, only references.

Where the files come from, in order:
  1. an explicit ``data_dir`` / ``path`` argument (CLI: ``--data-dir``);
  2. the environment variable ``MDL_JAX_DATA_DIR`` (a folder holding TruthfulQA.csv and
     halueval_qa.jsonl, or .parquet / .jsonl / .csv files of those names);
  3. the folder ``../shared/data`` beside the repository, when it exists (the project's offline copy);
  4. the hub: ``truthfulqa/truthful_qa`` (config ``generation``, split ``validation``) and
     ``pminervini/HaluEval`` (config ``qa``, split ``data``); needs a network.
Local CSV / JSONL files are parsed here, line by line, so a missing file, a missing column or a
malformed line is a ``DataError`` that names the file, the line and what was expected; parquet files
and the hub go through the ``datasets`` library and are checked record by record.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import io
from collections.abc import Sequence
from pathlib import Path

# The data folder, its error type and the UTF-8 reader are shared with the benchmark loaders, one floor down.
from mdl_jax.evaluation.datasets.files import ENV_DATA_DIR, DataError, default_data_dir, iter_jsonl
from mdl_jax.evaluation.datasets.files import read_text as _read_text

HUB = {
    "truthfulqa": ("truthfulqa/truthful_qa", "generation", "validation"),
    "halueval": ("pminervini/HaluEval", "qa", "data"),
}
FILE_STEMS = {"truthfulqa": "TruthfulQA", "halueval": "halueval_qa"}
# Local-file column → canonical field, per dataset (the hub already uses the canonical names).
COLUMNS = {
    "truthfulqa": {"Type": "type", "Category": "category", "Question": "question",
                   "Best Answer": "best_answer", "Correct Answers": "correct_answers",
                   "Incorrect Answers": "incorrect_answers", "Source": "source"},
    "halueval": {"knowledge": "knowledge", "question": "question", "right_answer": "right_answer",
                 "hallucinated_answer": "hallucinated_answer"},
}
REQUIRED = {
    "truthfulqa": ("category", "question", "best_answer", "correct_answers", "incorrect_answers"),
    "halueval": ("knowledge", "question", "right_answer", "hallucinated_answer"),
}
DATASETS = tuple(HUB)


@dataclasses.dataclass(frozen=True)
class Item:
    """One question with its reference answers, dataset-independent.

    correct / incorrect: reference answers (TruthfulQA: best answer first; HaluEval: one each).
    context: HaluEval's knowledge snippet (empty for TruthfulQA).
    """

    dataset: str
    qid: int
    question: str
    category: str
    correct: tuple[str, ...]
    incorrect: tuple[str, ...]
    context: str = ""


def find_local(dataset: str, data_dir: str | Path | None) -> Path | None:
    """The local file for ``dataset`` in ``data_dir`` (or the default dir), else None (→ hub)."""
    d = Path(data_dir) if data_dir is not None else default_data_dir()
    if d is None:
        return None
    if not d.is_dir():
        raise DataError(f"data_dir: {d} is not a folder (set --data-dir or {ENV_DATA_DIR})")
    stem = FILE_STEMS[dataset]
    for ext in (".csv", ".jsonl", ".json", ".parquet"):
        if (d / (stem + ext)).is_file():
            return d / (stem + ext)
    raise DataError(f"{d}: no {stem}.csv / .jsonl / .parquet for dataset '{dataset}'")


def _read_csv(path: Path, dataset: str) -> list[tuple[int, dict]]:
    """(line, row with canonical field names) for every data row; blank lines are skipped."""
    reader = csv.reader(io.StringIO(_read_text(path), newline=""))
    header = next(reader, None)
    while header is not None and not any(h.strip() for h in header):
        header = next(reader, None)  # leading blank lines
    if header is None:
        raise DataError(f"{path}: empty file; expected a CSV header ({', '.join(COLUMNS[dataset])}) "
                        "and one row per question")
    _check_columns(path, dataset, header, line=reader.line_num)
    names = [COLUMNS[dataset].get(c, c) for c in header]
    width, rows, end = len(header), [], reader.line_num
    while True:
        try:
            row = next(reader, None)
        except csv.Error as e:  # e.g. a NUL byte, or a quote left open at the end of the file
            raise DataError(f"{path}, line {end + 1}: unreadable CSV ({e}); expected "
                            f"{width} comma-separated fields") from None
        if row is None:
            break
        line, end = end + 1, reader.line_num  # a quoted field may span lines: name the first
        if not any(f.strip() for f in row):
            continue
        if len(row) != width:
            raise DataError(f"{path}, line {line}: expected {width} fields "
                            f"({', '.join(header)}), got {len(row)}")
        if [f.strip() for f in row] == [h.strip() for h in header]:
            raise DataError(f"{path}, line {line}: a repeated header row; expected a question")
        rows.append((line, dict(zip(names, row))))
    if not rows:
        raise DataError(f"{path}: a header and no data rows; expected one row per question")
    return rows


def _read_jsonl(path: Path, dataset: str) -> list[tuple[int, dict]]:
    """(line, object with canonical field names) for every non-blank line."""
    rows = []
    for n, obj in iter_jsonl(path):
        _check_columns(path, dataset, list(obj), line=n)
        row = {COLUMNS[dataset].get(k, k): v for k, v in obj.items()}
        if all(row[f] in (f, *(k for k, c in COLUMNS[dataset].items() if c == f)) for f in REQUIRED[dataset]):
            raise DataError(f"{path}, line {n}: a repeated header (every field holds its own name); "
                            "expected a question")
        rows.append((n, row))
    if not rows:
        raise DataError(f"{path}: no records; expected one JSON object per line with "
                        f"{list(COLUMNS[dataset])}")
    return rows


def _check_columns(path: Path, dataset: str, cols: Sequence[str], line: int) -> None:
    canon = {COLUMNS[dataset].get(c, c) for c in cols}
    missing = [c for c in REQUIRED[dataset] if c not in canon]
    if missing:
        raise DataError(f"{path}, line {line}: missing column(s) {missing}; expected "
                        f"{list(COLUMNS[dataset])}")


# Fields that hold a list of answers: one string with ";" between answers, or a list of strings.
_ANSWER_LISTS = ("correct_answers", "incorrect_answers")


def _check_row(where: str, dataset: str, row: dict) -> None:
    """Every required field a non-empty string (answer lists: or a non-empty list of strings)."""
    for f in REQUIRED[dataset]:
        v = row.get(f)
        if f in _ANSWER_LISTS and isinstance(v, (list, tuple)):
            ok = bool(v) and all(isinstance(a, str) for a in v) and any(a.strip() for a in v)
            what = "a non-empty list of strings"
        else:
            ok = isinstance(v, str) and bool(v.strip())
            what = "a non-empty string" + (" (answers separated by ';') or a list of strings"
                                           if f in _ANSWER_LISTS else "")
        if not ok:
            raise DataError(f"{where}: {f}: expected {what}, got {v!r}")


def _split_answers(x) -> tuple[str, ...]:
    if isinstance(x, (list, tuple)):
        parts = x
    else:
        parts = str(x or "").split(";")
    return tuple(p.strip() for p in parts if p and p.strip())


def _item(dataset: str, i: int, row: dict) -> Item:
    if dataset == "truthfulqa":
        best = row["best_answer"].strip()
        correct = (best,) + tuple(a for a in _split_answers(row["correct_answers"]) if a != best)
        return Item(dataset, i, row["question"].strip(), row["category"].strip(), correct,
                    _split_answers(row["incorrect_answers"]))
    return Item(dataset, i, row["question"].strip(), "", (row["right_answer"].strip(),),
                (row["hallucinated_answer"].strip(),), row["knowledge"].strip())


def _identity(path: Path) -> tuple[int, int, int]:
    """What the memo of ``_load_text_file`` keys a file by besides its path: a file rewritten in place
    (new size, mtime or inode) is read again."""
    st = path.stat()
    return st.st_size, st.st_mtime_ns, st.st_ino


@functools.lru_cache(maxsize=8)
def _load_text_file(dataset: str, src: Path, limit: int | None, size: int, mtime_ns: int,
                    inode: int) -> tuple[Item, ...]:
    """A local .csv / .jsonl file parsed and checked once per process. One run reads each dataset
    several times (the pipeline, the judges, the gold report, the case studies), and parsing and
    checking HaluEval's 10,000 rows each time would repeat the same work. Items are frozen, and ``load`` hands out a fresh list, so a caller
    can never change what the next one gets. Bound: 8 entries (two datasets × a few limits)."""
    rows = _read_csv(src, dataset) if src.suffix == ".csv" else _read_jsonl(src, dataset)
    for line, row in rows:  # the whole file, whatever the limit: a bad file is an error
        _check_row(f"{src}, line {line}", dataset, row)
    return tuple(_item(dataset, i, row) for i, (_, row) in enumerate(rows[:limit]))


def load(dataset: str, data_dir: str | Path | None = None, *, path: str | Path | None = None,
         limit: int | None = None) -> list[Item]:
    """Load ``dataset`` ('truthfulqa' or 'halueval') as a list of ``Item`` in file order.

    Local .csv / .jsonl files are parsed here, line by line, so every defect (not UTF-8, no rows,
    a repeated header, a missing, null, non-string or empty field) is a ``DataError`` naming the
    file, the line and what was expected. Parquet files and the hub go through ``datasets`` and
    are checked record by record.
    """
    if dataset not in HUB:
        raise ValueError(f"dataset: expected one of {list(HUB)}, got {dataset!r}")
    src = Path(path) if path is not None else find_local(dataset, data_dir)
    if src is not None:
        if not src.is_file():
            raise DataError(f"{src}: file not found (dataset '{dataset}')")
        kind = {".csv": "csv", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}.get(src.suffix)
        if kind is None:
            raise DataError(f"{src}: expected a .csv, .jsonl or .parquet file")
        if kind != "parquet":
            return list(_load_text_file(dataset, src, limit, *_identity(src)))
    import datasets  # heavy; imported on use

    if src is not None:
        ds = datasets.load_dataset("parquet", data_files=str(src), split="train")
        _check_columns(src, dataset, ds.column_names, line=0)
        ds = ds.rename_columns({k: v for k, v in COLUMNS[dataset].items()
                                if k in ds.column_names and k != v})
    else:
        name, config, split = HUB[dataset]
        try:
            ds = datasets.load_dataset(name, config, split=split)
        except (ConnectionError, OSError) as e:
            # Offline with no local copy: the one thing to do is point at one, so say where we looked.
            raise DataError(f"{dataset}: no local copy (looked in data_dir / --data-dir, ${ENV_DATA_DIR} and "
                            f"../shared/data beside the repository) and the hub copy {name!r} cannot be "
                            f"reached ({type(e).__name__}); pass --data-dir or set {ENV_DATA_DIR} to a folder "
                            f"holding {FILE_STEMS[dataset]}.csv / .jsonl") from e
    if limit is not None:
        ds = ds.select(range(min(limit, len(ds))))
    items = []
    for i, row in enumerate(ds):
        _check_row(f"{src or HUB[dataset][0]}, record {i}", dataset, row)
        items.append(_item(dataset, i, row))
    if not items:
        raise DataError(f"{src or HUB[dataset][0]}: no records; expected one per question")
    return items
