// TLS and tokens through real ps_server processes (common/security.h): certificates and
// tokens made by deploy/make_certs.sh with openssl, as an operator makes them. A call without
// the right token or TLS changes nothing; the cluster token cannot do what needs the admin
// token; a ps_worker trains over TLS with tokens.
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>

#include "gmock/gmock.h"
#include "tests/ps_cluster_fixture.h"
#include "tests/test_tables.h"

namespace pscluster {
namespace {

using ::testing::HasSubstr;

constexpr uint32_t kTable = 1;
constexpr uint64_t kSize = 1000;

// Certificates and tokens in `dir`: `names` are the hosts the certificate is for.
void MakeCerts(const std::string& dir, const std::string& names) {
  const std::string cmd = absl::StrCat("deploy/make_certs.sh ", dir, " ", names, " >/dev/null");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd << " failed (is openssl installed?)";
}

void WriteFile(const std::string& path, const std::string& contents) {
  std::ofstream(path) << contents;
}

class SecurityTest : public PsClusterTest {
 protected:
  static void SetUpTestSuite() {
    MakeCerts(Dir(), "localhost 127.0.0.1");
    MakeCerts(Dir() + "/other", "localhost 127.0.0.1");  // another CA: not trusted
    WriteFile(Dir() + "/wrong.token", "0123456789abcdef0123456789abcdef\n");
  }
  static std::string Dir() { return ::testing::TempDir() + "/tls"; }
  static std::string Flag(const std::string& name, const std::string& file) {
    return absl::StrCat("--", name, "=", Dir(), "/", file);
  }

  std::vector<std::string> ServerArgs() override {
    return {Flag("tls_cert", "node.pem"), Flag("tls_key", "node.key"), Flag("tls_ca", "ca.pem"),
            Flag("token_file", "cluster.token"), Flag("admin_token_file", "admin.token")};
  }
  Security ClientSecurity() override { return Client("cluster.token"); }

