"""The head explorer: its stored attention (head_attention.npz), its data, and the page in Chromium.

Results come from `tests.fixtures_results` (2 layers x 3 heads, planted roles) with a hand-built
attention store: head L-H attends from word i to word (i + L + H) mod n with weight 200/255 and
to word i with the rest, so every line the page draws can be predicted."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from test_report import check_page_in_chromium, chromium_binary

from headprobe.report import build_report
from headprobe.report.explorer import explorer_data, explorer_html
from headprobe.results import head_attention, store
from headprobe.results.query import Results
from tests.fixtures_results import make_results

SENTENCES = [
    {
        "sent_id": "s1",
        "words": ["The", "cat", "sat", "on", "the", "mat", "."],
        "heads": [1, 2, -1, 5, 5, 2, 2],
        "deprels": ["det", "nsubj", "root", "case", "det", "obl", "punct"],
    },
    {
        "sent_id": "s2",
        "words": ["Dogs", "bark", "."],
        "heads": [1, -1, 1],
        "deprels": ["nsubj", "root", "punct"],
    },
]


def planted(layer: int, head: int, n: int) -> np.ndarray:
    """[word, word] uint8: 200 at (i, (i + layer + head) % n), 55 more on the diagonal."""
    m = np.zeros((n, n), dtype=np.uint8)
    for i in range(n):
        m[i, (i + layer + head) % n] += 200
        m[i, i] += 55
    return m


def planted_store(n_layers: int = 2, n_heads: int = 3) -> dict:
    blocks = []
    for s in SENTENCES:
        n = len(s["words"])
        blocks.append(
            np.stack(
                [
                    np.stack([planted(layer, head, n).reshape(-1) for head in range(n_heads)])
                    for layer in range(n_layers)
                ]
            )
        )  # [layer, head, n * n]
    return {
        "layers": list(range(n_layers)),
        "n_heads": n_heads,
        "sentences": SENTENCES,
        "attention": np.concatenate(blocks, axis=2),  # [layer, head, cells]
    }


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A results directory with the planted attention, and its report rebuilt from it alone."""
    directory = tmp_path_factory.mktemp("explorer") / "results"
    results = make_results()
    results.head_attention = planted_store()
    results.save(directory)
    return directory, build_report(directory)


# ------------------------------------------------------------------------------- the store


def test_fit_budget_drops_then_cuts():
    assert head_attention.fit_budget([10, 10, 10], heads=4, budget=4 * 250) == [10, 10]
    assert head_attention.fit_budget([10, 5], heads=4, budget=4 * 124) == [10]  # 100 + 25 > 124
    assert head_attention.fit_budget([30], heads=100, budget=100 * 49) == [7]  # sqrt(49) words


def test_store_round_trip_and_manifest(saved):
    directory, _ = saved
    manifest = store.verify(directory)
    assert store.HEAD_ATTENTION in manifest["files"]
    kept = Results.load(directory).head_attention
    assert kept["sentences"] == SENTENCES
    for layer, head, sentence in [(0, 0, 0), (1, 2, 0), (1, 1, 1)]:
        n = len(SENTENCES[sentence]["words"])
        expected = planted(layer, head, n).astype(np.float32) / 255
        assert np.array_equal(head_attention.matrix(kept, layer, head, sentence), expected)


def test_kept_equals_word_attention(tiny_model):
    """The second pass (`sentences_word_attention`, all sentences in one padded forward) as kept:
    for every head, the word attention of `word_attention` (one sentence alone), as uint8."""
    from headprobe.inputs.corpora.base import Example
    from headprobe.model import loading
    from headprobe.scoring.sentence_attention import sentences_word_attention, word_attention

    model, tokenizer, _ = loading.load(tiny_model, device="cpu")
    words = ["the", "cat", "sat", "on", "the", "mat"]
    example = Example(words, unit="sentence", source="t", heads=[1, 2, -1, 5, 5, 2])
    n_layers = model.config.num_hidden_layers
    n_heads = model.config.num_attention_heads
    layers = list(range(n_layers))
    planned = head_attention.plan([example], layers, n_heads)
    assert head_attention.planned_words(planned) == [words]
    every = sentences_word_attention(
        model, tokenizer, head_attention.planned_words(planned), layers
    )
    kept = head_attention.keep(planned, every, layers, n_heads)
    assert kept["attention"].dtype == np.uint8
    for layer in range(n_layers):
        full = word_attention(model, tokenizer, words, layer)  # [head, word, word + 2]
        for head in range(n_heads):
            want = torch.round(full[head, :, : len(words)] * 255).numpy() / 255
            got = head_attention.matrix(kept, layer, head, 0)
            assert np.allclose(got, want, atol=1 / 255 + 1e-6)


# ------------------------------------------------------------------------------- the data


