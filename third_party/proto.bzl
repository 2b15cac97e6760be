"""Protobuf + gRPC C++ code generation with Debian's protoc and grpc_cpp_plugin."""

def cc_grpc_proto_library(name, srcs, deps = [], visibility = None):
    """Generates <src>.pb.{h,cc} and <src>.grpc.pb.{h,cc}: the messages in a cc_library
    `<name minus _proto>_cc_proto` (protobuf only, no gRPC) and the services in `name`.

    Code includes them as "proto/foo.pb.h" and "proto/foo.grpc.pb.h". `deps` are other targets of this macro
    whose .proto files the srcs import.
    """
    bases = [s[:-len(".proto")] for s in srcs]
    outs = []
    for b in bases:
        outs += [b + ".pb.h", b + ".pb.cc", b + ".grpc.pb.h", b + ".grpc.pb.cc"]
    dep_protos = [d + "_protos" for d in deps]
    native.filegroup(name = name + "_protos", srcs = srcs + dep_protos, visibility = visibility)
    native.genrule(
        name = name + "_gen",
        srcs = srcs + dep_protos,
        outs = outs,
        cmd = ("/usr/bin/protoc -I. --cpp_out=$(GENDIR) --grpc_out=$(GENDIR) " +
               "--plugin=protoc-gen-grpc=/usr/bin/grpc_cpp_plugin " +
               " ".join(["$(location %s)" % s for s in srcs])),
    )
    messages = name[:-len("_proto")] + "_cc_proto" if name.endswith("_proto") else name + "_cc"
    native.cc_library(
        name = messages,
        srcs = [o for o in outs if o.endswith(".pb.cc") and not o.endswith(".grpc.pb.cc")],
        hdrs = [o for o in outs if o.endswith(".pb.h") and not o.endswith(".grpc.pb.h")],
        deps = [d[:-len("_proto")] + "_cc_proto" for d in deps] + ["//third_party:protobuf"],
        visibility = visibility,
    )
    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".grpc.pb.cc")],
        hdrs = [o for o in outs if o.endswith(".grpc.pb.h")],
        deps = [":" + messages] + deps + ["//third_party:grpc"],
        visibility = visibility,
    )
