"""The user's model: loading a model file and its hooks, its fingerprint, and running a
``@pipecompile.pipeline`` model's own forward. Used by the compiler and the runtime alike."""
