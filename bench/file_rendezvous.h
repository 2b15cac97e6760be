// A rendezvous (worker/collective/rendezvous.h) in a folder, for ranks that are processes
// forked by one benchmark: a key is a file, written whole by a rename, and waited for by
// polling. Not for a cluster, whose ranks meet at the coordinator.
#pragma once

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "worker/collective/rendezvous.h"

namespace pscluster::bench {

class FileRendezvous final : public collective::Rendezvous {
 public:
  explicit FileRendezvous(std::string dir) : dir_(std::move(dir)) {}

  absl::Status Put(const std::string& key, const std::string& value) override {
    const std::string path = PathOf(key), tmp = absl::StrCat(path, ".tmp");
    std::ofstream(tmp, std::ios::binary) << value;
    std::error_code ec;
    std::filesystem::rename(tmp, path, ec);
    return ec ? absl::InternalError(absl::StrCat("rendezvous put ", path, ": ", ec.message()))
              : absl::OkStatus();
  }
  absl::StatusOr<std::string> WaitGet(const std::string& key, absl::Duration timeout) override {
    const std::string path = PathOf(key);
    for (const absl::Time give_up = absl::Now() + timeout; !std::filesystem::exists(path);) {
      if (absl::Now() >= give_up) {
        return absl::DeadlineExceededError(absl::StrCat("rendezvous: no ", path));
      }
      absl::SleepFor(absl::Milliseconds(1));
    }
    std::ostringstream value;
    value << std::ifstream(path, std::ios::binary).rdbuf();
    return value.str();
  }

 private:
  std::string PathOf(const std::string& key) const {
    return absl::StrCat(dir_, "/", absl::StrReplaceAll(key, {{"%", "%25"}, {"/", "%2F"}}));
  }
  const std::string dir_;
};

}  // namespace pscluster::bench
