"""What a training step carries beside the work: its precision (``precision``), its random
streams (``random_state``, ``op_seeds``), the weight versions of the asynchronous schedules
(``weight_versions``) and the figures it reports (``stats``, ``step_result``)."""
