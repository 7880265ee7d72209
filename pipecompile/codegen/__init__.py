"""Code generation: stage sources, weights, manifest and program written to a directory."""
