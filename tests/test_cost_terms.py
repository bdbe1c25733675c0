"""The cost model's tile count (bundlegen.cost.tiles): the dBias reduction priced at its
own DBIAS_TILE tiles of each batch's whole block, the dK/dV and dQ passes at TILE."""
from bundlegen import cost
from bundlegen.graph import dense_graph, with_modifiers


def test_the_dbias_pass_counts_its_own_tiles():
    plain = dense_graph(B=2, H_q=2, S_q=40, S_kv=48, D_qk=16)
    with_dbias = with_modifiers(plain, bias="batch", dbias=True)
    # dK/dV and dQ: one 64-row tile pair per batch and head, in two passes
    assert cost.tiles(plain) == 2 * 2 * 2
    # dBias: per query head, each batch's 40 x 48 block in 32-row tiles (2 x 2), summed over
    # the batches the bias broadcasts over
    assert cost.dbias_tiles(with_dbias) == 2 * 2 * 2
    assert cost.tiles(with_dbias) == 2 * (2 * 2 + 2 * 2 * 2)
    assert cost.terms(with_dbias).launches == cost.terms(plain).launches + 1


def test_a_banded_kernel_is_priced_by_the_tiles_and_elements_its_mask_keeps():
    """A causal 256 x 256 head keeps 10 of its 16 64-row tile pairs and 256 x 257 / 2 of its
    scores; a band one key wide keeps the diagonal tiles; bottom-right alignment shifts it."""
    from dataclasses import replace
    dense = dense_graph(B=1, H_q=1, S_q=256, S_kv=256, D_qk=16)
    causal = replace(dense, attributes=replace(dense.attributes, right_bound=0))
    diagonal = replace(causal, attributes=replace(causal.attributes, left_bound=1))
    assert cost.tiles(dense) == 2 * 16
    assert cost.tiles(causal) == 2 * 10
    assert cost.tiles(diagonal) == 2 * 4
    # a head wider than 64 takes a tile pair per 64 columns
    assert cost.tiles(dense_graph(B=1, H_q=1, S_q=256, S_kv=256, D_qk=192)) == 2 * 16 * 3
    flops_per_score = 2 * (3 * 16 + 2 * 16)
    assert cost.terms(dense).engine_flops == 256 * 256 * flops_per_score
    assert cost.terms(causal).engine_flops == 256 * 257 // 2 * flops_per_score
    assert cost.terms(diagonal).engine_flops == 256 * flops_per_score
    # the oracle works on the dense block whatever the mask
    assert cost.terms(causal).oracle_flops == cost.terms(dense).oracle_flops
    # 64 queries against 200 keys, bottom-right: the diagonal starts at key 136, so row i
    # keeps keys 0..136 + i, and every key block holds one
    wide = dense_graph(B=1, H_q=1, S_q=64, S_kv=200, D_qk=16)
    br = replace(wide, attributes=replace(wide.attributes, right_bound=0,
                                          diagonal_alignment="BOTTOM_RIGHT"))
    assert cost.kept_elements(64, 200, br.attributes) == sum(137 + i for i in range(64))
    assert cost.visited_blocks(64, 200, br.attributes) == 4
    tl = replace(br, attributes=replace(br.attributes, diagonal_alignment="TOP_LEFT"))
    assert cost.visited_blocks(64, 200, tl.attributes) == 1


def test_the_grid_is_sized_by_the_length_bounds():
    """The kernels' grids are sized by the length bounds (a ragged graph's max_seqlen), so the
    per-program cost counts every query and key block of each batch up to them: per query
    head its Delta and dQ programs, per K/V head its dK/dV program."""
    from bundlegen.graph_shapes import ragged_graph
    g = dense_graph(B=2, H_q=3, S_q=40, S_kv=100, D_qk=16)
    assert cost.terms(g).programs == 2 * (2 * 3 * 1 + 3 * 2)
    gqa = dense_graph(B=2, H_q=4, H_k=1, S_q=40, S_kv=100, D_qk=16)
    assert cost.terms(gqa).programs == 2 * (2 * 4 * 1 + 1 * 2)
    # three sequences of 10, 30 and 60 rows under bounds of 128 and 200: 2 + 4 blocks each
    bounded = ragged_graph((0, 10, 40, 100), H_q=2, max_seqlen_q=128, max_seqlen_kv=200)
    assert cost.terms(bounded).programs == 3 * (2 * 2 * 2 + 2 * 4)


def test_tiles_that_draw_a_dropout_mask_are_counted_apart():
    """An engine that draws its own dropout mask draws random numbers for every pass tile;
    one given the mask as a port reads it like any other operand."""
    plain = dense_graph(B=1, H_q=2, S_q=100, S_kv=100, D_qk=16)
    drawn = with_modifiers(plain, dropout=0.1, dropout_mask=None)
    given = with_modifiers(plain, dropout=0.1)
    assert cost.terms(plain).drawn_tiles == 0 == cost.terms(given).drawn_tiles
    assert cost.terms(drawn).drawn_tiles == cost.terms(drawn).tiles == 2 * 2 * 4
