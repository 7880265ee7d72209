"""The bad-input catalogue behind tools/qa/bad_inputs.py: ``case`` (what a case is and how it runs)
and one module of cases per area."""
