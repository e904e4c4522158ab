"""`QuantizedWeight`'s two layouts: GGML's, and the q8 kernel's rows interleaved by 16
(`interleaved`): the same bytes moved within the rows' span, read back to the same values."""

from __future__ import annotations

import pytest
import torch

from workbench.engine.kernels import gguf_products
from workbench.models.gguf_blocks import BLOCK_TYPES, QuantizedWeight


@pytest.mark.parametrize("kind", sorted(BLOCK_TYPES))
@pytest.mark.parametrize("rows", [5, 16, 37])
def test_interleaved_is_the_same_weight(kind, rows):
    k = 512 if kind.endswith("_K") else 96
    weight = gguf_products.random_blocks(kind, rows, k, torch.Generator().manual_seed(rows))
    inter = weight.interleaved()
    assert inter.layout == "rows16" and inter.data.data_ptr() != weight.data.data_ptr()
    assert torch.equal(inter.ggml().data, weight.data)
    assert torch.equal(inter.dequantize(), weight.dequantize())
    # the rows after the last full group stay as GGML has them; the groups' bytes move
    full = rows // 16 * 16
    assert torch.equal(inter.data[full:], weight.data[full:])
    assert full == 0 or not torch.equal(inter.data[:full], weight.data[:full])


def test_a_group_holds_its_rows_scales_side_by_side_then_their_code_words():
    weight = gguf_products.random_blocks("Q4_1", 16, 64, torch.Generator().manual_seed(0))
    block = weight.interleaved().data[:, :40].reshape(-1)[:320]  # block 0 of the group
    rows = weight.data[:, :20]  # each row's block 0: d, m, 16 bytes of nibbles
    assert torch.equal(block[:32].view(16, 2), rows[:, :2])  # d of the 16 rows
    assert torch.equal(block[32:64].view(16, 2), rows[:, 2:4])  # m
    assert torch.equal(block[64:128].view(16, 4), rows[:, 4:8])  # chunk 0: code bytes 0-3


def test_in_place_rearranges_the_weights_own_bytes():
    weight = gguf_products.random_blocks("Q8_0", 32, 64, torch.Generator().manual_seed(1))
    copy = weight.interleaved()
    inter = weight.interleaved(in_place=True)
    assert inter.data.data_ptr() == weight.data.data_ptr() and torch.equal(inter.data, copy.data)


def test_rows_of_an_interleaved_weight_are_views_on_group_edges_else_copies():
    weight = gguf_products.random_blocks("Q4_0", 40, 64, torch.Generator().manual_seed(2))
    inter = weight.interleaved()
    view = inter.rows(16, 40)
    assert view.layout == "rows16" and view.data.data_ptr() == inter.data[16].data_ptr()
    assert torch.equal(view.dequantize(), weight.rows(16, 40).dequantize())
    odd = inter.rows(3, 20)
    assert odd.layout == "ggml" and torch.equal(odd.data, weight.rows(3, 20).data)


def test_a_k_quants_scales_are_interleaved_byte_by_byte():
    weight = gguf_products.random_blocks("Q4_K", 16, 256, torch.Generator().manual_seed(3))
    block = weight.interleaved().data.reshape(-1)  # one block of 16 rows: 2304 bytes
    rows = weight.data  # [16, 144]: d, dmin, 12 bytes of scales, 128 of codes
    assert torch.equal(block[64:256].view(12, 16), rows[:, 4:16].T)  # plane b: byte b of each
    assert torch.equal(block[256:320].view(16, 4), rows[:, 16:20])  # code word 0 of each row


def test_what_is_not_a_layout_is_refused():
    weight = gguf_products.random_blocks("Q4_K", 16, 256, torch.Generator().manual_seed(3))
    with pytest.raises(ValueError, match="layout"):
        QuantizedWeight("Q4_K", 16, 256, weight.data, "rows8")
    inter = gguf_products.random_blocks("Q4_1", 16, 64, torch.Generator()).interleaved()
    with pytest.raises(ValueError, match="GGML's layout"):
        QuantizedWeight.cat([inter, inter])
