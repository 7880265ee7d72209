"""The parts of tools/qa/fuzz.py: the model being generated (``model``), the ops it draws from
(``ops``), whole model files with their compile configuration (``generate``), and one case
through pipecompile, classified (``run``)."""
