"""The surfaces: every way a user reaches pipecompile (the command line and its commands, the
Python API, the decorator, the compile job, the calibration's probe process), above the layers
they call."""
