// The request-handler fuzzers' inputs and their loop. An input is a sequence of calls, each
// one byte naming the method (taken modulo the number of methods) and a length-prefixed
// request (u16 little-endian length, then that many bytes: the serialized request
// message). Anything after the last whole call is ignored. fuzz/make_seeds.cc writes
// inputs this way.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "grpcpp/support/status.h"

namespace pscluster::fuzz {

class CallReader {
 public:
  CallReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  // The next call's method byte and request bytes; false at the end.
  bool Next(uint8_t* method, std::string* request) {
    if (size_ - at_ < 3) return false;
    *method = data_[at_];
    const size_t n = std::min<size_t>(data_[at_ + 1] | data_[at_ + 2] << 8, size_ - at_ - 3);
    request->assign(reinterpret_cast<const char*>(data_ + at_ + 3), n);
    at_ += 3 + n;
    return true;
  }

 private:
  const uint8_t* const data_;
  const size_t size_;
  size_t at_ = 0;
};

inline void AppendCall(std::string* out, uint8_t method, const std::string& request) {
  const size_t n = std::min<size_t>(request.size(), 0xffff);
  out->push_back(static_cast<char>(method));
  out->push_back(static_cast<char>(n & 0xff));
  out->push_back(static_cast<char>(n >> 8));
  out->append(request, 0, n);
}

// One method of a handler fuzzer: `call` parses the request and calls the handler on the
// target, false when the bytes do not parse (gRPC would refuse them before any handler).
template <typename Target>
struct Method {
  const char* name;
  std::function<bool(Target*, const std::string&, grpc::Status*)> call;
  bool checked = true;  // a failure of it must leave state(target) as it was
};

// Runs the calls of an input (at most 64) on `target`; aborts, naming the call, when one
// that failed changed `state(target)` (a failed operation must change nothing).
template <typename Target, typename State>
void RunCalls(const uint8_t* data, size_t size, const std::vector<Method<Target>>& methods,
              Target* target, State state) {
  CallReader calls(data, size);
  uint8_t m;
  std::string request;
  for (int n = 0; n < 64 && calls.Next(&m, &request); ++n) {
    const Method<Target>& method = methods[m % methods.size()];
    decltype(state(target)) before{};
    if (method.checked) before = state(target);
    grpc::Status status;
    if (!method.call(target, request, &status)) continue;
    if (method.checked && !status.ok() && state(target) != before) {
      std::fprintf(stderr, "%s failed (%d: %s) but changed the state\n", method.name,
                   static_cast<int>(status.error_code()), status.error_message().c_str());
      std::abort();
    }
  }
}

}  // namespace pscluster::fuzz
