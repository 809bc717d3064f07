"""Widgets every page reuses: engine controls, timeline scrubber, kernel timings, request editor,
explanations, page header, the run-a-comparison block."""
