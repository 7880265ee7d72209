"""What a process of a run deals with beside the work: the cores it shares with other
programs and ranks (``machine_load``, ``threads``), the signals that stop it (``interrupt``),
the notes it prints (``notes``) and the faults a test injects into it (``faults``)."""
