// In-memory datasets for workers: Fashion-MNIST read from Debian's dataset-fashion-mnist
// package, a synthetic, learnable source for tests, and byte-level text (text.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pscluster::data {

// A dense labelled dataset held in memory. A plain value: safe to read from many
// threads at once, not to mutate concurrently.
struct Dataset {
  int64_t size = 0;  // examples
  int dim = 0;       // floats per example
  int classes = 0;
  int label_width = 1;     // labels per example (a language model: one per position)
  std::vector<float> x;    // size * dim, row-major
  std::vector<int32_t> y;  // size * label_width labels in [0, classes), row-major
};

enum class Split { kTrain, kTest };

inline constexpr char kDefaultFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";

// Fashion-MNIST training-set pixel statistics (after scaling to [0, 1]); both splits are
// normalised with these so that train and test see the same transform.
inline constexpr float kFashionMnistMean = 0.2860f;
inline constexpr float kFashionMnistStd = 0.3530f;
inline constexpr int kFashionMnistClasses = 10;

// Reads the IDX .gz pair of `split` from `dir` (train-{images-idx3,labels-idx1}-ubyte.gz
// or t10k-...), scales pixels to [0, 1] and normalises them with kFashionMnistMean and
// kFashionMnistStd. Errors name the file: NOT_FOUND for a missing file (with an install
// hint), DATA_LOSS for a bad magic or header, truncated or corrupt data, a label outside
// [0, 10) or image/label counts that differ. Thread-safe (no shared state).
absl::StatusOr<Dataset> LoadFashionMnist(const std::string& dir, Split split);

// Tests only: `size` examples of `dim` floats in `classes` classes that an MLP can learn.
// Each class has a fixed centroid with N(0, 1) coordinates drawn from `seed`; example i
// has label i % classes and is its class centroid + N(0, noise^2) per coordinate.
// Deterministic in all arguments (and across standard libraries: no std distributions).
// Requires size >= 0, dim >= 1, classes >= 1, noise >= 0; aborts otherwise.
Dataset MakeSynthetic(int64_t size, int dim, int classes, uint64_t seed, float noise = 0.5f);

}  // namespace pscluster::data
