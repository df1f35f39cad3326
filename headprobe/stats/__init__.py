"""The statistics engine (selection, intervals, tests) and the role engine."""
