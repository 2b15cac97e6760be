// This machine's host name (a container's own, under Docker or Kubernetes).
#pragma once

#include <unistd.h>

#include <string>

namespace pscluster {

// "" when the system does not say.
inline std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "";
  return name;
}

}  // namespace pscluster
