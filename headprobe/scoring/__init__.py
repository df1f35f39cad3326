"""The streaming pass: engine, measures, tallies, checkpoints, torchrun."""
