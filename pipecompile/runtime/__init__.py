"""Running compiled pipelines: loading stages, the interpreter and its backends."""
