"""Measuring one window against a server: warm-up, counter snapshots, the requests, the engine's batch size,
acceptance and a status (:func:`spectune.measure.window.measure_window`); what sweep and validate share."""
