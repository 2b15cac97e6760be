// The encoding of the request-handler fuzzers' inputs: a sequence of calls, each one byte
// naming the method (taken modulo the number of methods) and a length-prefixed request
// (u16 little-endian length, then that many bytes: the serialized request message).
// Anything after the last whole call is ignored. fuzz/make_seeds.cc writes inputs this way.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

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

}  // namespace pscluster::fuzz
