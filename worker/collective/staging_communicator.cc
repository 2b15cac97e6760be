#include "worker/collective/staging_communicator.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pscluster::collective {
namespace {

class StagingCommunicator final : public Communicator {
 public:
  StagingCommunicator(std::unique_ptr<Communicator> inner,
                      std::unique_ptr<compute::Backend> backend)
      : inner_(std::move(inner)), backend_(std::move(backend)) {}
  ~StagingCommunicator() override {
    for (Staged& s : staged_) backend_->Free(s.data);
  }

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }

  absl::Status AllReduceSum(absl::Span<float> data) override {
    ASSIGN_OR_RETURN(absl::Span<float> d, In(0, data));
    RETURN_IF_ERROR(inner_->AllReduceSum(d));
    return Out(d, data);
  }
  absl::Status ReduceScatterSum(absl::Span<const float> in, absl::Span<float> out) override {
    ASSIGN_OR_RETURN(absl::Span<float> d_in, In(0, in));
    ASSIGN_OR_RETURN(absl::Span<float> d_out, Buffer(1, out.size()));
    RETURN_IF_ERROR(inner_->ReduceScatterSum(d_in, d_out));
    return Out(d_out, out);
  }
  absl::Status AllGather(absl::Span<const float> in, absl::Span<float> out) override {
    ASSIGN_OR_RETURN(absl::Span<float> d_in, In(0, in));
    ASSIGN_OR_RETURN(absl::Span<float> d_out, Buffer(1, out.size()));
    RETURN_IF_ERROR(inner_->AllGather(d_in, d_out));
    return Out(d_out, out);
  }
  absl::Status Broadcast(absl::Span<float> data, int root) override {
    ASSIGN_OR_RETURN(absl::Span<float> d, In(0, data));
    RETURN_IF_ERROR(inner_->Broadcast(d, root));
    return Out(d, data);
  }
  absl::Status Send(absl::Span<const float> data, int peer, int tag) override {
    ASSIGN_OR_RETURN(absl::Span<float> d, In(0, data));
    return inner_->Send(d, peer, tag);
  }
  absl::Status Recv(absl::Span<float> data, int peer, int tag) override {
    ASSIGN_OR_RETURN(absl::Span<float> d, Buffer(0, data.size()));
    RETURN_IF_ERROR(inner_->Recv(d, peer, tag));
    return Out(d, data);
  }
  absl::Status SendRecv(absl::Span<const float> out, int to, int send_tag, absl::Span<float> in,
                        int from, int recv_tag) override {
    ASSIGN_OR_RETURN(absl::Span<float> d_out, In(0, out));
    ASSIGN_OR_RETURN(absl::Span<float> d_in, Buffer(1, in.size()));
    RETURN_IF_ERROR(inner_->SendRecv(d_out, to, send_tag, d_in, from, recv_tag));
    return Out(d_in, in);
  }
  absl::Status Barrier() override { return inner_->Barrier(); }

 private:
  struct Staged {
    float* data = nullptr;
    size_t capacity = 0;
  };

  // Staging buffer `which` (0 or 1) with room for n floats.
  absl::StatusOr<absl::Span<float>> Buffer(int which, size_t n) {
    Staged& s = staged_[which];
    if (s.capacity < n) {
      backend_->Free(s.data);
      s.data = backend_->Alloc(n);
      s.capacity = s.data == nullptr ? 0 : n;
      if (s.data == nullptr) {
        return absl::ResourceExhaustedError(
            absl::StrCat("could not allocate ", n, " floats of staging on ", backend_->name()));
      }
    }
    return absl::MakeSpan(s.data, n);
  }
  // `host` copied into staging buffer `which`.
  absl::StatusOr<absl::Span<float>> In(int which, absl::Span<const float> host) {
    ASSIGN_OR_RETURN(absl::Span<float> d, Buffer(which, host.size()));
    if (!host.empty()) backend_->Upload(host.data(), d.data(), host.size());
    return d;
  }
  absl::Status Out(absl::Span<float> staged, absl::Span<float> host) {
    if (!host.empty()) backend_->Download(staged.data(), host.data(), host.size());
    return absl::OkStatus();
  }

  std::unique_ptr<Communicator> inner_;
  std::unique_ptr<compute::Backend> backend_;
  Staged staged_[2];
};

}  // namespace

std::unique_ptr<Communicator> MakeStagingCommunicator(std::unique_ptr<Communicator> inner,
                                                      std::unique_ptr<compute::Backend> backend) {
  return std::make_unique<StagingCommunicator>(std::move(inner), std::move(backend));
}

}  // namespace pscluster::collective
