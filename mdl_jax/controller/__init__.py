"""The controller: the library research code imports (JAX and NumPy only, no torch).

  config.py       MDLConfig: Table 2's zero-parameter defaults; numeric fields are pytree leaves
  decision.py     Algorithm 1 for ONE record: encode → fuse → read out → gate → act
  validation.py   eager input checks at the public edge
  api.py          decide / checked_decide / soft_decide: vmap + jit at the edge
  native.py       the native CPU kernel (_native/decide_cpu.cc) behind decide
  fused.py        the fused Pallas (Triton) GPU kernel behind decide and sweep on a GPU
  calibration.py  Section 3.4: n_min / n_max and θ from a calibration split
  sweep.py        config grids × all records in one compiled program (sweep, config_grid, ...)
  tuning.py       gradient tuning that keeps the paper's invariants (tune, tune_many)
  mesh.py         the 2-D (configs or runs, records) device mesh of sweeps and tuning
  stream.py       sweep_parquet: records streamed from Parquet through sweep's passes
  distributed.py  sweeps and tuning across processes and machines (jax.distributed)
  config_file.py  versioned JSON config files (save_config, load_config)

Nothing here imports the pipeline or the analyses; they import this.
"""
