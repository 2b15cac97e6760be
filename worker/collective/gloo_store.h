// Gloo's view of a Rendezvous (rendezvous.h): its Store interface, with every key under a
// prefix. Gloo's stores report failures by exception, so this one does too; Gloo's
// callers turn them into statuses (gloo_communicator.cc's Guard).
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gloo/rendezvous/store.h"
#include "worker/collective/rendezvous.h"

namespace pscluster::collective {

class GlooStore final : public gloo::rendezvous::Store {
 public:
  // `rendezvous` must outlive the store; `timeout`: of a get, and of a wait given none.
  GlooStore(Rendezvous* rendezvous, std::string prefix, absl::Duration timeout)
      : rendezvous_(rendezvous), prefix_(std::move(prefix)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override {
    wait(keys, absl::ToChronoMilliseconds(timeout_));
  }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  Rendezvous* const rendezvous_;
  const std::string prefix_;
  const absl::Duration timeout_;
};

}  // namespace pscluster::collective
