"""The attention stacks a model may have (`--stack`): an encoder's self-attention, a decoder's
self-attention, and cross-attention (decoder queries over encoder keys). Its own module, without
torch, so that the run's options read it without importing the model layer's tensors
(`headprobe.model.sites` says where each stack's attention is)."""

STACKS = ("encoder", "decoder", "cross")
