"""`--quiet` silences every progress bar of a model's loading, the GGUF conversion's included
(transformers draws that one with tqdm directly, past its own progress-bar switch)."""

from __future__ import annotations

from transformers import modeling_gguf_pytorch_utils as gguf

from headprobe.session import _quiet_loading


def convert(n: int = 5) -> int:
    """What transformers' GGUF loader does: a tqdm bar over the tensors."""
    return sum(1 for _ in gguf.tqdm(range(n), desc="Converting and de-quantizing GGUF tensors..."))


def test_quiet_loading_draws_no_gguf_bar(capsys):
    with _quiet_loading(True):
        assert convert() == 5
    assert "Converting" not in capsys.readouterr().err
    convert()  # restored after: drawn again where progress bars are on
    assert "Converting" in capsys.readouterr().err


def test_loading_with_progress_draws_it(capsys):
    with _quiet_loading(False):
        convert()
    assert "Converting" in capsys.readouterr().err
