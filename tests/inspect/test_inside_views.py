"""The views of what a request recorded: ActivationCache, AttentionPattern, LogitLens, and the
wire form of their tensors. Synthetic data here; tests/engine/step/test_inspection.py checks the
values the engine puts in them against transformers."""

import json

import matplotlib
import pytest
import torch

from workbench.inside.tensors import decode_array, decode_tensor, encode_tensor
from workbench.inspect.activations import ActivationCache
from workbench.inspect.attention_pattern import AttentionPattern
from workbench.inspect.logit_lens import LogitLens
from workbench.inspect.protocol import Inspectable

matplotlib.use("Agg")

TOKENS = ["The", " capital", " of", " France", " is", " Paris", "."]


def cache(reduce=None, missing=None) -> ActivationCache:
    g = torch.Generator().manual_seed(0)
    positions = [0, 1, 2, 3, 4, 5]
    rows = (len(positions), 8)
    tensors = {f"blocks.{layer}.hook_resid_post": torch.randn(*rows, generator=g)
               for layer in range(3)}
    tensors["ln_final.hook_normalized"] = torch.randn(*rows, generator=g)
    pattern = torch.rand(2, 6, 6, generator=g).tril()
    tensors["blocks.1.attn.hook_pattern"] = pattern / pattern.sum(-1, keepdim=True)
    if reduce:
        tensors = {k: v.mean(0) for k, v in tensors.items() if "pattern" not in k}
    return ActivationCache(tokens=TOKENS, num_layers=3, tensors=tensors, positions=positions,
                           reduce=reduce, pattern_heads={} if reduce else {1: [0, 3]},
                           missing=missing or {"position 6": "the last token is sampled"})


def test_tensors_cross_the_wire_bit_for_bit():
    for t in (torch.randn(3, 4), torch.arange(5), torch.tensor([True, False]),
              torch.randn(2, 2).half()):
        wire = json.loads(json.dumps(encode_tensor(t)))
        assert torch.equal(decode_tensor(wire), t) and decode_tensor(wire).dtype == t.dtype
    array = decode_array(encode_tensor(torch.arange(6).reshape(2, 3)))
    assert array.dtype.name == "int64" and array.tolist() == [[0, 1, 2], [3, 4, 5]]
    array[0, 0] = 7  # writable, its own copy
    b = torch.randn(4).bfloat16()
    assert torch.equal(decode_tensor(encode_tensor(b)), b.float())  # exact as float32
    with pytest.raises(ValueError, match="dtype"):
        decode_tensor({"dtype": "complex64", "shape": [1], "data": ""})
    with pytest.raises(ValueError, match="dtype, shape, data"):
        decode_tensor({"shape": [1]})


def test_the_cache_answers_transformer_lens_keys():
    c = cache()
    full = c["blocks.2.hook_resid_post"]
    assert c["resid_post", 2] is full and c["resid_post", -1] is full
    assert c["hook_resid_post", 2] is full
    assert c["normalized"] is c["ln_final.hook_normalized"]
    assert c["pattern", 1].shape == (2, 6, 6)
    assert ("resid_post", 0) in c and "blocks.0.hook_resid_pre" not in c
    assert list(c) == c.keys() and len(c) == 5
    with pytest.raises(KeyError, match="needs a layer"):
        c["resid_post"]
    with pytest.raises(KeyError, match="outside the model's 3 layers"):
        c["resid_post", 3]
    with pytest.raises(KeyError, match="was not captured; this cache holds blocks.0"):
        c["resid_pre", 0]


def test_what_is_absent_is_stated_with_its_reason():
    c = cache(missing={"blocks.0.hook_mlp_out": "no position it asked for was computed"})
    with pytest.raises(KeyError, match="asked for but is absent: no position"):
        c["mlp_out", 0]
    assert "no position it asked for was computed" in c._repr_html_()


def test_stack_layers_and_patterns():
    c = cache()
    assert c.layers_of("resid_post") == [0, 1, 2] and c.layers_of("pattern") == [1]
    stacked = c.stack("resid_post")
    assert stacked.shape == (3, 6, 8) and torch.equal(stacked[1], c["resid_post", 1])
    assert torch.equal(c.stack_activation("resid_post", [2]), stacked[2:])
    with pytest.raises(KeyError, match="no layer of 'mlp_out'"):
        c.stack("mlp_out")
    view = c.pattern(1)
    assert isinstance(view, AttentionPattern) and view.heads == [0, 3]
    assert torch.equal(view.pattern_of(3), c["pattern", 1][1])
    with pytest.raises(KeyError, match="head 1 was not captured"):
        view.pattern_of(1)


