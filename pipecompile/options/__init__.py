"""Options declared once, as dataclass fields (``fields``), and the run's own (``run``): read
by the surfaces that parse them, the compiler that declares its flags the same way, and the
runtime that runs what they ask."""
