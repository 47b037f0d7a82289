"""``spectune validate``: a per-batch-size config against every static num_steps under a time-varying workload: the
plan, the workload, the run, per-phase numbers and the verdict."""
