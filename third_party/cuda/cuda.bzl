"""CUDA sources compiled by /usr/local/cuda's nvcc, only under --config=cuda."""

NVCC_FLAGS = " ".join([
    "-std=c++17",
    "-O2",
    "-Xcompiler -fPIC",
    "-gencode arch=compute_90,code=sm_90",
    "-gencode arch=compute_90,code=compute_90",  # PTX fallback for newer GPUs
    "-I.",
])

def cuda_library(name, srcs, hdrs = [], deps = [], nvcc_hdrs = [], **kw):
    """A cc_library over objects nvcc builds from `srcs` (.cu), linked with cudart.

    `hdrs` may be included by the .cu files and by C++ users. Without --config=cuda the
    library is empty, so depend on it only through select() on //third_party:cuda_enabled.
    `nvcc_hdrs`: headers of other packages the .cu files include (nvcc sees only these).
    """
    objs = []
    for src in srcs:
        obj = name + "_" + src.replace("/", "_").replace(".cu", ".o")
        native.genrule(
            name = obj + "_nvcc",
            srcs = [src] + hdrs + nvcc_hdrs,
            outs = [obj],
            cmd = "/usr/local/cuda/bin/nvcc %s -I/usr/local/cuda/include -c $(location %s) -o $@" % (NVCC_FLAGS, src),
            target_compatible_with = select({
                "//third_party:cuda_enabled": [],
                "//conditions:default": ["//third_party:incompatible"],
            }),
        )
        objs.append(obj)
    native.cc_library(
        name = name,
        srcs = select({
            "//third_party:cuda_enabled": objs,
            "//conditions:default": [],
        }),
        hdrs = hdrs,
        deps = deps + select({
            "//third_party:cuda_enabled": ["@local_cuda//:cudart"],
            "//conditions:default": [],
        }),
        **kw
    )
