"""Compiler options shared by every package."""

# Element-wise loops over parameters (optimizers, gradient checks, checksums, BLAS glue)
# must vectorise; GCC's -O2 cost model leaves them scalar. -fno-trapping-math lets GCC turn
# a clamp (x < lo ? lo : x) into a vector min/max: it changes no result, only the
# floating-point exception flags, which nothing here reads (the GPT's GELU was scalar
# without it).
HOT_LOOP_COPTS = [
    "-O3",
    "-fno-trapping-math",
]
