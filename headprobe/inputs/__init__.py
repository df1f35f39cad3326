"""Corpora and probes -> examples -> tokenized, length-bucketed batches."""
