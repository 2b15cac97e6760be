// Addresses where they enter a process: HOST:PORT as a client flag names a server, or as a
// member tells the coordinator where it serves. Checked there, before anything dials them or
// passes them on: gRPC takes a port of 99999 as another port, a name without a port as port
// 443 and "http://..." as a name to resolve, and the coordinator sends every address it
// accepts to every member in its view. Stateless and thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pscluster {

// A DNS name's limit (RFC 1035); also bounds an IPv4 address and a bracketed IPv6 one.
inline constexpr size_t kMaxHostLength = 253;
// The longest address CheckHostPort accepts: HOST, ':' and 5 digits.
inline constexpr size_t kMaxHostPortLength = kMaxHostLength + 1 + 5;

struct HostPort {
  std::string host;  // as given: a name, an IPv4 address or "[IPv6]" with its brackets
  uint16_t port = 0;
};

// `value` as HOST:PORT: HOST a name (letters, digits, '-', '_', '.'), an IPv4 address or an
// IPv6 address in brackets ("[::1]"), at most kMaxHostLength characters; PORT 1-65535 in
// decimal; nothing else (no scheme, no path, no whitespace or control characters).
// INVALID_ARGUMENT naming `what` (a flag, a request field), the value (shortened when long)
// and the problem, and what a valid one looks like.
absl::StatusOr<HostPort> ParseHostPort(absl::string_view value, absl::string_view what);

// ParseHostPort's verdict alone.
absl::Status CheckHostPort(absl::string_view value, absl::string_view what);

// A name shown to operators that is no address to dial (a worker's "host/pid:N"): at most
// `max_length` bytes of printable ASCII, no whitespace; empty is fine. INVALID_ARGUMENT
// naming `what`, the value (shortened) and the problem.
absl::Status CheckLabel(absl::string_view value, absl::string_view what,
                        size_t max_length = kMaxHostPortLength);

// `value` for a message: C-escaped (no control characters reach a terminal or a log), cut
// after 64 bytes with the full length said (a 3 MiB value is not echoed back).
std::string ShownValue(absl::string_view value);

}  // namespace pscluster
