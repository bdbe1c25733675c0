"""The seed and Philox offset the Triton engine draws its dropout masks from unless given others
(dropout_draw.py; here, apart from the @triton.jit code, so the engine and the launcher can
name them without importing Triton, whose first import fixes the interpreter mode)."""
#: the seed (an int32 kernel argument: [0, 2^31))
DEFAULT_SEED = 0x5EED_D50F
#: the Philox offset, counter word 3 of every entry's counter ([0, 2^31))
DEFAULT_OFFSET = 0
#: the range both must lie in
LIMIT = 2 ** 31
