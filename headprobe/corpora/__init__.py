"""Corpora: each reader turns a source into a list of `Example`s."""

from headprobe.corpora.base import CorpusError, Example, base_relation

__all__ = ["CorpusError", "Example", "base_relation"]
