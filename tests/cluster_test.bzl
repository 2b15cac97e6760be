"""cluster_test: a multi-process test over the real binaries."""

_BINARIES = {
    "coordinator": "//server/coordinator:ps_coordinator",
    "psctl": "//tools/psctl",
    "server": "//server/ps:ps_server",
    "worker": "//worker:ps_worker",
}

def cluster_test(name, binaries = ["server"], deps = [], data = [], **kw):
    """A medium cc_test <name>.cc that starts `binaries` (server, coordinator, worker, psctl)."""
    native.cc_test(
        name = name,
        size = "medium",
        srcs = [name + ".cc"],
        data = [_BINARIES[b] for b in binaries] + data,
        deps = deps + ["//third_party:gtest_main"],
        **kw
    )
