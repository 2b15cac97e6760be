#include "common/security_flags.h"

#include <string>

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate of this process (servers present it; clients present it for "
          "mutual TLS). With --tls_key.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA certificate(s) that sign the peers' certificates. --tls_ca or --tls_cert "
          "turns TLS on for every connection this process makes and serves.");
ABSL_FLAG(bool, tls_client_auth, false,
          "Servers: require a client certificate signed by --tls_ca (mutual TLS).");
ABSL_FLAG(std::string, tls_server_name, "",
          "Clients: the name the servers' certificates carry, when it is not the host dialled.");
ABSL_FLAG(std::string, token_file, "",
          "File holding the cluster token, checked on (servers) and sent with (clients) every "
          "call. Without TLS, loopback only. Make one with: openssl rand -hex 32 > cluster.token");
ABSL_FLAG(std::string, admin_token_file, "",
          "File holding the admin token: servers then require it for admin calls (CreateTable, "
          "Snapshot, Restore, ImportDense, UnregisterWorker, SwitchMode, Checkpoint); clients "
          "send it instead of the cluster token.");

namespace pscluster {

absl::StatusOr<Security> SecurityFromFlags() {
  SecurityOptions o;
  o.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  o.tls_key = absl::GetFlag(FLAGS_tls_key);
  o.tls_ca = absl::GetFlag(FLAGS_tls_ca);
  o.require_client_cert = absl::GetFlag(FLAGS_tls_client_auth);
  o.tls_server_name = absl::GetFlag(FLAGS_tls_server_name);
  o.token_file = absl::GetFlag(FLAGS_token_file);
  o.admin_token_file = absl::GetFlag(FLAGS_admin_token_file);
  return Security::Load(o);
}

}  // namespace pscluster
