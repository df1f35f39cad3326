"""Where things are in a model and what it computes: loading, attention sites, capture, gates."""
