"""The ctranslate2 generation engine (``CT2Backend``, ``--engine ctranslate2``) on a tiny random Llama
built here (offline, a second to convert): well-formed deterministic greedy output, reproducible seeded
sampling, cache keys that name the engine, and the local backend's interface. Skipped without the
``ct2`` extra."""

from __future__ import annotations

import inspect
import json

import pytest

pytest.importorskip("ctranslate2")
pytest.importorskip("transformers")

from mdl_repro.pipeline.generation import (  # noqa: E402
    CachedBackend,
    CT2Backend,
    GenerationCache,
    LocalBackend,
    make_backend,
    resolve_engine,
)
from mdl_repro.pipeline.generation import ct2 as ct2_mod  # noqa: E402

WORDS = ("the a is of and to in what where who capital city paris france river sky blue green red "
         "answer question yes no true false memory store because it was not one two three").split()
TEMPLATE = ("{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> "
            "{% endfor %}{% if add_generation_prompt %}<|im_start|> assistant {% endif %}")
PROMPTS = [[{"role": "user", "content": "what is the capital of france"}],
           [{"role": "system", "content": "memory store"}, {"role": "user", "content": "is the sky blue"}],
           "the river is"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A 2-layer random Llama with a word-level tokenizer and a chat template, saved as a checkpoint,
    and the cache dir pointed at a temporary folder (the conversion is cached there)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    root = tmp_path_factory.mktemp("tiny-llama")
    mp = pytest.MonkeyPatch()
    mp.setenv("MDL_JAX_CACHE_DIR", str(root / "cache"))
    vocab = {t: i for i, t in enumerate(["<unk>", "<|im_start|>", "<|im_end|>", "user", "system",
                                         "assistant", *WORDS])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", bos_token="<|im_start|>",
                                  eos_token="<|im_end|>", pad_token="<|im_end|>")
    tok.chat_template = TEMPLATE
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(vocab), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      bos_token_id=1, eos_token_id=2, pad_token_id=2, tie_word_embeddings=True)
    lm = LlamaForCausalLM(cfg)  # random weights: a flat next-token distribution, so seeds show
    path = root / "model"
    lm.save_pretrained(path)
    tok.save_pretrained(path)
    yield str(path)
    mp.undo()


def test_greedy_output_is_well_formed_and_deterministic(tiny):
    be = CT2Backend(tiny, batch_size=2, max_new_tokens=8)
    a = be.generate(PROMPTS, seed=0, temperature=0)
    b = CT2Backend(tiny, batch_size=3, max_new_tokens=8).generate(PROMPTS, seed=5, temperature=0)
    assert [g.text for g in a] == [g.text for g in b]  # greedy: no seed, no batch shape matters
    for g in a:
        assert isinstance(g.text, str) and not g.failed and not g.cached
        assert 0 <= g.n_tokens <= 8 and g.prompt_tokens > 0
        assert g.finish_reason in ("stop", "length")
        assert all(w in WORDS + ["user", "system", "assistant"] for w in g.text.split())
    assert be.tokens_generated == sum(g.n_tokens for g in a) and be.seconds > 0


def test_seeded_sampling_is_reproducible(tiny):
    be = CT2Backend(tiny, batch_size=2, max_new_tokens=12)
    first = [g.text for g in be.generate(PROMPTS, seed=[1, 2, 3])]
    assert [g.text for g in be.generate(PROMPTS, seed=[1, 2, 3])] == first  # same backend, next call
    assert [g.text for g in CT2Backend(tiny, batch_size=2, max_new_tokens=12)
            .generate(PROMPTS, seed=[1, 2, 3])] == first  # another instance
    others = {tuple(g.text for g in be.generate(PROMPTS, seed=[s, s + 1, s + 2])) for s in (10, 20, 30)}
    assert len(others | {tuple(first)}) > 1  # the seed is used


