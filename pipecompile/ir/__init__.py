"""The intermediate representation: the values every layer passes around and reads.

The traced graph's record and per-node facts, the stage graph, instructions and programs, the
facts a program is checked against, the verifier and the simulator beside the program they
read, byte and memory models, the machine description and how a mini-batch splits. The IR
imports nothing of pipecompile but ``errors``.
"""
