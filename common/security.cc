#include "common/security.h"

#include <atomic>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace pscluster {
namespace {

constexpr size_t kMinTokenBytes = 16;
constexpr char kBearer[] = "Bearer ";
constexpr char kHealthService[] = "/grpc.health.v1.Health/";

absl::StatusOr<std::string> ReadFile(const std::string& flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("--", flag, "=", path, ": cannot read it"));
  std::ostringstream contents;
  contents << in.rdbuf();
  if (contents.str().empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", path, ": the file is empty"));
  }
  return contents.str();
}

// The token in `path`: one line, surrounding white space stripped.
absl::StatusOr<std::string> ReadToken(const std::string& flag, const std::string& path) {
  absl::StatusOr<std::string> contents = ReadFile(flag, path);
  if (!contents.ok()) return contents.status();
  std::string token(absl::StripAsciiWhitespace(*contents));
  for (char c : token) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, "=", path,
                       ": a token is one line of printable ASCII without spaces (gRPC metadata); "
                       "make one with: openssl rand -hex 32 > ",
                       path));
    }
  }
  if (token.size() < kMinTokenBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", flag, "=", path, ": the token has ", token.size(), " characters; at least ",
        kMinTokenBytes, " are needed so that it cannot be guessed (openssl rand -hex 32 > ", path,
        ")"));
  }
  return token;
}

// Whether a channel target names this machine's loopback: "127.x.y.z:port",
// "localhost:port", "[::1]:port" (with or without a "dns:"/"ipv4:"/"ipv6:" scheme).
bool IsLoopbackTarget(absl::string_view target) {
  for (absl::string_view scheme : {"dns:///", "dns:", "ipv4:", "ipv6:"}) {
    if (absl::ConsumePrefix(&target, scheme)) break;
  }
  return absl::StartsWith(target, "127.") || absl::StartsWith(target, "localhost:") ||
         absl::StartsWith(target, "[::1]:");
}

// Said once per process: a channel that cannot work, since local credentials dial loopback
// only.
void WarnNotLoopback(const std::string& target) {
  static std::atomic<bool> said{false};
  if (said.exchange(true)) return;
  LogWarning(
      "tokens without TLS reach loopback addresses only, and %s is not one: calls to it "
      "fail. Between machines, give --tls_ca (and --tls_cert/--tls_key to servers): "
      "docs/security.md",
      target.c_str());
}

// Compares without leaving early on the first different byte, so the time taken does not
// tell a caller how much of a guess was right.
bool SameToken(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size() || a.empty()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// Checks the token of every call before its handler runs.
class TokenChecker final : public grpc::AuthMetadataProcessor {
 public:
  TokenChecker(std::string token, std::string admin_token, std::set<std::string> admin_methods)
      : token_(std::move(token)),
        admin_token_(std::move(admin_token)),
        admin_methods_(std::move(admin_methods)) {}

  bool IsBlocking() const override { return false; }  // a comparison: run it inline

  grpc::Status Process(const InputMetadata& metadata, grpc::AuthContext*, OutputMetadata* consumed,
                       OutputMetadata*) override {
    auto path_it = metadata.find(":path");
    const std::string path = path_it == metadata.end()
                                 ? std::string()
                                 : std::string(path_it->second.data(), path_it->second.size());
    if (absl::StartsWith(path, kHealthService)) return grpc::Status::OK;
    auto auth = metadata.find("authorization");
    if (auth == metadata.end()) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          absl::StrCat(path,
                                       ": no token; this cluster needs one on every call "
                                       "(--token_file, or token= in the Python client)"));
    }
    absl::string_view value(auth->second.data(), auth->second.size());
    consumed->insert(
        std::make_pair(std::string(auth->first.data(), auth->first.size()), std::string(value)));
    if (!absl::ConsumePrefix(&value, kBearer)) {
      return grpc::Status(
          grpc::StatusCode::UNAUTHENTICATED,
          absl::StrCat(path, ": the authorization metadata is not \"Bearer TOKEN\""));
    }
    if (SameToken(value, admin_token_)) return grpc::Status::OK;
    if (!SameToken(value, token_)) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          absl::StrCat(path, ": wrong token; nothing was done"));
    }
    if (!admin_token_.empty() && admin_methods_.count(path) > 0) {
      return grpc::Status(
          grpc::StatusCode::PERMISSION_DENIED,
          absl::StrCat(path, " needs the admin token (--admin_token_file); nothing was done"));
    }
    return grpc::Status::OK;
  }

 private:
  const std::string token_, admin_token_;
  const std::set<std::string> admin_methods_;
};

}  // namespace

