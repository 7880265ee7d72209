"""What pipecompile knows about the files it writes: which ones it wrote (and may replace),
whether a place can be written, and how a disk or permission error reads."""
