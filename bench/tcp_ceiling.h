// The ceilings' plain loopback TCP (bench/ps_throughput, bench/grpc_server_modes): the same
// bytes as a parameter-server call moves, with no RPC system.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "common/sharding.h"

namespace pscluster::bench {

// fn(s, range of shard s) for each of n shards of `size` values, in parallel, as the
// client splits a tensor (the ceilings' clients).
template <typename Fn>
void OnEachShard(int n, uint64_t size, Fn fn) {
  std::vector<std::thread> threads;
  for (int s = 1; s < n; ++s) threads.emplace_back([&, s] { fn(s, DenseShardRange(size, s, n)); });
  fn(0, DenseShardRange(size, 0, n));
  for (auto& t : threads) t.join();
}

// The physical ceiling: the same bytes over plain loopback TCP, split across as many
// servers in parallel, no framing and no copies but the kernel's. A push sends an 8-byte
// length and the bytes, and waits for a 1-byte acknowledgement sent once the server has
// read them all (into one reused 1 MiB buffer, dropped); a pull sends the length with the
// top bit set and reads that many bytes back (written from a preallocated buffer).
inline bool WriteAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k <= 0) return false;
    p += k, n -= k;
  }
  return true;
}
inline bool ReadAll(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t k = ::recv(fd, p, n, 0);
    if (k <= 0) return false;
    p += k, n -= k;
  }
  return true;
}
constexpr uint64_t kTcpPull = uint64_t{1} << 63;

class TcpServer {
 public:
  TcpServer() {
    listen_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (::bind(listen_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
        ::listen(listen_, 1) != 0 ||
        ::getsockname(listen_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      std::perror("ps_throughput: TCP ceiling server");
      std::exit(1);
    }
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { Serve(); });
  }
  ~TcpServer() {
    ::shutdown(listen_, SHUT_RDWR);  // ends an accept still waiting
    thread_.join();
    ::close(listen_);
  }
  int port() const { return port_; }

 private:
  void Serve() {
    int fd = ::accept(listen_, nullptr, nullptr);
    if (fd < 0) return;
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    std::vector<char> buffer(1 << 20), source;
    for (uint64_t header; ReadAll(fd, &header, sizeof(header));) {
      const uint64_t n = header & ~kTcpPull;
      if (header & kTcpPull) {
        if (source.size() < n) source.resize(n, 1);
        if (!WriteAll(fd, source.data(), n)) break;
        continue;
      }
      bool ok = true;
      for (uint64_t done = 0; ok && done < n; done += buffer.size()) {
        ok = ReadAll(fd, buffer.data(), std::min<uint64_t>(buffer.size(), n - done));
      }
      const char ack = 1;
      if (!ok || !WriteAll(fd, &ack, 1)) break;
    }
    ::close(fd);
  }
  int listen_ = -1, port_ = 0;
  std::thread thread_;
};

class TcpClient {
 public:
  explicit TcpClient(const std::vector<std::unique_ptr<TcpServer>>& servers) {
    for (const auto& server : servers) {
      int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a.sin_port = htons(server->port());
      if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
        std::perror("ps_throughput: TCP ceiling client");
        std::exit(1);
      }
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      fds_.push_back(fd);
    }
  }
  ~TcpClient() {
    for (int fd : fds_) ::close(fd);
  }
  void Push(const std::vector<float>& data) {
    OnShards(data.size(), [&](int s, Range r) {
      const uint64_t n = r.size() * sizeof(float);
      char ack;
      if (!WriteAll(fds_[s], &n, sizeof(n)) || !WriteAll(fds_[s], data.data() + r.begin, n) ||
          !ReadAll(fds_[s], &ack, 1)) {
        std::abort();
      }
    });
  }
  void Pull(std::vector<float>* out) {
    OnShards(out->size(), [&](int s, Range r) {
      const uint64_t header = r.size() * sizeof(float) | kTcpPull;
      if (!WriteAll(fds_[s], &header, sizeof(header)) ||
          !ReadAll(fds_[s], out->data() + r.begin, r.size() * sizeof(float))) {
        std::abort();
      }
    });
  }

 private:
  template <typename Fn>
  void OnShards(uint64_t size, Fn fn) {
    OnEachShard(static_cast<int>(fds_.size()), size, fn);
  }
  std::vector<int> fds_;
};
}  // namespace pscluster::bench
