"""Training a loaded pipeline: the step loop, its options, saved train state, metrics and export."""
