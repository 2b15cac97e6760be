// A member's link to the coordinator: registers, heartbeats on a background thread for
// as long as it lives, reads the cluster view, reports progress, and uses the rendezvous
// store. Every RPC has a deadline. Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "proto/coordinator.grpc.pb.h"

namespace pscluster {

struct CoordinatorClientOptions {
  std::string coordinator;  // host:port
  coord::Role role = coord::WORKER;
  int32_t id = 0;       // shard id or worker rank
  std::string address;  // where this member serves ("" for none)
  absl::Duration rpc_timeout = absl::Seconds(10);
  absl::Duration register_timeout = absl::Minutes(1);  // waits for the coordinator to start
  // At most this; shortened to a quarter of the coordinator's heartbeat timeout.
  absl::Duration heartbeat_interval = absl::Seconds(1);
};

class CoordinatorClient {
 public:
  static absl::StatusOr<std::unique_ptr<CoordinatorClient>> Register(
      CoordinatorClientOptions options);
  ~CoordinatorClient();  // stops heartbeating
  CoordinatorClient(const CoordinatorClient&) = delete;
  CoordinatorClient& operator=(const CoordinatorClient&) = delete;

  int64_t incarnation() const { return incarnation_; }
  const coord::ClusterView& registered_view() const { return registered_view_; }

  absl::StatusOr<coord::ClusterView> AwaitView(int64_t min_version, bool complete,
                                               absl::Duration timeout);
  // `metric` (optional): a validation metric measured at `step`.
  absl::Status ReportProgress(int64_t view_version, int64_t step, double loss,
                              double samples_per_sec, std::optional<double> metric = std::nullopt);
  absl::Status KvPut(const std::string& key, const std::string& value);
  absl::StatusOr<std::string> KvGet(const std::string& key, bool wait, absl::Duration timeout);

 private:
  CoordinatorClient(CoordinatorClientOptions options,
                    std::unique_ptr<coord::Coordinator::Stub> stub);
  void HeartbeatLoop();

  CoordinatorClientOptions options_;
  std::unique_ptr<coord::Coordinator::Stub> stub_;
  int64_t incarnation_ = 0;
  coord::ClusterView registered_view_;
  absl::Notification stop_;
  std::thread heartbeats_;
};

}  // namespace pscluster
