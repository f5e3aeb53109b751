"""The ONNX graph of a local model folder: exported once (and quantised to int8 on request), kept in the
cache folder, and checked against its recorded sha256 before every use.

Its own module because the graph is a file that outlives the process and is shared by every process
of a cache folder: how it is written (whole, through ``mdl_jax._io.atomic_path``, into folders that
are ours), where it is kept (``<cache_dir>/onnx/<name>-<content hash>/``) and how a damaged one is
found and written again are decided here, apart from running it (``onnx_encoder``).

Integrity: each exported file's sha256 is recorded beside it at export (``model.onnx.sha256``) and
checked before the file is used (``digest_fault``): a graph damaged with its size kept still loads and
gives wrong vectors, which the embedding cache would then keep as right.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from mdl_jax._io import atomic_path
from mdl_jax._paths import own_folder
from mdl_jax.signals.model_folder import folder_hash, model_pooling
from mdl_jax.signals.onnx_runtimes import import_onnxruntime

OPSET = 17


def _atomic_save(write, target: Path) -> None:
    """``write(path)`` (an exporter that takes a file name) into a fresh private folder beside the
    target, then fsync and rename (``mdl_jax._io.atomic_path``): a reader never sees half a graph,
    and a name planted at the target or beside it is replaced, never followed."""
    with atomic_path(target) as tmp:
        write(str(tmp))


DIGEST_SUFFIX = ".sha256"  # model.onnx's digest, recorded at export: model.onnx.sha256


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _record_digest(graph: Path) -> None:
    digest = _sha256(graph)
    _atomic_save(lambda tmp: Path(tmp).write_text(digest + "\n"), graph.with_name(graph.name + DIGEST_SUFFIX))


def digest_fault(graph: Path) -> str | None:
    """Why ``graph`` is not the file that was exported: its sha256 differs from the digest recorded
    beside it at export (``model.onnx.sha256``: bit rot, flipped bytes, another file written over it),
    or no digest was recorded; None when it matches.

    A graph damaged with its size kept still parses and loads, and its vectors come out silently
    wrong and would be cached as right, so each file is checked before use, not only parsed.

    Args:
        graph: the path of an exported ``.onnx`` file.

    Returns:
        A phrase naming what is wrong, or None.
    """
    try:
        recorded = graph.with_name(graph.name + DIGEST_SUFFIX).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return "has no digest recorded at export"
    try:
        actual = _sha256(graph)
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    return None if actual == recorded else (f"is damaged (its sha256 {actual[:16]}… is not the digest recorded "
                                            f"at export, {recorded[:16]}…)")


def _verified(graph: Path, redo) -> None:
    """Check ``graph`` against its digest; where it fails, warn and ``redo()`` (export it again), or raise
    a ValueError naming the file where it cannot be written again (a read-only cache)."""
    why = digest_fault(graph)
    if why is None:
        return
    import warnings

    try:
        warnings.warn(f"embedder: the exported graph {graph} {why}; exporting it again", RuntimeWarning,
                      stacklevel=3)
        redo()
    except (OSError, ValueError) as e:
        raise ValueError(f"embedder: the exported graph {graph} {why}, and it cannot be exported again "
                         f"({type(e).__name__}: {' '.join(str(e).split())[:200]}); remove it, or give a "
                         "writable cache_dir") from e


def export(model_path: str | Path, cache_dir: str | Path, *, int8: bool = False,
           force: bool = False) -> Path:
    """The ONNX graph of a local sentence-transformers folder, exported (and quantised) on first use.

    Args:
        model_path: a local model folder (``resolve_model`` gives the bundled MiniLM's).
        cache_dir: where the graphs are kept (``<cache_dir>/onnx/<name>-<content hash>/``).
        int8: also quantise the weights to int8 (dynamic quantisation) and return that graph.
        force: write the graph asked for again even if it is cached (a damaged one: it is replaced
          by an atomic rename, so a process reading it meanwhile sees the old file or the new one).

    Each file written gets its sha256 recorded beside it (``model.onnx.sha256``), and a cached file is
    checked against it before it is returned (``digest_fault``): one that differs, or has no digest, is
    exported again with a RuntimeWarning naming it.

    Returns:
        The path of ``model.onnx`` (or ``model.int8.onnx``), its bytes those exported.

    Raises:
        ValueError: ``model_path`` is not a local folder, or its pooling is neither mean nor CLS; a graph
          folder under ``cache_dir`` is a symlink or not ours (``own_folder``); a cached graph that
          fails its digest where it cannot be exported again (naming the file).
    """
    path = Path(model_path)
    if not path.is_dir():
        raise ValueError(f"embedder: backend onnx needs a local model folder (the bundled MiniLM or a "
                         f"path), got {str(model_path)!r}")
    model_pooling(path)  # refuse an unsupported pooling before exporting anything
    out = Path(cache_dir) / "onnx" / f"{path.name}-{folder_hash(path)}"
    fp32 = out / "model.onnx"

    def writable() -> None:
        # Before anything is written, both folders we make are checked to be real folders of ours: a
        # symlink planted at either would have the graphs written (and later loaded) wherever it
        # points. A cache that only needs reading (another account's, a read-only mount) is not.
        own_folder(Path(cache_dir) / "onnx", what="cache_dir")
        own_folder(out, what="cache_dir")

    if fp32.is_file() and not (force and not int8):  # (the int8 graph is made from it)
        _verified(fp32, lambda: export(model_path, cache_dir, force=True))
    if not fp32.is_file() or (force and not int8):
        writable()
        import torch
        from transformers import AutoModel

        class Body(torch.nn.Module):
            """The transformer with keyword inputs: positional order differs across transformers versions."""

            def __init__(self):
                super().__init__()
                # eager attention: the classic MatMul-Softmax pattern that ORT's BERT optimizer fuses
                self.m = AutoModel.from_pretrained(str(path), attn_implementation="eager").eval()

            def forward(self, input_ids, attention_mask, token_type_ids):
                return self.m(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).last_hidden_state

        model = Body().eval()
        ids = torch.ones((2, 8), dtype=torch.long)
        names = ["input_ids", "attention_mask", "token_type_ids"]
        dyn = {n: {0: "batch", 1: "seq"} for n in names}
        dyn["last_hidden_state"] = {0: "batch", 1: "seq"}

        def write(tmp):
            import warnings

            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the exporter's tracer warnings say nothing to a user
                # the TorchScript exporter (dynamo=False): one self-contained file, no onnxscript needed
                torch.onnx.export(model, (ids, ids, torch.zeros_like(ids)), tmp, input_names=names,
                                  output_names=["last_hidden_state"], dynamic_axes=dyn, opset_version=OPSET,
                                  dynamo=False)
        _atomic_save(write, fp32)
        _record_digest(fp32)
    if not int8:
        return fp32
    q8 = out / "model.int8.onnx"
    if q8.is_file() and not force:
        _verified(q8, lambda: export(model_path, cache_dir, int8=True, force=True))
    if not q8.is_file() or force:
        import_onnxruntime()  # (its telemetry off before the quantization package imports it)
        from onnxruntime.quantization import QuantType, quantize_dynamic

        writable()
        if force and damaged(fp32):  # the float32 graph it is made from is damaged too
            export(model_path, cache_dir, force=True)
        # per-channel weight scales: per-tensor int8 loses too much (min cosine 0.84 vs 0.97 to fp32)
        _atomic_save(lambda tmp: quantize_dynamic(str(fp32), tmp, weight_type=QuantType.QInt8,
                                                  per_channel=True), q8)
        _record_digest(q8)
    return q8


def damaged(graph: Path) -> bool:
    """Whether ``graph`` is not a readable ONNX model (truncated or overwritten on disk).

    Args:
        graph: the path of an ``.onnx`` file.

    Returns:
        True when ``onnx`` cannot parse it, or it lacks a graph with nodes and outputs, or an opset;
        False otherwise, and when ``onnx`` is not installed (nothing can tell then) or runs out of
        memory reading it. Never raises.
    """
    try:
        import onnx
    except ImportError:
        return False
    try:
        m = onnx.load(str(graph), load_external_data=False)
    except MemoryError:
        return False
    except Exception:  # noqa: BLE001 - DecodeError, OSError, ...: the file is not a model
        return True
    # protobuf parses an empty file, or one cut between two fields, as a model missing them
    return not (m.HasField("graph") and len(m.graph.node) and len(m.graph.output) and len(m.opset_import))
