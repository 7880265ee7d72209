"""Running compiled pipelines. The interpreter core lives here (loading stages, the executor and its
local backend); the rooms below it are ``training/``, ``check/`` and ``distributed/``."""
