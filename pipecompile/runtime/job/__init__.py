"""What a job is before it runs: ``RunJob`` (a run, built and checked by one constructor at
every door, with the model file it reads), where its ranks run (``placement``, ``gpus``), its
refusals (``refusals``) and its faults' checks (``fault_checks``)."""
