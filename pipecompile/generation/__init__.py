"""Pipelined generation: decode stages with KV caches, prompts in lanes, and the ranks that
continue them (``pipecompile generate``, ``CompiledPipeline.generate``)."""
