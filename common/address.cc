#include "common/address.h"

#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace pscluster {
namespace {

constexpr char kValidForm[] =
    "; give HOST:PORT, e.g. 127.0.0.1:4000, localhost:4000 or [::1]:4000 (HOST a name of at "
    "most 253 characters or an IP address, IPv6 in brackets; PORT 1-65535; no scheme such as "
    "http://)";

absl::Status Invalid(absl::string_view what, absl::string_view value, absl::string_view problem,
                     absl::string_view advice) {
  return absl::InvalidArgumentError(
      absl::StrCat(what, " '", ShownValue(value), "' ", problem, advice));
}

// Where `value` has a byte that is no printable ASCII (whitespace, a control character,
// UTF-8), and what it is; nullopt when it has none.
std::optional<std::string> Unprintable(absl::string_view value) {
  for (size_t i = 0; i < value.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(value[i]);
    if (c > 0x20 && c < 0x7f) continue;
    const char* kind = c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'
                           ? "whitespace"
                       : c < 0x80 ? "a control character"
                                  : "a non-ASCII byte";
    return absl::StrCat("has ", kind, " (byte ", i, ")");
  }
  return std::nullopt;
}

bool IsNameChar(char c) { return absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.'; }

// The problem with `host` (a name, an IPv4 address or a bracketed IPv6 address), if any.
std::optional<std::string> HostProblem(absl::string_view host) {
  if (host.empty()) return "has no host before the ':'";
  if (host.size() > kMaxHostLength) {
    return absl::StrCat("has a host of ", host.size(), " characters; at most ", kMaxHostLength);
  }
  if (host.front() == '[') {
    absl::string_view ip = host.substr(1, host.size() - 2);  // without the brackets
    const size_t zone = ip.find('%');                        // fe80::1%eth0
    for (size_t i = 0; i < ip.size(); ++i) {
      const char c = ip[i];
      const bool ok = i < zone ? absl::ascii_isxdigit(c) || c == ':' || c == '.' : IsNameChar(c);
      if (!ok && i != zone)
        return absl::StrCat("has '", ShownValue(ip), "' in brackets: no IPv6 address");
    }
    if (ip.substr(0, zone).find(':') == absl::string_view::npos) {
      return absl::StrCat("has '", ShownValue(ip), "' in brackets: no IPv6 address");
    }
    return std::nullopt;
  }
  if (host.find(':') != absl::string_view::npos) {
    return "has a ':' in its host: an IPv6 address goes in brackets, as in [::1]:4000";
  }
  for (char c : host) {
    if (!IsNameChar(c)) return absl::StrCat("has '", ShownValue({&c, 1}), "' in its host");
  }
  return std::nullopt;
}

}  // namespace

std::string ShownValue(absl::string_view value) {
  constexpr size_t kShown = 64;
  if (value.size() <= kShown) return absl::CHexEscape(value);
  return absl::StrCat(absl::CHexEscape(value.substr(0, kShown)), "... (", value.size(), " bytes)");
}

absl::StatusOr<HostPort> ParseHostPort(absl::string_view value, absl::string_view what) {
  if (value.empty()) return Invalid(what, value, "is empty", kValidForm);
  if (const size_t scheme = value.find("://"); scheme != absl::string_view::npos) {
    return Invalid(what, value,
                   absl::StrCat("has a scheme ('", ShownValue(value.substr(0, scheme + 3)), "')"),
                   kValidForm);
  }
  if (std::optional<std::string> bad = Unprintable(value)) {
    return Invalid(what, value, *bad, kValidForm);
  }
  // The host ends at the ']' of an IPv6 address, else at the last ':'.
  size_t colon = value.rfind(':');
  if (value.front() == '[') {
    const size_t close = value.find(']');
    if (close == absl::string_view::npos) {
      return Invalid(what, value, "has a '[' without its ']'", kValidForm);
    }
    colon =
        value.size() > close + 1 && value[close + 1] == ':' ? close + 1 : absl::string_view::npos;
    if (colon == absl::string_view::npos && close + 1 < value.size()) {
      return Invalid(what, value, "has no ':' after the ']'", kValidForm);
    }
  }
  if (colon == absl::string_view::npos) return Invalid(what, value, "has no port", kValidForm);
  const absl::string_view host = value.substr(0, colon), digits = value.substr(colon + 1);
  if (std::optional<std::string> bad = HostProblem(host)) {
    return Invalid(what, value, *bad, kValidForm);
  }
  if (digits.empty()) return Invalid(what, value, "has no port after the ':'", kValidForm);
  for (char c : digits) {
    if (!absl::ascii_isdigit(c)) {
      return Invalid(what, value, absl::StrCat("has port '", ShownValue(digits), "': no number"),
                     kValidForm);
    }
  }
  uint32_t port = 0;
  if (digits.size() > 5 || !absl::SimpleAtoi(digits, &port) || port < 1 || port > 65535) {
    return Invalid(what, value, absl::StrCat("has port ", ShownValue(digits), ", outside 1-65535"),
                   kValidForm);
  }
  return HostPort{std::string(host), static_cast<uint16_t>(port)};
}

absl::Status CheckHostPort(absl::string_view value, absl::string_view what) {
  return ParseHostPort(value, what).status();
}

absl::Status CheckLabel(absl::string_view value, absl::string_view what, size_t max_length) {
  if (value.size() > max_length) {
    return Invalid(what, value, absl::StrCat("is longer than ", max_length, " bytes"),
                   "; it only names the member to operators");
  }
  if (std::optional<std::string> bad = Unprintable(value)) {
    return Invalid(what, value, *bad, "; give printable ASCII without spaces");
  }
  return absl::OkStatus();
}

}  // namespace pscluster
