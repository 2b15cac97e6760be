// gRPC server reflection on ps_server and ps_coordinator: a client that has none of the
// repository's .proto files lists their services and resolves a method's request and answer
// types from the descriptors the server sends, as grpc_cli and grpcurl do.
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/descriptor.pb.h"
#include "google/protobuf/descriptor_database.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/reflection/reflection.grpc.pb.h"
#include "tests/subprocess.h"

namespace pscluster {
namespace {

namespace rpb = grpc::reflection::v1alpha;

// Asks `address` each of `requests` on one reflection stream; the answers in order.
std::vector<rpb::ServerReflectionResponse> Ask(
    const std::string& address, const std::vector<rpb::ServerReflectionRequest>& requests) {
  auto stub = rpb::ServerReflection::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  auto stream = stub->ServerReflectionInfo(&ctx);
  std::vector<rpb::ServerReflectionResponse> answers;
  for (const auto& r : requests) {
    rpb::ServerReflectionResponse answer;
    if (!stream->Write(r) || !stream->Read(&answer)) break;
    answers.push_back(answer);
  }
  stream->WritesDone();
  const grpc::Status status = stream->Finish();
  EXPECT_TRUE(status.ok()) << address << ": " << status.error_message();
  EXPECT_EQ(answers.size(), requests.size()) << address;
  return answers;
}

rpb::ServerReflectionRequest ListServices() {
  rpb::ServerReflectionRequest r;
  r.set_list_services("*");
  return r;
}

rpb::ServerReflectionRequest FileContaining(const std::string& symbol) {
  rpb::ServerReflectionRequest r;
  r.set_file_containing_symbol(symbol);
  return r;
}

std::set<std::string> Names(const rpb::ServerReflectionResponse& answer) {
  std::set<std::string> names;
  for (const auto& s : answer.list_services_response().service()) names.insert(s.name());
  return names;
}

// The input and output types of `method` (package.Service.Method), from the descriptors of a
// file_containing_symbol answer alone.
std::string Signature(const rpb::ServerReflectionResponse& answer, const std::string& method) {
  google::protobuf::SimpleDescriptorDatabase files;
  for (const std::string& bytes : answer.file_descriptor_response().file_descriptor_proto()) {
    google::protobuf::FileDescriptorProto file;
    EXPECT_TRUE(file.ParseFromString(bytes));
    EXPECT_TRUE(files.Add(file)) << file.name();
  }
  google::protobuf::DescriptorPool pool(&files);
  const google::protobuf::MethodDescriptor* m = pool.FindMethodByName(method);
  if (m == nullptr) return "no method " + method;
  return absl::StrCat(m->input_type()->full_name(), " -> ", m->output_type()->full_name());
}

class ReflectionTest : public ::testing::Test {
 protected:
  // Starts `argv` and returns the address of its "listening on" line.
  std::string Start(std::vector<std::string> argv) {
    auto p = testing::Subprocess::Start(std::move(argv));
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return "";
    auto line = p->WaitForLine("listening on", absl::Seconds(60));
    EXPECT_TRUE(line.ok()) << line.status();
    processes_.push_back(*std::move(p));
    return line.ok() ? testing::ListeningAddress(*line).value_or("") : "";
  }
  std::vector<testing::Subprocess> processes_;
};

TEST_F(ReflectionTest, TheShardListsItsServicesAndDescribesItsMethods) {
  const std::string shard =
      Start({"server/ps/ps_server", "--port=0", "--shard_id=0", "--num_shards=1"});
  ASSERT_FALSE(shard.empty());
  const auto answers = Ask(shard, {ListServices(), FileContaining("pscluster.ps.ShardData")});
  ASSERT_EQ(answers.size(), 2u);
  const std::set<std::string> services = Names(answers[0]);
  for (const char* s :
       {"pscluster.ps.ShardData", "pscluster.ps.ShardAdmin", "pscluster.ps.ShardReplication",
        "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"}) {
    EXPECT_EQ(services.count(s), 1u) << s << " not among " << services.size() << " services";
  }
  EXPECT_EQ(Signature(answers[1], "pscluster.ps.ShardData.PushDense"),
            "pscluster.ps.DenseChunk -> pscluster.ps.PushDenseResponse");
  EXPECT_EQ(Signature(answers[1], "pscluster.ps.ShardAdmin.Restore"),
            "pscluster.ps.RestoreRequest -> pscluster.ps.RestoreResponse");
}

TEST_F(ReflectionTest, TheCoordinatorListsItsServicesAndDescribesItsMethods) {
  const std::string coordinator =
      Start({"server/coordinator/ps_coordinator", "--port=0", "--num_shards=1", "--num_workers=1"});
  ASSERT_FALSE(coordinator.empty());
  const auto answers =
      Ask(coordinator, {ListServices(), FileContaining("pscluster.coord.Coordinator")});
  ASSERT_EQ(answers.size(), 2u);
  EXPECT_EQ(Names(answers[0]).count("pscluster.coord.Coordinator"), 1u);
  EXPECT_EQ(Signature(answers[1], "pscluster.coord.Coordinator.GetView").find("no method"),
            std::string::npos);
}

// An unknown symbol is an error answer on the stream, not a broken call.
TEST_F(ReflectionTest, AnUnknownSymbolIsAnErrorAnswer) {
  const std::string shard =
      Start({"server/ps/ps_server", "--port=0", "--shard_id=0", "--num_shards=1"});
  ASSERT_FALSE(shard.empty());
  const auto answers = Ask(shard, {FileContaining("pscluster.ps.NoSuchService")});
  ASSERT_EQ(answers.size(), 1u);
  EXPECT_EQ(answers[0].error_response().error_code(), grpc::StatusCode::NOT_FOUND);
}

}  // namespace
}  // namespace pscluster
