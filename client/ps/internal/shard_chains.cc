#include "client/ps/internal/shard_chains.h"

namespace pscluster::internal {

ShardChains::ShardChains(const std::vector<std::vector<std::string>>& chains,
                         const Security& security, int max_message_bytes)
    : security_(security) {
  args_.SetMaxReceiveMessageSize(max_message_bytes);
  args_.SetMaxSendMessageSize(max_message_bytes);
  absl::MutexLock lock(&mu_);
  for (const std::vector<std::string>& chain : chains) {
    shards_.push_back(Shard{chain});
    for (const std::string& address : chain) ConnectLocked(address);
  }
}

void ShardChains::ConnectLocked(const std::string& address) {
  if (replicas_.count(address) != 0) return;
  std::shared_ptr<grpc::Channel> channel = security_.Channel(address, args_);
  replicas_[address] =
      Replica{ShardStub::New(channel), std::make_unique<grpc::GenericStub>(channel)};
}

const ShardChains::Replica& ShardChains::CurrentLocked(int shard) const {
  const Shard& s = shards_[shard];
  return replicas_.at(s.chain[s.current]);
}

ShardStub* ShardChains::stub(int shard) const {
  absl::ReaderMutexLock lock(&mu_);
  return CurrentLocked(shard).stub.get();
}

grpc::GenericStub* ShardChains::generic(int shard) const {
  absl::ReaderMutexLock lock(&mu_);
  return CurrentLocked(shard).generic.get();
}

std::string ShardChains::address(int shard) const {
  absl::ReaderMutexLock lock(&mu_);
  const Shard& s = shards_[shard];
  return s.chain[s.current];
}

uint64_t ShardChains::moves(int shard) const {
  absl::ReaderMutexLock lock(&mu_);
  return shards_[shard].moves;
}

std::string ShardChains::Rotate(int shard, uint64_t seen) {
  absl::MutexLock lock(&mu_);
  Shard& s = shards_[shard];
  if (s.moves == seen) {
    s.current = (s.current + 1) % s.chain.size();
    ++s.moves;
  }
  return s.chain[s.current];
}

bool ShardChains::Install(int shard, const std::vector<std::string>& chain) {
  absl::MutexLock lock(&mu_);
  Shard& s = shards_[shard];
  if (chain.empty() || chain == s.chain) return false;
  for (const std::string& address : chain) ConnectLocked(address);
  s.chain = chain;
  s.current = 0;
  ++s.moves;
  return true;
}

}  // namespace pscluster::internal
