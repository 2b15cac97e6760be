// How a process speaks gRPC: TLS or plaintext, and the tokens it sends and accepts. One
// Security is built at start-up (common/security_flags.h reads the flags) and handed to
// every server and channel the process makes.
//
// - TLS: servers present --tls_cert/--tls_key; clients verify servers against --tls_ca
//   (default: the system's roots) and, with a cert and key of their own, present them
//   (mutual TLS; a server with require_client_cert refuses clients without one).
// - Tokens: a client sends the strongest token it has (the admin token if given, else the
//   cluster token) as "authorization: Bearer T" on every call. A server with tokens checks
//   every call before any handler runs (grpc::AuthMetadataProcessor): no or a wrong token
//   gets UNAUTHENTICATED; the cluster token on an admin method gets PERMISSION_DENIED when
//   an admin token is set. The health service answers without a token (probes send none).
//   Tokens without TLS go over gRPC's local credentials, which serve and dial loopback
//   only (TCP to 127.0.0.0/8 or ::1): no one off the machine can read them, and servers
//   refuse every peer that is not on it. Between machines tokens need TLS.
#pragma once

#include <memory>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"

namespace pscluster {

struct SecurityOptions {
  std::string tls_cert;              // PEM certificate (chain) file: this process's identity
  std::string tls_key;               // PEM private key file of tls_cert
  std::string tls_ca;                // PEM file of the CA(s) that sign the peers' certificates
  bool require_client_cert = false;  // servers: mutual TLS, clients must present a cert
  std::string tls_server_name;   // clients: name servers' certs must carry (default: host dialled)
  std::string token_file;        // the cluster token (one line)
  std::string admin_token_file;  // the admin token; admin methods then need it
};

class Security {
 public:
  Security() = default;  // plaintext, no tokens
  // Reads the files; refuses missing or unreadable files, a key without a cert, and tokens
  // that are short or not printable ASCII.
  static absl::StatusOr<Security> Load(const SecurityOptions& options);
  // A client's, from PEM contents and a token already read and checked elsewhere (the
  // Python client's pscluster.Security, for its C++ data path): TLS when `tls`, else
  // loopback only when there is a token.
  static Security ForClient(bool tls, std::string ca, std::string cert, std::string key,
                            std::string token, std::string server_name);

  bool tls() const { return tls_; }
  // Tokens without TLS: every channel and port is loopback only (gRPC's LOCAL_TCP).
  bool loopback_only() const { return !tls_ && tokens(); }
  bool tokens() const { return !token_.empty() || !admin_token_.empty(); }

  // A channel to `target` with this process's TLS and token (args: the caller's own).
  std::shared_ptr<grpc::Channel> Channel(const std::string& target,
                                         grpc::ChannelArguments args = {}) const;
  // Credentials for a listening port. `admin_methods`: full method names
  // ("/pscluster.ps.ShardAdmin/Restore") that need the admin token. Refused with TLS
  // on but no certificate of this process's own.
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(
      std::set<std::string> admin_methods) const;
  // "TLS, tokens" etc., for the start-up line.
  std::string Describe() const;

 private:
  // TLS, or (tokens without TLS) gRPC's local credentials.
  std::shared_ptr<grpc::ChannelCredentials> TransportCredentials() const;
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> TlsServerCredentials() const;

  bool tls_ = false;
  bool require_client_cert_ = false;
  std::string cert_, key_, ca_;  // PEM contents
  std::string server_name_;
  std::string token_, admin_token_;
};

// The admin methods of a service, e.g. AdminMethods("pscluster.ps.ShardAdmin",
// {"Restore", "Snapshot"}).
std::set<std::string> AdminMethods(const std::string& service,
                                   std::initializer_list<const char*> methods);

// A server that did not start listening on `address`: the port taken, or (with TLS) a key
// and certificate gRPC refused. UNAVAILABLE, saying what to try.
absl::Status CannotListen(const std::string& address, const Security& security);

}  // namespace pscluster
