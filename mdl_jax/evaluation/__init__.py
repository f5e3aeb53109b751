"""The evaluation harness: benchmark loaders, and metrics of any gate on the same records with intervals."""
