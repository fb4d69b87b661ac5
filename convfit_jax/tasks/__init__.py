"""Command-line tasks that train nothing (`run(config)`); training tasks live in `train/`."""
