"""Deciding from measured results: recommend (per-concurrency choices, batch-size slots), the engines' config files
and SGLang ladders, offline policy simulation, CI gates and the HTML report."""
