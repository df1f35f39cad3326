"""A tally's checkpoint holds what it buffered: McNemar's joint counts waiting for a flush are
added before it is written (whole counts: the same totals), outside inference mode as the engine's
checkpoint hook calls it."""

from __future__ import annotations

import numpy as np
import torch

from headprobe.scoring.tally import Tally


def filled(units, both_hits) -> Tally:
    tally = Tally("toy", variants=("offset=-1",), layers=[0], n_heads=2, resamples=4)
    with torch.inference_mode():  # the engine adds in inference mode
        for unit, hits in zip(units, both_hits):
            values = torch.tensor([[[[1.0], [0.0]]]])  # [row, layer, head, direction]
            tally.add([unit], ["nsubj"], values, np.array([[1.0]]), np.array([[1.0]]))
            both = torch.tensor(hits, dtype=torch.float32).reshape(1, 1, 2, 1, 1)
            tally.add_both(["nsubj"], both)
            if unit == units[0]:
                tally.flush()  # the label's totals made, in inference mode, as in a run
    return tally


def test_a_checkpoint_written_with_joint_counts_waiting_gives_the_uninterrupted_totals(tmp_path):
    units, hits = ["a", "b", "c"], [[1, 0], [1, 1], [0, 1]]
    whole = filled(units, hits)
    expected = whole.arrays("nsubj")
    interrupted = filled(units, hits)
    path = tmp_path / "toy.npz"
    interrupted.save_checkpoint(path)  # outside inference mode, joint counts still buffered
    resumed = Tally.load_checkpoint(path)
    got = resumed.arrays("nsubj")
    assert got["both"][0, :, 0, 0].tolist() == [2, 2]  # [head]: hits counted by hand
    for name, array in expected.items():
        np.testing.assert_array_equal(got[name], array, err_msg=name)
