"""`run --check`: one pipelined step compared with the eager model, in each way a run can go."""
