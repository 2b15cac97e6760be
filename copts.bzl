"""Compiler options shared by every package."""

# Element-wise loops over parameters (optimizers, gradient checks, checksums, BLAS glue)
# must vectorise; GCC's -O2 cost model leaves them scalar.
HOT_LOOP_COPTS = ["-O3"]
