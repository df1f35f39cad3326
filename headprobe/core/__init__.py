"""The bottom layer: what every other layer shares and nothing of headprobe's own.

- `errors`: the errors a user sees as one line (the CLI's exit status 2);
- `seeds`: the run's seed and the keyed hashes every draw comes from (folds, bootstrap weights,
  random baselines, probes, masked positions), keyed by content and ids, never by paths;
- `atomic`: directories that are whole or absent (staging, atomic swap, lock, hashes, JSON);
- `torch_modes`: torch's gradient modes as decorators that import torch only when called.
- `processes`: how worker processes are started (forked where the platform has it).

Modules here import no other headprobe module.
"""
