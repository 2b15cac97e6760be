// Tests of the HTTP endpoints under slowloris: connections that send half a request head
// and then nothing, and whether the server has closed them yet.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <vector>

namespace pscluster::testing {

// `n` connections to 127.0.0.1:port, each holding half a request head.
inline std::vector<int> OpenHalfRequests(int port, int n) {
  std::vector<int> fds;
  const std::string half = "GET /metrics HTTP/1.1\r\nHost: localhost\r\n";
  for (int i = 0; i < n; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
        write(fd, half.data(), half.size()) == static_cast<ssize_t>(half.size())) {
      fds.push_back(fd);
    } else {
      close(fd);
    }
  }
  return fds;
}

// Whether the server has neither closed nor answered the connection yet.
inline bool StillOpen(int fd) {
  char c;
  return recv(fd, &c, 1, MSG_DONTWAIT | MSG_PEEK) < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

}  // namespace pscluster::testing