def test_the_cache_frame_and_wire():
    c = cache()
    df = c.to_frame()
    assert len(df) == 4 * 6  # residual names x positions; the pattern has its own view
    row = df[(df.name == "blocks.1.hook_resid_post") & (df.position == 5)].iloc[0]
    assert row.token == " Paris" and row.layer == 1 and row.site == "resid_post"
    assert row.norm == pytest.approx(c["resid_post", 1][5].norm().item())
    assert df[df.name == "ln_final.hook_normalized"].layer.isna().all()
    wire = c.to_wire()
    back = ActivationCache.from_wire(json.loads(json.dumps(wire)))
    assert back.to_wire() == wire and back.pattern_heads == {1: [0, 3]}
    assert all(torch.equal(back[k], c[k]) for k in c)
    with pytest.raises(ValueError, match="not an `activations` object"):
        ActivationCache.from_wire({"tokens": []})
    reduced = cache(reduce="mean")
    assert reduced["resid_post", 0].shape == (8,)
    assert reduced.to_frame().position.isna().all() and len(reduced.to_frame()) == 4


def test_the_cache_is_inspectable_and_renders():
    c = cache()
    assert isinstance(c, Inspectable)
    page = c._repr_html_()
    assert "blocks.1.hook_resid_post" in page and "6×8" in page and "positions 0–5" in page
    assert "cache.pattern(layer)" in page and "the last token is sampled" in page
    assert page == cache()._repr_html_()  # deterministic
    assert repr(c) == "ActivationCache(5 tensors, positions 0–5, reduce=None, 1 absent)"
    ax = c.plot()
    assert ax.get_ylabel() == "layer" and len(ax.get_yticks()) == 3
    assert cache(reduce="last").plot().get_xticklabels()[0].get_text() == "last"


def test_the_pattern_view_caps_and_says_so():
    g = torch.Generator().manual_seed(1)
    n = 30
    weights = torch.rand(12, n, n, generator=g).tril()
    view = AttentionPattern(0, list(range(12)), weights / weights.sum(-1, keepdim=True),
                            list(range(n)), [f"t{i}" for i in range(n)])
    page = view._repr_html_()
    assert "8 of 12 heads" in page and "the last 24 queries and keys" in page
    assert page.count(">head ") == 8
    assert "#2563eb" in page and "&#x27;t29&#x27; → &#x27;t29&#x27;" in page
    everything = view.html(heads=list(range(12)), last=n)
    assert "showing" not in everything and everything.count("padding-right:4px") == 12 * n
    df = view.to_frame()
    assert len(df) == 12 * n * (n + 1) // 2  # each query sees its keys up to itself
    assert df.groupby(["head", "query"]).weight.sum().round(5).eq(1).all()
    ax = view.plot(heads=[0, 5])
    assert ax.get_title() == "L0H0" and ax.figure.axes[1].get_title() == "L0H5"
    import matplotlib.pyplot as plt

    _, one = plt.subplots()
    assert view.plot(heads=[3], ax=one) is one and one.get_title() == "L0H3"
    with pytest.raises(ValueError, match="one axes draws one head"):
        view.plot(ax=one)


def lens() -> LogitLens:
    g = torch.Generator().manual_seed(2)
    probs = torch.rand(2, 3, 2, generator=g).sort(-1, descending=True).values
    return LogitLens(tokens=TOKENS, layers=[0, 1], positions=[3, 4, 5],
                     top_ids=torch.tensor([[[7, 8]] * 3, [[9, 7]] * 3]), top_probs=probs,
                     top_tokens=[[[" a", " b"]] * 3, [[" Paris", " a"]] * 3],
                     token_ranks={9: torch.tensor([[40, 12, 3], [0, 0, 1]])},
                     token_probs={9: torch.tensor([[0.01, 0.02, 0.1], [0.6, 0.7, 0.3]])})


def test_the_logit_lens_ranks_tops_and_frames():
    lz = lens()
    assert lz.rank(9)[1].tolist() == [0, 0, 1] and lz.prob(9)[0, 2].item() == pytest.approx(0.1)
    with pytest.raises(KeyError, match="token id 5 was not tracked; ask for it"):
        lz.rank(5)
    assert [t for t, _ in lz.top(1, 4)] == [" Paris", " a"] and lz.top(-1, -1) == lz.top(1, 5)
    df = lz.to_frame()
    assert len(df) == 2 * 3 * 2 and list(df.columns)[-1] == "rank_9"
    first = df[(df.layer == 1) & (df.position == 4) & (df.k == 0)].iloc[0]
    assert first.top_token == " Paris" and first.token == " is" and first.rank_9 == 0
    wire = lz.to_wire()
    back = LogitLens.from_wire(json.loads(json.dumps(wire)))
    assert back.to_wire() == wire and torch.equal(back.rank(9), lz.rank(9))


