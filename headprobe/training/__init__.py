"""Heads over training: one model's checkpoints scored alike, and when each head's role appears.

    tl = headprobe.timeline(["ckpt/step_0", "ckpt/step_1000"], out="T", probe="repeated-random")
    tl.onsets                                   # headprobe.training.runner.Timeline

`series` (checkpoints, steps, the checks before loading), `runner` (the scoring, resumable),
`tables` (the timeline's tables from the saved results), `page` (its report). METHODS §17.
"""
