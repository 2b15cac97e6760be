// A fixture with kShards real ps_server processes on free loopback ports and kWorkers
// registered PsClients. Each test gets fresh servers; TearDown checks they exit cleanly on
// SIGTERM.
#pragma once

#include <signal.h>
#include <sys/wait.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/ps/ps_client.h"
#include "gtest/gtest.h"
#include "tests/subprocess.h"

namespace pscluster {

constexpr int kShards = 2;
constexpr int kWorkers = 2;
constexpr int kSteps = 4;

class PsClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StartServers(kShards, ServerArgs());
    if (!HasFatalFailure()) ConnectClients();
  }

  void TearDown() override { StopServers(SIGTERM); }

  // Extra ps_server flags for every server SetUp starts.
  virtual std::vector<std::string> ServerArgs() { return {}; }
  // How ConnectClients' clients call the servers (default: plaintext).
  virtual Security ClientSecurity() { return Security(); }

  // Starts `num_shards` ps_server processes on free ports; `extra` flags for each.
  void StartServers(int num_shards, const std::vector<std::string>& extra) {
    addresses_.clear();
    for (int s = 0; s < num_shards; ++s) {
      std::vector<std::string> argv = {"server/ps/ps_server", "--port=0",
                                       absl::StrCat("--shard_id=", s),
                                       absl::StrCat("--num_shards=", num_shards)};
      argv.insert(argv.end(), extra.begin(), extra.end());
      auto p = testing::Subprocess::Start(argv);
      ASSERT_TRUE(p.ok()) << p.status();
      auto line = p->WaitForLine("listening on", absl::Seconds(60));
      ASSERT_TRUE(line.ok()) << line.status();
      addresses_.push_back(*testing::ListeningAddress(*line));
      servers_.push_back(*std::move(p));
    }
  }

  // SIGTERM: each must exit 0. SIGKILL: a crash.
  void StopServers(int sig) {
    clients_.clear();
    for (auto& s : servers_) {
      auto status = s.Stop(sig, absl::Seconds(20));
      ASSERT_TRUE(status.ok()) << status.status();
      if (sig == SIGTERM) {
        EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
            << s.name() << " did not exit cleanly on SIGTERM: wait status " << *status;
      }
    }
    servers_.clear();
  }

  // (Re)creates kWorkers registered clients for the running servers.
  void ConnectClients() {
    clients_.clear();
    for (int w = 0; w < kWorkers; ++w) {
      PsClientOptions o;
      o.shard_addresses = addresses_;
      o.worker_id = w;
      o.rpc_timeout = absl::Seconds(60);
      o.chunk_bytes = 64 << 10;  // many chunks per shard for the larger tables
      o.security = ClientSecurity();
      auto c = PsClient::Create(o);
      ASSERT_TRUE(c.ok()) << c.status();
      ASSERT_TRUE((*c)->RegisterWorker().ok());
      clients_.push_back(*std::move(c));
    }
  }

  // Runs fn(worker) on every worker concurrently.
  void OnAllWorkers(const std::function<void(int)>& fn) {
    std::vector<std::thread> threads;
    for (int w = 0; w < kWorkers; ++w) threads.emplace_back(fn, w);
    for (auto& t : threads) t.join();
  }

  std::vector<std::string> addresses_;
  std::vector<testing::Subprocess> servers_;
  std::vector<std::unique_ptr<PsClient>> clients_;
};

}  // namespace pscluster
