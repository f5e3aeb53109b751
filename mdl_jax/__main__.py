from mdl_jax.cli import main

raise SystemExit(main())
