"""The paper's two data sets, TruthfulQA and HaluEval-QA: the library's loader
(``mdl_jax.evaluation.datasets.paper_sets``), under the name the pipeline's stages use."""

from mdl_jax.evaluation.datasets.paper_sets import (
    COLUMNS,
    DATASETS,
    ENV_DATA_DIR,
    FILE_STEMS,
    HUB,
    REQUIRED,
    DataError,
    Item,
    default_data_dir,
    find_local,
    load,
)

__all__ = ["COLUMNS", "DATASETS", "ENV_DATA_DIR", "FILE_STEMS", "HUB", "REQUIRED", "DataError", "Item",
           "default_data_dir", "find_local", "load"]
