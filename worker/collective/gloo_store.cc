#include "worker/collective/gloo_store.h"

#include <stdexcept>

#include "absl/strings/str_cat.h"

namespace pscluster::collective {
namespace {

// "timed out" is what Gloo's callers read as a timeout (gloo_communicator.cc's Guard).
[[noreturn]] void Throw(const char* op, const std::string& key, const absl::Status& s) {
  throw std::runtime_error(absl::StrCat(
      "rendezvous ", op, " ", key,
      s.code() == absl::StatusCode::kDeadlineExceeded ? " timed out: " : ": ", s.ToString()));
}

}  // namespace

void GlooStore::set(const std::string& key, const std::vector<char>& data) {
  absl::Status s = rendezvous_->Put(prefix_ + key, std::string(data.begin(), data.end()));
  if (!s.ok()) Throw("set", prefix_ + key, s);
}

std::vector<char> GlooStore::get(const std::string& key) {
  absl::StatusOr<std::string> value = rendezvous_->WaitGet(prefix_ + key, timeout_);
  if (!value.ok()) Throw("get", prefix_ + key, value.status());
  return std::vector<char>(value->begin(), value->end());
}

void GlooStore::wait(const std::vector<std::string>& keys,
                     const std::chrono::milliseconds& timeout) {
  for (const std::string& key : keys) {
    absl::StatusOr<std::string> value =
        rendezvous_->WaitGet(prefix_ + key, absl::FromChrono(timeout));
    if (!value.ok()) Throw("wait", prefix_ + key, value.status());
  }
}

}  // namespace pscluster::collective
