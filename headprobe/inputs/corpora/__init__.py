"""Corpora: each reader turns a source into a `Corpus` (a list of `Example`s with skip accounting).

from headprobe.inputs.corpora.conllu import read_conllu            # CoNLL-U treebank
from headprobe.inputs.corpora.coref_windows import read_coref_examples  # CorefUD coreference windows
from headprobe.inputs.corpora.spacy_text import parse_text         # raw text, spaCy silver arcs
from headprobe.inputs.corpora.hf_datasets import read_hf_dataset   # Hugging Face datasets
"""

from headprobe.inputs.corpora.base import ALL, Corpus, CorpusError, Example, base_relation

__all__ = ["ALL", "Corpus", "CorpusError", "Example", "base_relation"]
