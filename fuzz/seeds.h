// What the seed writers of make_seeds share (make_seeds.cc says what they write).
#pragma once

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "fuzz/fuzz_input.h"
#include "google/protobuf/message.h"
#include "proto/ps.pb.h"

namespace pscluster::fuzz::seeds {

namespace fs = std::filesystem;

inline void Write(const fs::path& path, const std::string& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  std::printf("%s (%zu bytes)\n", path.c_str(), bytes.size());
}

inline std::string Bytes(const google::protobuf::Message& m) { return m.SerializeAsString(); }

inline std::string Floats(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

inline pscluster::ps::TableSpec Dense(uint32_t id, pscluster::ps::ConsistencyConfig::Mode mode) {
  pscluster::ps::TableSpec t;
  t.set_table_id(id);
  t.set_name("w" + std::to_string(id));
  t.set_kind(pscluster::ps::TableSpec::DENSE);
  t.set_size(300);
  t.mutable_optimizer()->set_kind(pscluster::ps::OptimizerConfig::ADAM);
  t.mutable_optimizer()->set_learning_rate(0.01f);
  t.mutable_consistency()->set_mode(mode);
  t.mutable_initializer()->set_kind(pscluster::ps::InitializerConfig::UNIFORM);
  t.mutable_initializer()->set_scale(0.1f);
  return t;
}

inline pscluster::ps::TableSpec Sparse(uint32_t id) {
  pscluster::ps::TableSpec t;
  t.set_table_id(id);
  t.set_name("emb");
  t.set_kind(pscluster::ps::TableSpec::SPARSE);
  t.set_dim(4);
  t.mutable_optimizer()->set_kind(pscluster::ps::OptimizerConfig::ADAGRAD);
  t.mutable_optimizer()->set_learning_rate(0.1f);
  t.mutable_consistency()->set_mode(pscluster::ps::ConsistencyConfig::ASP);
  return t;
}

// The ps_service target's seeds (ps_seeds.cc) and the coordinator target's
// (coordinator_seeds.cc), under `out`.
void PsSeeds(const fs::path& out);
void CoordinatorSeeds(const fs::path& out);

}  // namespace pscluster::fuzz::seeds
