"""Maximum spanning trees over word-pair scores (Htut et al. 2019; Clark et al. 2019 section 6).

    heads = max_arborescence(scores)            # scores[d, h]: arc h -> d; one word under ROOT
    heads = max_arborescence(scores, root)      # root[d]: arc ROOT -> d
    parents = max_spanning_tree(sym, n_words)   # [graph, word] parents of undirected MSTs (torch, batched)
    undirected_hits(heads, arcs)                # is each gold arc {d, h} an edge of the tree?

- `max_arborescence`: Chu-Liu-Edmonds (maximum spanning arborescence from a dummy ROOT),
  NumPy, recursive contraction of cycles. Without root scores every ROOT -> d arc scores
  one less than the worst word arc, so exactly one word hangs under ROOT (a tree over the
  words). networkx's `maximum_spanning_arborescence` gives the same trees (tests check it,
  and a brute force over every tree of small sentences); it is not used at run time
  because it is about 1,000x slower (2 s for a 50-word sentence).
- `max_spanning_tree`: for symmetric scores (a head's A[d, h] + A[h, d]) the maximum
  arborescence under equal ROOT scores is a maximum undirected spanning tree, found here by
  Prim's algorithm run for many graphs at once (one per sentence and head), on the device.

Ties go to the lowest index (argmax), so the trees are deterministic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

ROOT = -1


def max_arborescence(scores: np.ndarray, root_scores: np.ndarray | None = None) -> np.ndarray:
    """Heads [n] (0-based, ROOT = -1) of the maximum spanning arborescence of n words under a
    dummy ROOT. `scores[d, h]` scores the arc h -> d (diagonal ignored); `root_scores[d]` the
    arc ROOT -> d (None: one less than the lowest word arc, so one word hangs under ROOT)."""
    scores = np.asarray(scores, dtype=np.float64)
    n = len(scores)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if n == 1:
        return np.array([ROOT])
    off = scores[~np.eye(n, dtype=bool)]
    if root_scores is None:
        root_scores = np.full(n, off.min() - 1.0)
    graph = np.full((n + 1, n + 1), -np.inf)  # graph[h, d], node 0 = ROOT, word k = node k + 1
    graph[1:, 1:] = scores.T
    graph[0, 1:] = root_scores
    heads = _chu_liu_edmonds(graph)
    return heads[1:] - 1  # node -> word (ROOT node 0 -> -1)


def _chu_liu_edmonds(graph: np.ndarray) -> np.ndarray:
    """Heads (node indices, heads[0] = -1) of the maximum arborescence rooted at node 0;
    graph[h, d] scores h -> d, -inf for no arc."""
    graph = graph.copy()
    size = len(graph)
    graph[:, 0] = -np.inf
    np.fill_diagonal(graph, -np.inf)
    heads = graph.argmax(axis=0)  # best incoming arc of each node
    heads[0] = -1
    cycle = _cycle(heads)
    if not cycle:
        return heads
    in_cycle = np.zeros(size, dtype=bool)
    in_cycle[cycle] = True
    cycle = np.flatnonzero(in_cycle)
    rest = np.flatnonzero(~in_cycle)  # ROOT (node 0) first
    m = len(rest)
    kept = graph[heads[cycle], cycle]  # the cycle's own arcs
    small = np.full((m + 1, m + 1), -np.inf)  # the cycle contracted into node m
    small[:m, :m] = graph[np.ix_(rest, rest)]
    leaving = graph[np.ix_(cycle, rest)]  # [cycle node, rest]: arcs out of the cycle
    small[m, :m] = leaving.max(axis=0)
    leaving_from = cycle[leaving.argmax(axis=0)]
    entering = graph[np.ix_(rest, cycle)] - kept[None, :]  # gain of entering the cycle at each node
    small[:m, m] = entering.max(axis=1)
    entering_at = cycle[entering.argmax(axis=1)]
    sub = _chu_liu_edmonds(small)
    out = heads.copy()
    for k in range(1, m):  # nodes outside the cycle
        h = sub[k]
        out[rest[k]] = rest[h] if h < m else leaving_from[k]
    source = sub[m]  # where the arc into the cycle comes from
    out[entering_at[source]] = rest[source]  # the cycle is broken there
    out[0] = -1
    return out


def _cycle(heads: np.ndarray) -> list[int]:
    """The nodes of one cycle of `heads` (node 0 is the root), else []."""
    state = np.zeros(len(heads), dtype=np.int8)  # 0 new, 1 on this walk, 2 done
    for start in range(1, len(heads)):
        walk, node = [], start
        while node > 0 and state[node] == 0:
            state[node] = 1
            walk.append(node)
            node = heads[node]
        if node > 0 and state[node] == 1:
            return walk[walk.index(node) :]
        state[walk] = 2
    return []


def max_spanning_tree(scores: torch.Tensor, n_words: torch.Tensor) -> torch.Tensor:
    """Parents [graph, word] (-1: word 0, where the tree starts, and padding) of a maximum
    spanning tree of each graph's first `n_words[g]` words. scores [graph, word, word]:
    symmetric edge scores (the diagonal is ignored). Prim's algorithm from word 0, all
    graphs at once; ties go to the lowest index."""
    import torch

    g, w, _ = scores.shape
    device = scores.device
    index = torch.arange(g, device=device)
    valid = torch.arange(w, device=device)[None, :] < n_words[:, None]  # [graph, word]
    in_tree = torch.zeros(g, w, dtype=torch.bool, device=device)
    in_tree[:, 0] = True
    neg = torch.tensor(float("-inf"), dtype=scores.dtype, device=device)
    best = torch.where(valid & ~in_tree, scores[:, 0, :], neg)  # best arc into the tree
    link = torch.zeros(g, w, dtype=torch.long, device=device)  # its end in the tree
    parent = torch.full((g, w), -1, dtype=torch.long, device=device)
    for _ in range(w - 1):
        top = best.max(dim=-1)  # first maximum
        ok = top.values > neg  # a word is left to add
        node = top.indices
        parent[index[ok], node[ok]] = link[index[ok], node[ok]]
        in_tree[index[ok], node[ok]] = True
        row = scores[index, node]  # [graph, word]
        better = ok[:, None] & valid & ~in_tree & (row > best)
        best = torch.where(better, row, best)
        link = torch.where(better, node[:, None], link)
        best = torch.where(in_tree | ~valid, neg, best)
    return parent


def undirected_hits(heads, dependents, gold_heads) -> np.ndarray:
    """0/1 per gold arc: is {dependent, head} an edge of the tree given by `heads` (or parents)?"""
    heads = np.asarray(heads)
    d, h = np.asarray(dependents, dtype=np.int64), np.asarray(gold_heads, dtype=np.int64)
    ok = h >= 0
    hit = np.zeros(len(d), dtype=bool)
    hit[ok] = (heads[d[ok]] == h[ok]) | (heads[h[ok]] == d[ok])
    return hit
