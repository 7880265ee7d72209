"""Pipelined generation: the model's prefill and decode steps traced with a KV cache and split
into decoding stages at compile time, and at run time those stages with their caches, prompts
in lanes, and the ranks that continue them (``pipecompile generate``,
``CompiledPipeline.generate``, torchrun's ``pipecompile.surfaces.generate_worker``)."""
