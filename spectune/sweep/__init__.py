"""``spectune sweep``: every (num_steps, concurrency, repeat) point against one backend: the plan, the run, the live
display and the batch-dependent acceptance check."""
