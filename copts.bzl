"""Compiler options shared by every package."""

# Element-wise loops over parameters (optimizers, gradient checks, checksums, BLAS glue)
# must vectorise; GCC's -O2 cost model leaves them scalar. -fno-trapping-math lets GCC turn
# a clamp (x < lo ? lo : x) into a vector min/max: it changes no result, only the
# floating-point exception flags, which nothing here reads (the GPT's GELU was scalar
# without it). -fno-math-errno lets a loop's std::sqrt be one vector instruction: with errno
# kept, each sqrt of a float below zero must call libm to set errno, so the loop stays
# scalar (Adam's update ran at ~1.7 ns an element, 0.5 with it, bitwise the same results).
# Nothing here reads errno after a math function.
HOT_LOOP_COPTS = [
    "-O3",
    "-fno-trapping-math",
    "-fno-math-errno",
]
