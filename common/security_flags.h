// --tls_cert, --tls_key, --tls_ca, --tls_client_auth, --tls_server_name, --token_file and
// --admin_token_file, shared by ps_server, ps_coordinator, ps_worker and psctl.
#pragma once

#include "absl/status/statusor.h"
#include "common/security.h"

namespace pscluster {

// The flags read and their files loaded (errors name the flag and the file).
absl::StatusOr<Security> SecurityFromFlags();

}  // namespace pscluster
