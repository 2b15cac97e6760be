// gRPC answers a request body that does not parse as the method's request message with
// INTERNAL and an empty message (its own deserialiser fails before any handler runs). Every
// server adds this interceptor so that such a request gets INVALID_ARGUMENT naming the
// method and saying that the message did not parse.
#pragma once

#include <memory>

#include "grpcpp/server_builder.h"
#include "grpcpp/support/server_interceptor.h"

namespace pscluster {

// What follows the method's name in that message (also for handlers that parse their
// request themselves).
inline constexpr char kUnparsableRequest[] =
    "the request did not parse as this method's request message (a client built from another "
    ".proto, or corrupted bytes)";

// `after` run after it (e.g. RpcMetrics' interceptor, which then counts the code sent).
void NameUnparsableRequests(
    grpc::ServerBuilder* builder,
    std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> after = nullptr);

}  // namespace pscluster