def test_data_equals_the_tables(saved):
    directory, _ = saved
    results = Results.load(directory)
    data = explorer_data(results)
    assert data["heads"] == ["0-0", "0-1", "0-2", "1-0", "1-1", "1-2"]
    roles = results.roles.set_index("name")
    assert data["roles"]["role"] == [roles.loc[k, "role"] for k in data["heads"]]
    tests = results.head_tests
    nsubj = next(r for r in data["relations"] if r["label"] == "nsubj")
    row = tests[(tests["label"] == "nsubj") & (tests["layer"] == 1) & (tests["head"] == 2)].iloc[0]
    assert nsubj["heldout"][5] == pytest.approx(row["heldout_accuracy"], abs=1e-4)
    surface = next(s for s in data["scores"] if s["table"] == "surface" and s.get("label") == "cls")
    rows = results.surface[results.surface["label"] == "cls"]
    want = rows.set_index(["layer", "head"])[surface["column"]]
    assert surface["values"][4] == pytest.approx(want.loc[(1, 1)], abs=1e-4)
    tricky = dict(data, model="a</script><b>")  # cannot close its <script> early
    inline = explorer_html(tricky).split('-data">', 1)[1].split("</script>", 1)[0]
    assert json.loads(inline)["model"] == "a</script><b>"


# ------------------------------------------------------------------------------- the page

CLICK_JS = """JSON.stringify((() => {
  const c = document.querySelector('SCOPE [data-head="HEAD"]');
  c.scrollIntoView({block: 'center'});
  const r = c.getBoundingClientRect();
  return [r.left + r.width / 2, r.top + r.height / 2];
})())"""

CARD_JS = """JSON.stringify((() => {
  const card = document.querySelector('[data-card-head]');
  const rel = [...card.querySelectorAll('tr[data-label]')].map(tr => ({
    label: tr.dataset.label, analysis: tr.dataset.analysis,
    values: [...tr.querySelectorAll('td[data-value]')].map(td => Number(td.dataset.value))}));
  const svg = document.querySelector('.hx-attn svg');
  const lines = svg ? [...svg.querySelectorAll('line[data-weight]')].map(l =>
    [Number(l.dataset.from), Number(l.dataset.to), Number(l.dataset.weight)]) : [];
  const gold = svg ? [...svg.querySelectorAll('line[data-gold]')].map(l => l.dataset.gold) : [];
  return {head: card.dataset.cardHead, text: card.textContent, relations: rel, lines, gold,
          svgHead: svg && svg.dataset.head, focused: document.activeElement.dataset.head || null};
})())"""


def click(tools, evaluate, head, scope=""):
    x, y = evaluate(CLICK_JS.replace("HEAD", head).replace("SCOPE", scope))
    for kind in ("mousePressed", "mouseReleased"):
        tools.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)
    return evaluate(CARD_JS)


def press(tools, key: str):
    codes = {"ArrowRight": 39, "ArrowDown": 40, "Enter": 13}
    extra = {"text": "\r"} if key == "Enter" else {}
    for kind in ("rawKeyDown", "keyUp"):
        tools.call(
            "Input.dispatchKeyEvent",
            type=kind,
            key=key,
            code=key,
            windowsVirtualKeyCode=codes[key],
            **(extra if kind == "rawKeyDown" else {}),
        )
    if key == "Enter":
        tools.call("Input.dispatchKeyEvent", type="char", key=key, text="\r")


def drive(tools, evaluate):
    out = {"click": click(tools, evaluate, "1-2")}
    click(tools, evaluate, "0-0")  # focus and select 0-0 ...
    for key in ("ArrowRight", "ArrowDown", "Enter"):  # ... then 0-1, 1-1, selected by Enter
        press(tools, key)
    out["keys"] = evaluate(CARD_JS)
    return out


def lines_of(head: tuple[int, int], sentence: int = 0) -> set:
    n = len(SENTENCES[sentence]["words"])
    m = planted(*head, n)
    return {(a, b, int(m[a, b])) for a in range(n) for b in range(n) if m[a, b] >= 3}


def relation_values(results, analysis: str, label: str, layer: int, head: int) -> list[float]:
    """Held-out accuracy, in-sample accuracy, held-out baseline of the head_tests row."""
    tests = results.head_tests
    row = tests[
        (tests["analysis"] == analysis)
        & (tests["label"] == label)
        & (tests["layer"] == layer)
        & (tests["head"] == head)
    ].iloc[0]
    return [row["heldout_accuracy"], row["accuracy"], row["heldout_baseline"]]


