// gRPC answers a request body that does not parse as the method's request message with
// INTERNAL and an empty message (its own deserialiser fails before any handler runs). Every
// server adds this interceptor so that such a request gets INVALID_ARGUMENT naming the
// method and saying that the message did not parse.
#pragma once

#include "grpcpp/server_builder.h"

namespace pscluster {

void NameUnparsableRequests(grpc::ServerBuilder* builder);

}  // namespace pscluster
