"""A schedule program and what it is run and priced on: its instructions (``instr``), the
program (``program``), what each instruction waits for (``program_deps``), the verifier
(``verify_program``), the simulator and the loop it shares with the interpreter
(``simulate``, ``turns``), the stages' topology, the memory a device holds
(``memory_model``), what a recompute policy keeps (``recompute_policy``) and the machine
model (``cost_model``)."""