absl::StatusOr<Security> Security::Load(const SecurityOptions& o) {
  Security s;
  if (o.tls_cert.empty() != o.tls_key.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert and --tls_key go together: a certificate and its private key");
  }
  if (!o.tls_cert.empty()) {
    absl::StatusOr<std::string> cert = ReadFile("tls_cert", o.tls_cert);
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadFile("tls_key", o.tls_key);
    if (!key.ok()) return key.status();
    s.cert_ = *std::move(cert);
    s.key_ = *std::move(key);
  }
  if (!o.tls_ca.empty()) {
    absl::StatusOr<std::string> ca = ReadFile("tls_ca", o.tls_ca);
    if (!ca.ok()) return ca.status();
    s.ca_ = *std::move(ca);
  }
  s.tls_ = !o.tls_cert.empty() || !o.tls_ca.empty();
  if (o.require_client_cert && s.ca_.empty()) {
    return absl::InvalidArgumentError(
        "--tls_client_auth needs --tls_ca: the CA that signs the clients' certificates");
  }
  s.require_client_cert_ = o.require_client_cert;
  s.server_name_ = o.tls_server_name;
  if (!o.token_file.empty()) {
    absl::StatusOr<std::string> token = ReadToken("token_file", o.token_file);
    if (!token.ok()) return token.status();
    s.token_ = *std::move(token);
  }
  if (!o.admin_token_file.empty()) {
    absl::StatusOr<std::string> token = ReadToken("admin_token_file", o.admin_token_file);
    if (!token.ok()) return token.status();
    s.admin_token_ = *std::move(token);
  }
  return s;
}

Security Security::ForClient(bool tls, std::string ca, std::string cert, std::string key,
                             std::string token, std::string server_name) {
  Security s;
  s.tls_ = tls;
  s.ca_ = std::move(ca);
  s.cert_ = std::move(cert);
  s.key_ = std::move(key);
  s.token_ = std::move(token);
  s.server_name_ = std::move(server_name);
  return s;
}

std::shared_ptr<grpc::ChannelCredentials> Security::TransportCredentials() const {
  if (!tls_) return grpc::experimental::LocalCredentials(LOCAL_TCP);
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = ca_;  // empty: gRPC's default roots
  ssl.pem_cert_chain = cert_;
  ssl.pem_private_key = key_;
  return grpc::SslCredentials(ssl);
}

std::shared_ptr<grpc::Channel> Security::Channel(const std::string& target,
                                                 grpc::ChannelArguments args) const {
  if (!tls_ && !tokens()) {
    return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  }
  if (loopback_only() && !IsLoopbackTarget(target)) WarnNotLoopback(target);
  std::shared_ptr<grpc::ChannelCredentials> credentials = TransportCredentials();
  const std::string& token = admin_token_.empty() ? token_ : admin_token_;
  if (!token.empty()) {
    credentials =
        grpc::CompositeChannelCredentials(credentials, grpc::AccessTokenCredentials(token));
  }
  if (!server_name_.empty()) args.SetSslTargetNameOverride(server_name_);
  return grpc::CreateCustomChannel(target, credentials, args);
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> Security::ServerCredentials(
    std::set<std::string> admin_methods) const {
  if (!tls_ && !tokens()) return grpc::InsecureServerCredentials();
  std::shared_ptr<grpc::ServerCredentials> credentials;
  if (tls_) {
    ASSIGN_OR_RETURN(credentials, TlsServerCredentials());
  } else {  // tokens without TLS: loopback peers only
    credentials = grpc::experimental::LocalServerCredentials(LOCAL_TCP);
  }
  if (tokens()) {
    credentials->SetAuthMetadataProcessor(
        std::make_shared<TokenChecker>(token_, admin_token_, std::move(admin_methods)));
  }
  return credentials;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> Security::TlsServerCredentials() const {
  if (cert_.empty()) {
    return absl::InvalidArgumentError(
        "with TLS on (--tls_ca), a server needs --tls_cert and --tls_key to serve TLS too");
  }
  grpc::SslServerCredentialsOptions ssl(
      require_client_cert_ ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                           : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  ssl.pem_root_certs = ca_;
  ssl.pem_key_cert_pairs.push_back({key_, cert_});
  return grpc::SslServerCredentials(ssl);
}

std::string Security::Describe() const {
  // Said in every server's start line: the default is open to anyone on the network.
  if (!tls_ && !tokens()) {
    return "plaintext, no token: anyone who reaches this port can change the cluster's "
           "parameters; docs/security.md turns on TLS and tokens";
  }
  std::vector<std::string> parts = {!tls_                  ? "loopback only (tokens without TLS)"
                                    : require_client_cert_ ? "mutual TLS"
                                                           : "TLS"};
  if (!token_.empty()) parts.push_back("cluster token");
  if (!admin_token_.empty()) parts.push_back("admin token");
  return absl::StrJoin(parts, ", ");
}

std::set<std::string> AdminMethods(const std::string& service,
                                   std::initializer_list<const char*> methods) {
  std::set<std::string> names;
  for (const char* m : methods) names.insert(absl::StrCat("/", service, "/", m));
  return names;
}

absl::Status CannotListen(const std::string& address, const Security& security) {
  return absl::UnavailableError(
      absl::StrCat("cannot listen on ", address, " (port in use? try --port=0",
                   security.tls() ? "; or gRPC refused the TLS key and certificate: do "
                                    "--tls_cert and --tls_key belong together?"
                                  : "",
                   ")"));
}

}  // namespace pscluster
