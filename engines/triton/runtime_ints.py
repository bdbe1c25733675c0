"""The kernels' integer arguments that stay run-time values (the do_not_specialize lists of
kernels.py's @triton.jit): Triton specialises none of them by value, since sizes, strides
and offsets change from case to case and one compile per combination would dominate a test
run. What vectorisation needs is carried by the constexpr VEC instead (and the base pointers
are always storage-aligned).
"""
INPUT_INTS = ["q_off", "sq_b", "sq_h", "sq_s", "sq_d", "k_off", "sk_b", "sk_h", "sk_s", "sk_d",
              "v_off", "sv_b", "sv_h", "sv_s", "sv_d", "do_off", "sdo_b", "sdo_h", "sdo_s",
              "sdo_d", "l_off", "sl_b", "sl_h", "sl_s"]
SIZE_INTS = ["H_q", "G_k", "G_v", "S_q", "S_kv", "D_qk", "D_v", "shift", "left", "right"]
#: choices that cost nothing at run time, so one compile serves every value: the program
#: order, a ragged batch's diagonal alignment (0 or 1), and which bound a band has alone
#: (launch.band_flags: 0, 1 left, 2 right), which puts the heaviest programs first
CHOICE_INTS = ["block_major", "bottom_right", "lone_bound"]
#: ragged launches only; a dense launch passes None for CU_Q, CU_KV, T_q and T_kv, which
#: Triton makes constexprs, so the dense variants have none of this code
RAGGED_INTS = ["T_q", "T_kv"]
#: HAS_BIAS launches only (None otherwise, like the ragged ones): bias offset and strides
BIAS_INTS = ["bias_off", "sbias_b", "sbias_h", "sbias_i", "sbias_j"]
#: HAS_DROPOUT launches only (None otherwise): the dropout mask's offset and strides (a mask
#: port), or the seed and Philox offset the kernels draw it from (DRAWN_DROPOUT)
DROP_INTS = ["drop_off", "sdrop_b", "sdrop_h", "sdrop_i", "sdrop_j", "drop_seed", "drop_offset"]
#: ATOMIC_DQ launches only (None otherwise): the strides of the fp32 dQ scratch, in its rows
DQA_INTS = ["sqa_b", "sqa_h", "sqa_s"]
#: HAS_ALIBI launches only (None otherwise): the alibi_slopes offset and its batch and head
#: strides (batch stride 0 for [H_q] slopes)
ALIBI_INTS = ["alibi_off", "salibi_b", "salibi_h"]