def test_the_logit_lens_renders():
    lz = lens()
    assert isinstance(lz, Inspectable)
    page = lz._repr_html_()
    assert page.index(">1</th>") < page.index(">0</th>")  # the last layer on top
    assert "Paris" in page and "tracking token ids [9]" in page and "wb-theme" in page
    assert "&#x27; Paris&#x27; 0." in page  # the top k on hover
    assert "the last 2 of 3 positions" in lz.html(last=2)
    ax = lz.plot()
    assert ax.get_ylabel() == "layer" and [t.get_text() for t in ax.texts][-1] == "␣Paris"
    ax = lz.plot_rank(9, position=5)
    assert list(ax.lines[0].get_ydata()) == [4, 2]


def test_heatmaps_show_the_page_in_their_empty_cells():
    """JupyterLab's dark theme: a pattern's or a lens's cells are one colour at the weight's
    opacity (`figure.fading`), so a zero weight (a key after its query) is transparent, not a
    white block, on a transparent figure; the strongest cell is opaque."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgba

    n = 6
    weights = torch.rand(2, n, n, generator=torch.Generator().manual_seed(3)).tril()
    view = AttentionPattern(0, [0, 1], weights / weights.sum(-1, keepdim=True), list(range(n)),
                            [f"t{i}" for i in range(n)])
    for ax in (view.plot(), lens().plot()):
        try:
            assert ax.figure.patch.get_alpha() == 0.0
            assert to_rgba(ax.get_facecolor())[3] == 0.0
            image = ax.images[0]
            assert image.cmap(0.0)[3] == 0.0 and image.cmap(1.0)[3] == 1.0
            assert image.cmap.get_bad()[3] == 0.0
            cells = image.to_rgba(image.get_array())  # [rows, cols, RGBA]
            values = image.get_array()
            assert (cells[..., 3][values == 0] == 0).all()
            assert abs(cells[..., 3].max() - values.max()) < 0.01  # opacity is the weight
        finally:
            plt.close(ax.figure)
    ax = view.plot(heads=[0])
    empty = ax.images[0].to_rgba(ax.images[0].get_array())[0, n - 1]  # query 0, key n - 1
    assert empty[3] == 0
    plt.close(ax.figure)


def test_the_engine_hands_data_and_the_facades_make_views_of_it():
    """`RequestOutput.activations` / `.logit_lens` are the engine's plain data; `with_views`
    (as `LLM` hands outputs over) makes the views of the same fields, whose wire form is the
    data's, bit for bit; the views answer from `workbench.inspect` (and, for notebooks written
    before they moved, from `workbench.inside`)."""
    import workbench.inside as inside_pkg
    from workbench.engine.requests.outputs import RequestOutput
    from workbench.inside.recorded import ActivationData, LogitLensData
    from workbench.inspect import ActivationCache as A
    from workbench.inspect import AttentionPattern as P
    from workbench.inspect import LogitLens as L
    from workbench.inspect.activations import with_views

    assert (A, P, L) == (ActivationCache, AttentionPattern, LogitLens)
    assert inside_pkg.ActivationCache is A and inside_pkg.LogitLens is L
    view, tables = cache(), lens()
    data = ActivationData.of(view)
    lens_data = LogitLensData.of(tables)
    assert type(data) is ActivationData and not hasattr(data, "stack")
    out = RequestOutput("r", "p", [1], None, [], True, activations=data, logit_lens=lens_data)
    assert with_views(out) is out
    assert isinstance(out.activations, ActivationCache)
    assert isinstance(out.logit_lens, LogitLens)
    assert json.dumps(out.activations.to_wire()) == json.dumps(data.to_wire())
    assert json.dumps(out.logit_lens.to_wire()) == json.dumps(lens_data.to_wire())
    torch.testing.assert_close(out.activations["resid_post", -1],
                               data.tensors["blocks.2.hook_resid_post"])
    assert with_views(out).activations is out.activations  # already views: kept
    assert isinstance(ActivationCache.from_wire(data.to_wire()), ActivationCache)
    assert isinstance(ActivationData.from_wire(data.to_wire()), ActivationData)