@pytest.mark.skipif(chromium_binary() is None, reason="chromium not installed")
def test_explorer_in_chromium(saved):
    directory, report = saved
    results = Results.load(directory)
    info = check_page_in_chromium(report["html"], report["out_dir"] / "explorer.png", actions=drive)
    assert not info["errors"], info["errors"]
    assert not info["layout"], info["layout"]  # fits 1280 px, no side-scrolling box
    page = report["html"].resolve().as_uri()
    outside = [u for u in info["requests"] if u != page and not u.startswith("data:")]
    assert outside == []  # no network request: the page itself and its inline data only
    clicked, keyed = info["actions"]["click"], info["actions"]["keys"]
    assert clicked["head"] == "1-2" and clicked["svgHead"] == "1-2"
    assert keyed["head"] == "1-1" and keyed["focused"] == "1-1"
    roles = results.roles.set_index("name")
    for shown in (clicked, keyed):
        assert roles.loc[shown["head"], "role"] in shown["text"]
        evidence = roles.loc[shown["head"], "evidence"]
        assert not evidence or evidence in shown["text"]
        layer, head = map(int, shown["head"].split("-"))
        assert shown["relations"], "no relation rows"
        for rel in shown["relations"]:
            assert rel["values"] == pytest.approx(
                relation_values(results, rel["analysis"], rel["label"], layer, head), abs=1e-4
            )
        assert {tuple(x) for x in shown["lines"]} == lines_of((layer, head))
    # 1-2's best relation here is nsubj: its gold arc (cat -> sat) is marked
    assert clicked["relations"][0]["label"] == "nsubj" and clicked["gold"] == ["1-2"]


def test_markdown_points_to_the_html(saved):
    _, report = saved
    text = report["markdown"].read_text(encoding="utf-8")
    assert "head explorer is in report.html" in text
    html = report["html"].read_text(encoding="utf-8")
    assert html.count('type="module"') == 1  # one inline module, nothing loaded
    data = json.loads(
        html.split('id="head-explorer-data">')[1].split("</script>")[0].replace("<\\/", "</")
    )
    assert len(data["heads"]) == 6 and data["attention"]["sentences"] == SENTENCES


@pytest.mark.skipif(chromium_binary() is None, reason="chromium not installed")
def test_compare_page_highlights_the_matched_head(tmp_path):
    """Selecting a head of one run outlines the head the matches table pairs it with in the other."""
    from headprobe.report.comparison_page import build_comparison
    from headprobe.results.comparison import Run

    small, large = make_results(seed=1), make_results(seed=3, n_layers=3, n_heads=4)
    paths = build_comparison([Run("small", small), Run("large", large)], tmp_path / "compare")
    matches = pd.read_csv(paths["tables"][[p.stem for p in paths["tables"]].index("matches")])
    want = {}
    for r in matches.itertuples():
        want[("0", r.name_a)], want[("1", r.name_b)] = r.name_b, r.name_a

    def act(tools, evaluate):
        seen = {}
        for side, other, head in [("0", "1", "1-2"), ("1", "0", want[("0", "0-1")])]:
            click(tools, evaluate, head, f"#head-explorer-{side}")
            seen[(side, head)] = evaluate(
                f"JSON.stringify([...document.querySelectorAll('#head-explorer-{other} .hx-match')]"
                ".map(c => c.dataset.head))"
            )
        return {f"{k[0]}:{k[1]}": v for k, v in seen.items()}

    info = check_page_in_chromium(paths["html"], tmp_path / "compare.png", actions=act)
    assert not info["errors"] and not info["layout"], (info["errors"], info["layout"])
    assert info["actions"]["0:1-2"] == [want[("0", "1-2")]]
    assert info["actions"][f"1:{want[('0', '0-1')]}"] == ["0-1"]


@pytest.mark.slow
def test_report_of_a_32_by_32_model_stays_small(tmp_path):
    """A random Llama with 32 layers x 32 heads (from a config), scored on a few sentences of the
    bundled sample: every head is in the explorer, the report stays under 8 MB, and `headprobe
    report DIR` rebuilds the same explorer from the saved directory alone."""
    from conftest import INIT, make_llama3
    from tokenizers import normalizers
    from transformers import AutoModel, LlamaConfig

    import headprobe
    from headprobe.inputs.samples import SAMPLE

    blocks = Path(SAMPLE).read_text(encoding="utf-8").split("\n\n")
    corpus = tmp_path / "few.conllu"
    corpus.write_text("\n\n".join(blocks[:12]) + "\n\n", encoding="utf-8")
    tok = make_llama3()
    tok.backend_tokenizer.normalizer = normalizers.Prepend(" ")
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=2,
        max_position_embeddings=256,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        initializer_range=INIT,
    )
    torch.manual_seed(0)
    model = AutoModel.from_config(config, attn_implementation="eager").eval()
    out = tmp_path / "run"
    results = headprobe.run(
        treebank=corpus,
        loaded=(model, tok, "llama-32x32"),
        progress=False,
        out=out,
        report=True,
    )
    kept = results.head_attention
    assert kept["attention"].shape[:2] == (32, 32)
    assert kept["attention"].size <= head_attention.BUDGET
    html = out / store.REPORT_DIR / store.REPORT_HTML
    assert html.stat().st_size < 8_000_000
    data = explorer_data(Results.load(out))
    assert len(data["heads"]) == 1024 and data["attention"]["cells_per_head"] > 0
    rebuilt = build_report(out, tmp_path / "again")  # from the saved directory alone
    assert explorer_html(data) in rebuilt["html"].read_text(encoding="utf-8")
