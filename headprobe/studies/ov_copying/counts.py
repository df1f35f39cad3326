"""The `ov_copying` analysis's name and the counts that define its copy rate, read by both its
declaration (`analysis`) and its math (`ov_circuits`, which imports torch)."""

NAME = "ov_copying"
SAMPLED_TOKENS = 2000  # ordinary tokens sampled for the copy rate
TOP_K = 5  # a token is copied when its own id is among the top TOP_K of its row