  // A client's security: TLS against ca_dir's CA, with the token in `token` (none if empty).
  static Security Client(const std::string& token, const std::string& ca_dir = Dir()) {
    SecurityOptions o;
    o.tls_ca = ca_dir + "/ca.pem";
    if (!token.empty()) o.token_file = Dir() + "/" + token;
    absl::StatusOr<Security> s = Security::Load(o);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.value_or(Security());
  }
  std::unique_ptr<PsClient> Connect(const Security& security, int worker = 0) {
    PsClientOptions o;
    o.shard_addresses = addresses_;
    o.worker_id = worker;
    o.rpc_timeout = absl::Seconds(20);
    o.security = security;
    auto c = PsClient::Create(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }
  static TableSpec Table() {
    OptimizerConfig adam;
    adam.set_kind(OptimizerConfig::ADAM);
    adam.set_learning_rate(0.01f);
    TableSpec t = Spec(kTable, TableSpec::DENSE, adam);
    t.set_size(kSize);
    t.mutable_consistency()->set_mode(ps::ConsistencyConfig::ASP);
    return t;
  }
  std::vector<float> Values() {
    std::vector<float> v(kSize);
    EXPECT_TRUE(clients_[0]->PullDense(kTable, 0, absl::MakeSpan(v)).ok());
    return v;
  }
};

TEST_F(SecurityTest, WithTheAdminTokenTablesAreMadeAndTheClusterTokenTrains) {
  auto admin = Connect(Client("admin.token"));
  ASSERT_TRUE(admin->CreateTable(Table()).ok());
  const std::vector<float> before = Values();
  std::vector<float> grad(kSize, 0.5f);
  ASSERT_TRUE(clients_[0]->PushDense(kTable, 0, grad).ok());
  EXPECT_NE(Values(), before) << "an accepted push changed nothing";
}

TEST_F(SecurityTest, TheClusterTokenCannotDoWhatNeedsTheAdminToken) {
  absl::Status create = clients_[0]->CreateTable(Table());
  EXPECT_EQ(create.code(), absl::StatusCode::kPermissionDenied) << create;
  EXPECT_THAT(create.message(), HasSubstr("CreateTable needs the admin token"));
  auto admin = Connect(Client("admin.token"));
  ASSERT_TRUE(admin->CreateTable(Table()).ok()) << "the refused CreateTable left something";
  absl::Status snapshot = clients_[0]->Snapshot(0);
  EXPECT_EQ(snapshot.code(), absl::StatusCode::kPermissionDenied) << snapshot;
  absl::Status leave = clients_[1]->UnregisterWorker();
  EXPECT_EQ(leave.code(), absl::StatusCode::kPermissionDenied) << leave;
}

TEST_F(SecurityTest, AWrongOrMissingTokenIsUnauthenticatedAndChangesNothing) {
  ASSERT_TRUE(Connect(Client("admin.token"))->CreateTable(Table()).ok());
  const std::vector<float> before = Values();
  std::vector<float> grad(kSize, 1.0f);
  for (const char* token : {"wrong.token", ""}) {
    SCOPED_TRACE(token);
    auto intruder = Connect(Client(token), /*worker=*/0);
    absl::Status push = intruder->PushDense(kTable, 0, grad);
    EXPECT_EQ(push.code(), absl::StatusCode::kUnauthenticated) << push;
    EXPECT_THAT(push.message(), HasSubstr(*token ? "wrong token" : "no token"));
    EXPECT_EQ(intruder->CreateTable(Table()).code(), absl::StatusCode::kUnauthenticated);
    EXPECT_EQ(intruder->Restore(0).code(), absl::StatusCode::kUnauthenticated);
  }
  EXPECT_EQ(Values(), before) << "a refused call changed the table";
}

TEST_F(SecurityTest, PlaintextAndUntrustedCertificatesDoNotConnect) {
  ASSERT_TRUE(Connect(Client("admin.token"))->CreateTable(Table()).ok());
  const std::vector<float> before = Values();
  std::vector<float> grad(kSize, 1.0f);
  absl::Status plaintext = Connect(Security())->PushDense(kTable, 0, grad);
  EXPECT_EQ(plaintext.code(), absl::StatusCode::kUnavailable) << plaintext;
  // A server whose certificate another CA signed: the client refuses it (and so never sends
  // its token to it).
  absl::Status untrusted =
      Connect(Client("cluster.token", Dir() + "/other"))->PushDense(kTable, 0, grad);
  EXPECT_EQ(untrusted.code(), absl::StatusCode::kUnavailable) << untrusted;
  EXPECT_EQ(Values(), before);
}

// Files that cannot serve are named; tokens without TLS are loopback only.
TEST(SecurityLoadTest, RefusesWhatCannotBeSafe) {
  const std::string dir = ::testing::TempDir() + "/load";
  MakeCerts(dir, "localhost");
  WriteFile(dir + "/short.token", "abc\n");
  WriteFile(dir + "/space.token", "0123456789abcdef 0123456789abcdef\n");
  auto refused = [](SecurityOptions o, const std::string& says) {
    absl::StatusOr<Security> s = Security::Load(o);
    EXPECT_FALSE(s.ok()) << says;
    EXPECT_THAT(s.status().message(), HasSubstr(says));
  };
  SecurityOptions token_only;
  token_only.token_file = dir + "/cluster.token";
  absl::StatusOr<Security> loopback = Security::Load(token_only);
  ASSERT_TRUE(loopback.ok()) << loopback.status();
  EXPECT_TRUE(loopback->loopback_only());
  EXPECT_THAT(loopback->Describe(), HasSubstr("loopback only"));
  SecurityOptions short_token = token_only;
  short_token.tls_ca = dir + "/ca.pem";
  short_token.token_file = dir + "/short.token";
  refused(short_token, "at least 16");
  short_token.token_file = dir + "/space.token";
  refused(short_token, "printable ASCII without spaces");
  SecurityOptions key_alone;
  key_alone.tls_key = dir + "/node.key";
  refused(key_alone, "--tls_cert and --tls_key go together");
  SecurityOptions missing;
  missing.tls_ca = dir + "/nowhere.pem";
  refused(missing, "--tls_ca=" + dir + "/nowhere.pem: cannot read it");
  SecurityOptions client_auth;
  client_auth.tls_cert = dir + "/node.pem";
  client_auth.tls_key = dir + "/node.key";
  client_auth.require_client_cert = true;
  refused(client_auth, "--tls_client_auth needs --tls_ca");
  // A client-only configuration cannot serve.
  SecurityOptions client;
  client.tls_ca = dir + "/ca.pem";
  absl::StatusOr<Security> s = Security::Load(client);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_FALSE(s->ServerCredentials({}).ok());
}

// Tokens without TLS (deploy/local_cluster.sh's default): gRPC's local credentials, on
// loopback, with every call's token checked as over TLS.
class LoopbackTokenTest : public SecurityTest {
 protected:
  std::vector<std::string> ServerArgs() override {
    return {Flag("token_file", "cluster.token"), Flag("admin_token_file", "admin.token")};
  }
  Security ClientSecurity() override { return Local("cluster.token"); }
  // A client's security without TLS, with the token in `token` (none if empty).
  static Security Local(const std::string& token) {
    SecurityOptions o;
    if (!token.empty()) o.token_file = Dir() + "/" + token;
    absl::StatusOr<Security> s = Security::Load(o);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.value_or(Security());
  }
};

TEST_F(LoopbackTokenTest, TokensAreCheckedWithoutTls) {
  absl::Status create = clients_[0]->CreateTable(Table());
  EXPECT_EQ(create.code(), absl::StatusCode::kPermissionDenied) << create;
  ASSERT_TRUE(Connect(Local("admin.token"))->CreateTable(Table()).ok());
  const std::vector<float> before = Values();
  std::vector<float> grad(kSize, 1.0f);
  for (const char* token : {"wrong.token", ""}) {
    SCOPED_TRACE(token);
    absl::Status push = Connect(Local(token))->PushDense(kTable, 0, grad);
    EXPECT_EQ(push.code(), absl::StatusCode::kUnauthenticated) << push;
    EXPECT_THAT(push.message(), HasSubstr(*token ? "wrong token" : "no token"));
  }
  // A TLS client does not speak to it (nor sends it its token).
  absl::Status tls = Connect(Client("cluster.token"))->PushDense(kTable, 0, grad);
  EXPECT_EQ(tls.code(), absl::StatusCode::kUnavailable) << tls;
  EXPECT_EQ(Values(), before) << "a refused call changed the table";
  ASSERT_TRUE(clients_[0]->PushDense(kTable, 0, grad).ok());
  EXPECT_NE(Values(), before) << "an accepted push changed nothing";
}

// Mutual TLS: a server with --tls_client_auth refuses a client without a certificate.
class MutualTlsTest : public SecurityTest {
 protected:
  std::vector<std::string> ServerArgs() override {
    std::vector<std::string> args = SecurityTest::ServerArgs();
    args.push_back("--tls_client_auth");
    return args;
  }
  Security ClientSecurity() override { return WithCert("cluster.token"); }
  static Security WithCert(const std::string& token) {
    SecurityOptions o;
    o.tls_ca = Dir() + "/ca.pem";
    o.tls_cert = Dir() + "/node.pem";
    o.tls_key = Dir() + "/node.key";
    o.token_file = Dir() + "/" + token;
    absl::StatusOr<Security> s = Security::Load(o);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.value_or(Security());
  }
};

TEST_F(MutualTlsTest, ClientsWithoutACertificateAreRefused) {
  ASSERT_TRUE(Connect(WithCert("admin.token"))->CreateTable(Table()).ok());
  const std::vector<float> before = Values();
  std::vector<float> grad(kSize, 1.0f);
  absl::Status no_cert = Connect(Client("admin.token"))->PushDense(kTable, 0, grad);
  EXPECT_EQ(no_cert.code(), absl::StatusCode::kUnavailable) << no_cert;
  EXPECT_EQ(Values(), before);
  EXPECT_TRUE(clients_[0]->PushDense(kTable, 0, grad).ok());
}

// The whole worker over TLS with tokens: it creates its tables (admin token) and trains.
TEST_F(SecurityTest, AWorkerTrainsOverTlsWithTokens) {
  const std::string summary = ::testing::TempDir() + "/tls_worker.json";
  std::vector<std::string> argv = {
      "worker/ps_worker", absl::StrCat("--ps=", addresses_[0], ",", addresses_[1]), "--rank=0",
      "--world=1", "--synthetic=2000", "--layers=20,16,4", "--epochs=1", "--batch_size=32",
      // the fixture's idle clients are registered workers too
      "--consistency=asp", "--summary_json=" + summary,
      // TLS and the admin token: the worker creates its tables
      Flag("tls_ca", "ca.pem"), Flag("admin_token_file", "admin.token")};
  auto worker = testing::Subprocess::Start(argv);
  ASSERT_TRUE(worker.ok()) << worker.status();
  auto done = worker->WaitForLine("done:", absl::Minutes(3));
  ASSERT_TRUE(done.ok()) << done.status();
  auto status = worker->Wait(absl::Minutes(1));
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0);
}

}  // namespace
}  // namespace pscluster
