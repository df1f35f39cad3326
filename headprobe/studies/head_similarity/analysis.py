"""Head clustering (Clark et al. 2019 section 5, Figure 6): how alike two heads attend.

For each word row (a word as query; specials are not queries) the two heads' word-level
attention distributions over the keys (`att.words`: the sentence's words and the CLS-like
and SEP-like special columns; each row renormalised to sum to 1, which changes it only
where the tokenizer adds other special pieces) are compared by the Jensen-Shannon
divergence, in nats (0 <= JS <= ln 2, with 0 log 0 = 0, no smoothing):

    JS(P, Q) = H((P + Q) / 2) - (H(P) + H(Q)) / 2

The distance of two heads is the mean JS over every word row of the corpus (Clark et al.
average over their tokens; their code also smooths rows by 0.001 / length and works on
pieces, not words).

Streaming: a batch's pairwise JS sums add up per unit into a pair tally (`PairScorer`: receiver
head x sender head, value "mass", per fold and bootstrap resample, METHODS §5), one label `js`,
n = word rows. `head_distances` is its pair table (`stats.pair_estimates.pair_table`): one row
per ordered pair of heads, layer, head, sender_layer, sender_head, n, score (the mean JS on the
whole data), ci_low, ci_high (95% bootstrap interval over units), p, p_holm (the pair table's
test that the divergence is above 0; Holm over every pair) and score_fold0, score_fold1 (each
half of the units alone: how stable the distances are). The divergence is symmetric, so
(a, b) and (b, a) hold the same numbers.

Not run by default (`--analyses head_similarity`): it keeps every scored layer's attention
of a batch until the batch ends and costs (layers x heads)^2 / 2 divergences per row; its
tally holds (layers x heads)^2 float64 cells per fold and resample (72 heads, 1,000 resamples:
83 MB; fewer resamples, `--bootstrap`, shrink it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from headprobe.extend import SENTENCES, Analysis, BatchState, RowIndex, register
from headprobe.scoring.measures import MASS
from headprobe.scoring.pair_scorer import PairScorer, pair_values
from headprobe.scoring.pair_tally import pair_arrays
from headprobe.stats.pair_estimates import PAIR_COLUMNS, pair_table

if TYPE_CHECKING:
    import torch

LABEL = "js"  # the tally's one label: the mean Jensen-Shannon divergence
CHUNK_BYTES = 64 * 2**20  # working memory of one block of pairwise mixtures
PAIR_KEYS = ["layer", "head", "sender_layer", "sender_head"]  # receiver (first) and sender heads
DISTANCE_COLUMNS = [c for c in PAIR_COLUMNS if c != "channel"] + ["score_fold0", "score_fold1"]


def js_row_sums(p: torch.Tensor, group: torch.Tensor, n_groups: int) -> torch.Tensor:
    """Summed JS divergence of every pair of heads, per group of rows.

    p: [head, row, key] distributions (rows sum to 1); group: [row] group index.
    Returns [group, head, head] (symmetric, zero diagonal), float64."""
    import torch

    k, r, c = p.shape
    entropy = torch.special.entr(p).sum(-1)  # [head, row]
    out = torch.zeros(n_groups, k, k, dtype=torch.float64, device=p.device)
    per_pair = max(1, r * c * p.element_size())
    start = 0
    while start < k:  # first heads [start, stop) against heads b >= start
        stop = min(k, start + max(1, CHUNK_BYTES // (per_pair * (k - start))))
        mix = (p[start:stop, None] + p[None, start:]) / 2  # [a, b, row, key]
        js = (
            torch.special.entr(mix).sum(-1)
            - (entropy[start:stop, None] + entropy[None, start:]) / 2
        )
        js = js.clamp_min(0).double()  # [a, b, row]
        summed = torch.zeros(
            n_groups, stop - start, k - start, dtype=torch.float64, device=p.device
        )
        summed.index_add_(0, group, js.permute(2, 0, 1))
        out[:, start:stop, start:] = summed
        start = stop
    upper = torch.triu(torch.ones(k, k, dtype=torch.bool, device=p.device), 1)
    out = torch.where(upper, out, out.transpose(1, 2))  # mirror the upper triangle
    out[:, torch.arange(k), torch.arange(k)] = 0.0
    return out


class HeadSimilarityScorer(PairScorer):
    analysis = "head_similarity"
    value = "mass"
    reads = MASS  # norms: row-normalised N (METHODS §7)

    def prepare(self, batch) -> BatchState:
        rows = RowIndex()
        for example in batch.examples:  # one row per unit, in order of first use
            rows.count(example.unit, LABEL, len(example.words))
        units = {unit: row for row, (unit, _) in enumerate(rows.keys)}
        # own: each unit's row, and the layers' row-normalised word attention as they come
        return self.new_state(batch, rows.keys, rows.n, (units, []))

    def update(self, att, state) -> None:
        import torch

        words = att.words  # [layer, measure, batch, head, word, word + 2]
        total = words.sum(-1, keepdim=True)
        shares = words / total.clamp_min(torch.finfo(words.dtype).tiny)
        layers, measures, batch, heads, *rest = shares.shape
        # [measure, batch, layer x head, word, word + 2]: heads layer-major, as the pair cells
        state.own[1].append(
            shares.permute(1, 2, 0, 3, 4, 5).reshape(measures, batch, layers * heads, *rest)
        )

    def end_batch(self, state) -> None:
        import torch

        units, layers = state.own
        if state.keys and layers:
            p = torch.cat(layers, dim=2)  # [measure, batch, K, word, key]
            n_layers, heads = len(self.layers), self.n_heads
            example_np, word_np = state.batch.word_rows()  # the real word rows (host)
            example = torch.from_numpy(example_np).to(p.device)
            word = torch.from_numpy(word_np).to(p.device)
            slot = torch.tensor([units[ex.unit] for ex in state.batch.examples], device=p.device)
            pairs = pair_values(self, state)  # [measure, layer, channel, row, head, s_l, s_h]
            for m in range(len(p)):
                rows = p[m].permute(1, 0, 2, 3)[:, example, word]  # [K, row, key]
                sums = js_row_sums(rows, slot[example], len(units))  # [unit, K, K]
                sums = sums.view(len(units), n_layers, heads, n_layers, heads)
                pairs[m, :, 0] = sums.permute(1, 0, 2, 3, 4).to(pairs.dtype)  # [l, unit, h, sl, sh]
        super().end_batch(state)


def distance_frame(tally) -> pd.DataFrame:
    """`head_distances` from a head_similarity pair tally: one row per ordered pair of heads
    (`pair_table`'s columns but the channel, and each fold's mean divergence)."""
    if tally is None or not tally.labels:
        return pd.DataFrame(columns=DISTANCE_COLUMNS)
    table = pair_table(tally)
    folds = []  # per label, [fold, pair] in the pair table's order
    for label in tally.sorted_labels():
        arrays = pair_arrays(tally, label)
        mass = arrays["hits"][:, 0, ..., 0]  # [fold, layer, head, s_layer, s_head]
        n = arrays["n"][:, 0, 0]  # [fold]
        with np.errstate(invalid="ignore", divide="ignore"):
            folds.append(mass.reshape(len(mass), -1) / n[:, None])
    table["score_fold0"], table["score_fold1"] = np.concatenate(folds, axis=1)
    return table[DISTANCE_COLUMNS]


def distance_matrix(
    distances: pd.DataFrame, column: str = "score"
) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """(square matrix [receiver, sender], heads in its order) from a `head_distances` table."""
    layer, head, s_layer, s_head = (distances[c].astype(int) for c in PAIR_KEYS)
    heads = sorted(set(zip(layer, head)))
    index = {h: i for i, h in enumerate(heads)}
    matrix = np.full((len(heads), len(heads)), np.nan)
    rows = np.asarray([index[h] for h in zip(layer, head)], dtype=np.int64)
    cols = np.asarray([index.get(h, -1) for h in zip(s_layer, s_head)], dtype=np.int64)
    keep = cols >= 0
    matrix[rows[keep], cols[keep]] = distances[column].to_numpy(np.float64)[keep]
    return matrix, heads


# ---------------------------------------------------------------- clusters (Clark et al. Figure 6)

CLUSTER_COLUMNS = [
    "layer",
    "head",
    "name",
    "mds_x",
    "mds_y",
    "cluster",
    "nearest",
    "nearest_js",
    "nearest_same_layer",
]


def embed(matrix: np.ndarray, seed: int = 0) -> np.ndarray:
    """[head, 2]: metric MDS (scikit-learn, SMACOF) of the JS divergences, so that Euclidean
    distances in the plane follow the divergences (as Clark et al. Figure 6)."""
    from sklearn.manifold import MDS

    if len(matrix) < 3:
        return np.zeros((len(matrix), 2))
    mds = MDS(
        n_components=2,
        metric="precomputed",
        n_init=4,
        init="random",
        random_state=seed,
        normalized_stress="auto",
    )
    return mds.fit_transform(np.nan_to_num((matrix + matrix.T) / 2))


def linkage(matrix: np.ndarray) -> np.ndarray:
    """Average-linkage hierarchical clustering (scipy) of the heads on their JS divergences."""
    from scipy.cluster.hierarchy import linkage as scipy_linkage
    from scipy.spatial.distance import squareform

    square = np.nan_to_num((matrix + matrix.T) / 2)
    np.fill_diagonal(square, 0.0)
    return scipy_linkage(squareform(square, checks=False), method="average")


def head_clusters(distances: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """One row per head: its MDS position, its average-linkage cluster (the tree cut into as
    many clusters as there are layers) and its nearest other head."""
    from scipy.cluster.hierarchy import fcluster

    if not len(distances):
        return pd.DataFrame(columns=CLUSTER_COLUMNS)
    matrix, heads = distance_matrix(distances)
    xy = embed(matrix, seed)
    n_layers = len({layer for layer, _ in heads})
    cluster = (
        fcluster(linkage(matrix), t=n_layers, criterion="maxclust")
        if len(heads) > 1
        else np.ones(len(heads), dtype=int)
    )
    off = matrix + np.diag(np.full(len(heads), np.inf))
    nearest = np.nanargmin(off, axis=1) if len(heads) > 1 else np.zeros(len(heads), dtype=int)
    return pd.DataFrame(
        {
            "layer": [h[0] for h in heads],
            "head": [h[1] for h in heads],
            "name": [f"{a}-{b}" for a, b in heads],
            "mds_x": xy[:, 0],
            "mds_y": xy[:, 1],
            "cluster": cluster.astype(int),
            "nearest": [f"{heads[j][0]}-{heads[j][1]}" for j in nearest],
            "nearest_js": off[np.arange(len(heads)), nearest] if len(heads) > 1 else np.nan,
            "nearest_same_layer": [heads[i][0] == heads[j][0] for i, j in enumerate(nearest)],
        },
        columns=CLUSTER_COLUMNS,
    )


def layer_cohesion(
    distances: pd.DataFrame, clusters: pd.DataFrame | None = None, n_perm: int = 999, seed: int = 0
) -> dict:
    """Do heads of the same layer behave alike? Mean JS within a layer and between layers, a
    permutation test of the difference (layer labels shuffled among heads, `n_perm` times,
    one-sided: between - within at least as large), the share of heads whose nearest head is
    in its own layer against chance, and the adjusted Rand index of the clusters with the layers."""
    from sklearn.metrics import adjusted_rand_score

    matrix, heads = distance_matrix(distances)
    k = len(heads)
    layers = np.array([h[0] for h in heads])
    if k < 3 or len(set(layers)) < 2:
        return {}
    square = (matrix + matrix.T) / 2
    upper = np.triu(np.ones((k, k), dtype=bool), 1)

    def gap(labels):
        same = labels[:, None] == labels[None, :]
        return square[upper & ~same].mean() - square[upper & same].mean()

    observed = gap(layers)
    rng = np.random.default_rng(seed)
    at_least = sum(gap(rng.permutation(layers)) >= observed for _ in range(n_perm))
    same = layers[:, None] == layers[None, :]
    sizes = np.bincount(np.unique(layers, return_inverse=True)[1])
    out = {
        "heads": k,
        "within_layer_js": float(square[upper & same].mean()),
        "between_layer_js": float(square[upper & ~same].mean()),
        "gap": float(observed),
        "permutations": n_perm,
        "p_value": float((1 + at_least) / (1 + n_perm)),
        "chance_nearest_same_layer": float(((sizes - 1) * sizes).sum() / (k * (k - 1))),
    }
    if clusters is None:
        clusters = head_clusters(distances, seed)
    if len(clusters):
        out["nearest_same_layer"] = float(clusters["nearest_same_layer"].mean())
        out["adjusted_rand_clusters_layers"] = float(
            adjusted_rand_score(clusters["layer"], clusters["cluster"])
        )
    fold = distances[["score_fold0", "score_fold1"]].to_numpy(np.float64)
    pairs = (
        distances["layer"].to_numpy() * 10**6 + distances["head"].to_numpy()
        < distances["sender_layer"].to_numpy() * 10**6 + distances["sender_head"].to_numpy()
    )
    ok = pairs & np.isfinite(fold).all(axis=1)
    if ok.sum() > 2:
        out["fold_correlation"] = float(np.corrcoef(fold[ok, 0], fold[ok, 1])[0, 1])
    return out


# ---------------------------------------------------------------- registry


def head_distances(results) -> pd.DataFrame:
    return distance_frame(results.tallies.get("head_similarity"))


def head_clusters_table(results) -> pd.DataFrame:
    return head_clusters(
        results.table("head_distances"), seed=int(results.summary.get("seed", 0) or 0)
    )


ANALYSIS = register(
    Analysis(
        name="head_similarity",
        order=90,
        scorer=HeadSimilarityScorer,
        input=SENTENCES,
        selection=False,
        default=False,
        description="mean Jensen-Shannon divergence between every two heads' word attention; heads clustered "
        "(Clark et al. 2019 section 5, Figure 6)",
        tables={"head_distances": head_distances, "head_clusters": head_clusters_table},
        report="headprobe.studies.head_similarity.report:head_clusters_section",
    )
)
