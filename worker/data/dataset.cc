#include "worker/data/dataset.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace pscluster::data {
namespace {

constexpr uint32_t kImagesMagic = 0x00000803;
constexpr uint32_t kLabelsMagic = 0x00000801;
// Bytes read per gzread call; the buffer grows only as data actually arrives, so a
// header claiming a huge count cannot make us allocate more than the file holds.
constexpr size_t kChunk = size_t{1} << 20;

// Owns a gzFile.
class GzReader {
 public:
  static absl::StatusOr<GzReader> Open(const std::string& path) {
    errno = 0;
    gzFile f = gzopen(path.c_str(), "rb");
    if (f == nullptr) {
      const int err = errno;
      if (err == ENOENT) {
        return absl::NotFoundError(absl::StrCat(path,
                                                ": no such file; install it with `apt-get install "
                                                "dataset-fashion-mnist` or pass --dataset_dir"));
      }
      return absl::FailedPreconditionError(
          absl::StrCat(path, ": cannot open: ", err != 0 ? std::strerror(err) : "gzopen failed"));
    }
    return GzReader(path, f);
  }

  GzReader(GzReader&& o) noexcept : path_(std::move(o.path_)), f_(o.f_) { o.f_ = nullptr; }
  GzReader& operator=(GzReader&&) = delete;
  ~GzReader() {
    if (f_ != nullptr) gzclose(f_);
  }

  // Appends exactly n bytes to *out; DATA_LOSS naming the file (and `what`) if the stream
  // ends early or is corrupt.
  absl::Status ReadExactly(size_t n, const char* what, std::vector<uint8_t>* out) {
    const size_t start = out->size();
    size_t got = 0;
    while (got < n) {
      const size_t want = std::min(kChunk, n - got);
      out->resize(start + got + want);
      const int r = gzread(f_, out->data() + start + got, static_cast<unsigned>(want));
      if (r < 0) {
        int errnum = 0;
        const char* msg = gzerror(f_, &errnum);
        return absl::DataLossError(
            absl::StrCat(path_, ": corrupt gzip stream reading ", what, ": ", msg));
      }
      got += static_cast<size_t>(r);
      if (static_cast<size_t>(r) < want) {
        out->resize(start + got);
        return absl::DataLossError(
            absl::StrCat(path_, ": truncated ", what, ": expected ", n, " bytes, got ", got));
      }
    }
    return absl::OkStatus();
  }

  const std::string& path() const { return path_; }

 private:
  GzReader(std::string path, gzFile f) : path_(std::move(path)), f_(f) {}

  std::string path_;
  gzFile f_;
};

uint32_t BigEndian32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

struct RawImages {
  int64_t count = 0;
  int rows = 0;
  int cols = 0;
  std::vector<uint8_t> pixels;
};

absl::StatusOr<RawImages> ReadImages(const std::string& path) {
  ASSIGN_OR_RETURN(GzReader in, GzReader::Open(path));
  std::vector<uint8_t> header;
  RETURN_IF_ERROR(in.ReadExactly(16, "images header", &header));
  const uint32_t magic = BigEndian32(header.data());
  if (magic != kImagesMagic) {
    return absl::DataLossError(absl::StrCat(path, ": bad magic 0x", absl::Hex(magic), ", want 0x",
                                            absl::Hex(kImagesMagic)));
  }
  RawImages images;
  images.count = BigEndian32(header.data() + 4);
  const uint32_t rows = BigEndian32(header.data() + 8);
  const uint32_t cols = BigEndian32(header.data() + 12);
  if (rows == 0 || cols == 0 || rows > 65536 || cols > 65536 ||
      uint64_t{rows} * cols > static_cast<uint64_t>(std::numeric_limits<int>::max())) {
    return absl::DataLossError(absl::StrCat(path, ": implausible image shape ", rows, "x", cols));
  }
  images.rows = static_cast<int>(rows);
  images.cols = static_cast<int>(cols);
  const uint64_t bytes = static_cast<uint64_t>(images.count) * rows * cols;
  RETURN_IF_ERROR(in.ReadExactly(bytes, "images", &images.pixels));
  return images;
}

absl::StatusOr<std::vector<uint8_t>> ReadLabels(const std::string& path) {
  ASSIGN_OR_RETURN(GzReader in, GzReader::Open(path));
  std::vector<uint8_t> header;
  RETURN_IF_ERROR(in.ReadExactly(8, "labels header", &header));
  const uint32_t magic = BigEndian32(header.data());
  if (magic != kLabelsMagic) {
    return absl::DataLossError(absl::StrCat(path, ": bad magic 0x", absl::Hex(magic), ", want 0x",
                                            absl::Hex(kLabelsMagic)));
  }
  const uint32_t count = BigEndian32(header.data() + 4);
  std::vector<uint8_t> labels;
  RETURN_IF_ERROR(in.ReadExactly(count, "labels", &labels));
  for (size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] >= kFashionMnistClasses) {
      return absl::DataLossError(absl::StrCat(path, ": label ", labels[i], " at index ", i,
                                              " is outside [0, ", kFashionMnistClasses, ")"));
    }
  }
  return labels;
}

