"""Tasks of the command line that are not training loops (those live in `train/`)."""
