"""Benchmark loaders: each benchmark's rows as (question, memory set, labels), with its label rule stated
once, in its reader's docstring (``BENCHMARKS[name].label_rule``).

``load_benchmark(name)`` reads the shared copy (``../shared/data/benchmarks``), a user's path, or the hub;
no data ships in the package. ``load_benchmark("adarague_llama8b")`` returns ``AdaRAGUEItem``s, which
also carry a reader's answers with no, one and multi-step retrieval.
"""

from mdl_jax.evaluation.datasets.adarague import AdaRAGUEItem, acc, acc_tok, read_adarague
from mdl_jax.evaluation.datasets.files import (
    ENV_BENCHMARK_DIR,
    ENV_DATA_DIR,
    DataError,
    benchmark_dir,
    default_data_dir,
)
from mdl_jax.evaluation.datasets.items import BenchmarkItem, BenchmarkSpec, mentions_answer, normalize_answer
from mdl_jax.evaluation.datasets.registry import (
    BENCHMARKS,
    HUB_BENCHMARKS,
    SHARED_BENCHMARKS,
    load_benchmark,
    register_benchmark,
    unregister_benchmark,
)

__all__ = [
    "AdaRAGUEItem",
    "BENCHMARKS",
    "BenchmarkItem",
    "BenchmarkSpec",
    "DataError",
    "ENV_BENCHMARK_DIR",
    "ENV_DATA_DIR",
    "HUB_BENCHMARKS",
    "SHARED_BENCHMARKS",
    "acc",
    "acc_tok",
    "benchmark_dir",
    "default_data_dir",
    "load_benchmark",
    "mentions_answer",
    "normalize_answer",
    "read_adarague",
    "register_benchmark",
    "unregister_benchmark",
]