// SplitMix64: a small, well-mixed generator whose output is fixed by its definition.
uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Standard normal samples by Box-Muller from a std::mt19937_64 (whose output the
// standard fixes, unlike std::normal_distribution's).
class Gaussian {
 public:
  explicit Gaussian(uint64_t seed) : rng_(seed) {}
  double Next() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    // u1 in (0, 1], u2 in [0, 1), from the top 53 bits.
    const double u1 = (static_cast<double>(rng_() >> 11) + 1.0) * 0x1.0p-53;
    const double u2 = static_cast<double>(rng_() >> 11) * 0x1.0p-53;
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double theta = 2.0 * M_PI * u2;
    spare_ = r * std::sin(theta);
    has_spare_ = true;
    return r * std::cos(theta);
  }

 private:
  std::mt19937_64 rng_;
  double spare_ = 0;
  bool has_spare_ = false;
};

}  // namespace

absl::StatusOr<Dataset> LoadFashionMnist(const std::string& dir, Split split) {
  const std::string prefix = split == Split::kTrain ? "train" : "t10k";
  const std::string images_path = absl::StrCat(dir, "/", prefix, "-images-idx3-ubyte.gz");
  const std::string labels_path = absl::StrCat(dir, "/", prefix, "-labels-idx1-ubyte.gz");
  ASSIGN_OR_RETURN(RawImages images, ReadImages(images_path));
  ASSIGN_OR_RETURN(std::vector<uint8_t> labels, ReadLabels(labels_path));
  if (static_cast<int64_t>(labels.size()) != images.count) {
    return absl::DataLossError(absl::StrCat(images_path, " has ", images.count, " images but ",
                                            labels_path, " has ", labels.size(), " labels"));
  }

  Dataset d;
  d.size = images.count;
  d.dim = images.rows * images.cols;
  d.classes = kFashionMnistClasses;
  // A byte has 256 values: normalise each once.
  float lut[256];
  for (int p = 0; p < 256; ++p) {
    lut[p] = (static_cast<float>(p) / 255.0f - kFashionMnistMean) / kFashionMnistStd;
  }
  d.x.resize(images.pixels.size());
  for (size_t i = 0; i < images.pixels.size(); ++i) d.x[i] = lut[images.pixels[i]];
  d.y.assign(labels.begin(), labels.end());
  return d;
}

Dataset MakeSynthetic(int64_t size, int dim, int classes, uint64_t seed, float noise) {
  if (size < 0 || dim < 1 || classes < 1 || !(noise >= 0)) {
    LogWarning("MakeSynthetic: bad arguments size=%lld dim=%d classes=%d noise=%g",
               static_cast<long long>(size), dim, classes, noise);
    std::abort();
  }
  // Centroids and noise come from independent streams derived from `seed`.
  uint64_t state = seed;
  Gaussian centroid_rng(SplitMix64(&state));
  Gaussian noise_rng(SplitMix64(&state));

  std::vector<float> centroids(static_cast<size_t>(classes) * dim);
  for (float& c : centroids) c = static_cast<float>(centroid_rng.Next());

  Dataset d;
  d.size = size;
  d.dim = dim;
  d.classes = classes;
  d.x.resize(static_cast<size_t>(size) * dim);
  d.y.resize(static_cast<size_t>(size));
  for (int64_t i = 0; i < size; ++i) {
    const int32_t label = static_cast<int32_t>(i % classes);
    d.y[i] = label;
    const float* c = centroids.data() + static_cast<size_t>(label) * dim;
    float* row = d.x.data() + static_cast<size_t>(i) * dim;
    for (int j = 0; j < dim; ++j) {
      row[j] = c[j] + noise * static_cast<float>(noise_rng.Next());
    }
  }
  return d;
}

}  // namespace pscluster::data
