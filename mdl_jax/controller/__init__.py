"""The controller: the library research code imports (JAX and NumPy only, no torch).

  config.py       MDLConfig: Table 2's zero-parameter defaults; numeric fields are pytree leaves
  decision.py     Algorithm 1 for ONE record: encode → fuse → read out → gate → act
  validation.py   eager input checks at the public edge
  api.py          decide / checked_decide / soft_decide: vmap + jit at the edge; engine= (the engines
                  of mdl_jax/engines/, loaded by name on request)
  calibration.py  Section 3.4: n_min / n_max and θ from a calibration split
  sweep.py        config grids × all records in one compiled program (sweep, config_grid, ...)
  batches.py      batches of configs: config_grid, stack_configs, their checks (re-exported by sweep)
  passes.py       the sweep's pass machinery: engines, the device mesh, exact sums (Reducer)
  tuning.py       gradient tuning that keeps the paper's invariants (tune, tune_many)
  tune_settings.py  TuneSettings, default_optimizer, GeometricTemperature (re-exported by tuning)
  tune_params.py  free parameters ↔ a config that keeps the invariants (re-exported by tuning)
  tune_program.py the compiled training loop of B runs (lax.scan, vmapped, on the mesh)
  mesh.py         the 2-D (configs or runs, records) device mesh of sweeps and tuning
  stream.py       sweep_parquet: records streamed from Parquet through sweep's passes
  checkpoint.py   a streamed sweep's progress on disk: resumed to the same bits, never onto other inputs
  distributed.py  sweeps and tuning across processes and machines (jax.distributed)
  config_file.py  versioned JSON config files (save_config, load_config)

Nothing here imports the pipeline, the analyses or the engines; they import this.
"""

# The kernels' modules lived here until they moved to mdl_jax/engines/: ``from mdl_jax.controller import
# native`` (or ``fused``) still works for one release, with a DeprecationWarning, through importlib by
# name (the controller holds no import of the engines).
_MOVED = {"native": "mdl_jax.engines.native", "fused": "mdl_jax.engines.fused"}


def __getattr__(name: str):
    if name in _MOVED:
        import importlib
        import warnings

        warnings.warn(f"mdl_jax.controller.{name} moved to {_MOVED[name]}; import it from there",
                      DeprecationWarning, stacklevel=2)
        return importlib.import_module(_MOVED[name])
    raise AttributeError(f"module 'mdl_jax.controller' has no attribute {name!r}")