def test_cache_keys_name_the_engine(tiny, tmp_path):
    args = ("m", PROMPTS[0], 7, 150, 0.7, 0.9)
    torch_key = GenerationCache.key(*args)
    assert GenerationCache.key(*args, engine="torch") == torch_key  # existing caches keep replaying
    legacy = json.dumps(["m", PROMPTS[0], 7, 150, 0.7, 0.9], sort_keys=True, ensure_ascii=False)
    import hashlib

    assert torch_key == hashlib.sha256(legacy.encode()).hexdigest()
    assert GenerationCache.key(*args, engine="ctranslate2") != torch_key
    be = CT2Backend(tiny, batch_size=2, max_new_tokens=6)
    assert "ctranslate2" in be.model_id and be.engine == "ctranslate2"
    cached = CachedBackend(be, GenerationCache(tmp_path / "gen.sqlite"))
    a = cached.generate(PROMPTS, seed=[4, 5, 6])
    b = cached.generate(PROMPTS, seed=[4, 5, 6])
    assert [g.text for g in a] == [g.text for g in b] and all(g.cached for g in b)
    assert (cached.hits, cached.misses) == (3, 3)


def _params(fn):
    return {k: v.default for k, v in inspect.signature(fn).parameters.items() if k != "self"}


def test_interface_matches_the_local_backend(tiny):
    for name in ("generate", "score", "token_logprobs", "top_logprobs", "prompt_logprobs"):
        local, ct2 = _params(getattr(LocalBackend, name)), _params(getattr(CT2Backend, name))
        # the chunked-prefill hooks are the model server's (its long lane runs LocalBackend only)
        local = {k: v for k, v in local.items() if k not in ("prefill_chunk", "on_prefill")}
        assert local.items() <= ct2.items(), name  # every other LocalBackend parameter, same default
    be = CT2Backend(tiny, batch_size=2, max_new_tokens=4, dtype="float32")
    for attr in ("model_id", "max_new_tokens", "batch_size", "device", "dtype", "tokens_generated",
                 "seconds", "score_seconds", "calls", "failed_calls"):
        assert hasattr(be, attr), attr
    # scoring is the torch backend's on the same model (not generation): same numbers
    local = LocalBackend(tiny, batch_size=2, dtype="float32")
    assert be.score(PROMPTS[:2], ["yes", "no"]) == local.score(PROMPTS[:2], ["yes", "no"])
    got = be.generate(PROMPTS, seed=0, max_new_tokens=[2, 3, 4], stop=[["the"], [], []])
    assert [g.n_tokens <= m for g, m in zip(got, (2, 3, 4))] == [True] * 3
    assert "the" not in got[0].text.split()


def test_engine_choice(tiny, monkeypatch):
    monkeypatch.setattr("mdl_repro.pipeline.generation.loading.auto_dtype", lambda device: "bfloat16")
    assert resolve_engine("auto") == "torch"
    monkeypatch.setattr("mdl_repro.pipeline.generation.loading.auto_dtype", lambda device: "float32")
    assert resolve_engine("auto") == "ctranslate2"
    assert resolve_engine("auto", dtype="float32") == "torch"  # a dtype asked for: the torch path
    monkeypatch.setattr(ct2_mod, "ct2_available", lambda: False)
    assert resolve_engine("auto") == "torch"
    assert resolve_engine("torch") == "torch" and resolve_engine("ctranslate2") == "ctranslate2"
    with pytest.raises(ValueError, match="engine"):
        resolve_engine("onnx")
    monkeypatch.undo()
    assert isinstance(make_backend("local", tiny, engine="ctranslate2", batch_size=2), CT2Backend)
    assert isinstance(make_backend("local", tiny, engine="torch"), LocalBackend)
    with pytest.raises(ValueError, match="engine"):
        make_backend("openai", "m", engine="ctranslate2")
    for eng in ("torch", "ctranslate2"):  # weights= is llama.cpp's alone: named, before any model loads
        with pytest.raises(ValueError, match=rf"weights: only the llama.cpp engine .* the {eng} engine"):
            make_backend("local", tiny, engine=eng, weights="q8_0")
    with pytest.raises(ValueError, match=r"weights: only the local backend's llama.cpp engine .* 'openai'"):
        make_backend("openai", "m", weights="q8_0")


def test_conversion_is_cached(tiny):
    path, _ = ct2_mod.ct2_model(tiny)
    stamp = (path / "model.bin").stat().st_mtime_ns
    again, _ = ct2_mod.ct2_model(tiny)
    assert again == path and (path / "model.bin").stat().st_mtime_ns == stamp
    assert str(path).startswith(str(ct2_mod.default_cache_dir()))
