"""fuzz_target: a libFuzzer target under --config=fuzz (clang, -fsanitize=fuzzer), and in
every other build the same code over replay_main.cc plus a test that replays its seeds."""

def fuzz_target(name, srcs, deps, corpus):
    native.cc_binary(
        name = name,
        testonly = True,
        srcs = srcs,
        linkopts = select({
            "//fuzz:fuzzing": ["-fsanitize=fuzzer"],
            "//conditions:default": [],
        }),
        deps = deps + select({
            "//fuzz:fuzzing": [],
            "//conditions:default": ["//fuzz:replay_main"],
        }),
    )

    # The checked-in seeds still run, whatever the build (a regression test of every bug
    # the fuzzer found: its input is added to the corpus).
    native.sh_test(
        name = name + "_corpus_test",
        size = "small",
        srcs = ["//fuzz:replay_corpus.sh"],
        args = ["$(location :%s)" % name, corpus],
        data = [":" + name] + native.glob([corpus + "/**"]),
    )
