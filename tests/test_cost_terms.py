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
