#include "common/parse_errors.h"

#include <memory>
#include <string>
#include <vector>

#include "grpcpp/support/server_interceptor.h"

namespace pscluster {
namespace {

using grpc::experimental::InterceptionHookPoints;

class ParseErrorInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit ParseErrorInterceptor(grpc::experimental::ServerRpcInfo* info) : info_(info) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    // A unary or server-streaming request always carries exactly one message: none after
    // receiving means it did not parse. (A client stream's end looks the same, so streams
    // are left to their handlers.)
    const auto type = info_->type();
    const bool one_request = type == grpc::experimental::ServerRpcInfo::Type::UNARY ||
                             type == grpc::experimental::ServerRpcInfo::Type::SERVER_STREAMING;
    if (one_request &&
        methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE) &&
        methods->GetRecvMessage() == nullptr) {
      unparsable_ = true;
    }
    if (unparsable_ &&
        methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS) &&
        methods->GetSendStatus().error_code() == grpc::StatusCode::INTERNAL) {
      methods->ModifySendStatus(
          grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                       std::string(info_->method()) + ": " + kUnparsableRequest));
    }
    methods->Proceed();
  }

 private:
  grpc::experimental::ServerRpcInfo* const info_;
  bool unparsable_ = false;
};

class ParseErrorInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new ParseErrorInterceptor(info);
  }
};

}  // namespace

void NameUnparsableRequests(
    grpc::ServerBuilder* builder,
    std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> after) {
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> factories;
  factories.push_back(std::make_unique<ParseErrorInterceptorFactory>());
  if (after != nullptr) factories.push_back(std::move(after));
  builder->experimental().SetInterceptorCreators(std::move(factories));
}

}  // namespace pscluster
