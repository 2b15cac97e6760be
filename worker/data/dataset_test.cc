#include "worker/data/dataset.h"

#include <zlib.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pscluster::data {
namespace {

using ::testing::HasSubstr;

constexpr int kRows = 2;
constexpr int kCols = 3;
constexpr int kCount = 5;

void PutBigEndian32(uint32_t v, std::vector<uint8_t>* out) {
  for (int shift = 24; shift >= 0; shift -= 8) out->push_back(static_cast<uint8_t>(v >> shift));
}

std::vector<uint8_t> ImagesFile(uint32_t magic, uint32_t count, uint32_t rows, uint32_t cols,
                                const std::vector<uint8_t>& pixels) {
  std::vector<uint8_t> bytes;
  PutBigEndian32(magic, &bytes);
  PutBigEndian32(count, &bytes);
  PutBigEndian32(rows, &bytes);
  PutBigEndian32(cols, &bytes);
  bytes.insert(bytes.end(), pixels.begin(), pixels.end());
  return bytes;
}

std::vector<uint8_t> LabelsFile(uint32_t magic, uint32_t count,
                                const std::vector<uint8_t>& labels) {
  std::vector<uint8_t> bytes;
  PutBigEndian32(magic, &bytes);
  PutBigEndian32(count, &bytes);
  bytes.insert(bytes.end(), labels.begin(), labels.end());
  return bytes;
}

// kCount images of kRows x kCols; pixel j of image i is distinct and spans 0..255.
std::vector<uint8_t> TestPixels() {
  std::vector<uint8_t> pixels(kCount * kRows * kCols);
  for (size_t k = 0; k < pixels.size(); ++k) pixels[k] = static_cast<uint8_t>(k * 255 / 29);
  return pixels;
}

const std::vector<uint8_t> kTestLabels = {3, 0, 9, 1, 3};

class FashionMnistFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::path(::testing::TempDir()) /
           (std::string(info->test_suite_name()) + "." + info->name());
    std::filesystem::remove_all(dir_);
    ASSERT_TRUE(std::filesystem::create_directories(dir_));
  }

  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  void WriteGz(const std::string& name, const std::vector<uint8_t>& bytes) {
    gzFile f = gzopen(Path(name).c_str(), "wb");
    ASSERT_NE(f, nullptr) << Path(name);
    if (!bytes.empty()) {
      ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())),
                static_cast<int>(bytes.size()));
    }
    ASSERT_EQ(gzclose(f), Z_OK);
  }

  // A valid 5-image train pair.
  void WriteValidTrain() {
    WriteGz("train-images-idx3-ubyte.gz", ImagesFile(0x803, kCount, kRows, kCols, TestPixels()));
    WriteGz("train-labels-idx1-ubyte.gz", LabelsFile(0x801, kCount, kTestLabels));
  }

  std::filesystem::path dir_;
};

TEST_F(FashionMnistFileTest, DecodesAndNormalisesPixelsAndLabels) {
  WriteValidTrain();
  absl::StatusOr<Dataset> d = LoadFashionMnist(dir_.string(), Split::kTrain);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->size, kCount);
  EXPECT_EQ(d->dim, kRows * kCols);
  EXPECT_EQ(d->classes, 10);
  EXPECT_EQ(d->y, std::vector<int32_t>(kTestLabels.begin(), kTestLabels.end()));
  const std::vector<uint8_t> pixels = TestPixels();
  ASSERT_EQ(d->x.size(), pixels.size());
  for (size_t k = 0; k < pixels.size(); ++k) {
    const double want = (pixels[k] / 255.0 - 0.2860) / 0.3530;
    EXPECT_NEAR(d->x[k], want, 1e-5) << "pixel " << k << " = " << int{pixels[k]};
  }
  // Hand-computed endpoints: 0 -> -0.286/0.353, 255 -> 0.714/0.353.
  EXPECT_NEAR(d->x.front(), -0.8101983, 1e-6);
  EXPECT_NEAR(d->x.back(), 2.0226629, 1e-6);
}

TEST_F(FashionMnistFileTest, TestSplitReadsTheT10kFiles) {
  WriteValidTrain();
  const std::vector<uint8_t> pixels(2 * 4, 255);
  WriteGz("t10k-images-idx3-ubyte.gz", ImagesFile(0x803, 2, 2, 2, pixels));
  WriteGz("t10k-labels-idx1-ubyte.gz", LabelsFile(0x801, 2, {7, 8}));
  absl::StatusOr<Dataset> d = LoadFashionMnist(dir_.string(), Split::kTest);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->size, 2);
  EXPECT_EQ(d->dim, 4);
  EXPECT_EQ(d->y, (std::vector<int32_t>{7, 8}));
  for (float v : d->x) EXPECT_NEAR(v, 2.0226629, 1e-6);
}

TEST_F(FashionMnistFileTest, MissingFileIsNotFoundWithInstallHint) {
  WriteGz("train-labels-idx1-ubyte.gz", LabelsFile(0x801, kCount, kTestLabels));
  absl::StatusOr<Dataset> d = LoadFashionMnist(dir_.string(), Split::kTrain);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(d.status().message(), HasSubstr(Path("train-images-idx3-ubyte.gz")));
  EXPECT_THAT(d.status().message(), HasSubstr("apt-get install dataset-fashion-mnist"));
  EXPECT_THAT(d.status().message(), HasSubstr("--dataset_dir"));
}

TEST_F(FashionMnistFileTest, MissingLabelsFileIsNotFound) {
  WriteGz("train-images-idx3-ubyte.gz", ImagesFile(0x803, kCount, kRows, kCols, TestPixels()));
  absl::StatusOr<Dataset> d = LoadFashionMnist(dir_.string(), Split::kTrain);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(d.status().message(), HasSubstr(Path("train-labels-idx1-ubyte.gz")));
}

TEST_F(FashionMnistFileTest, BadImagesMagicIsDataLoss) {
  WriteValidTrain();
  WriteGz("train-images-idx3-ubyte.gz", ImagesFile(0x801, kCount, kRows, kCols, TestPixels()));
  absl::StatusOr<Dataset> d = LoadFashionMnist(dir_.string(), Split::kTrain);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(d.status().message(), HasSubstr(Path("train-images-idx3-ubyte.gz")));
  EXPECT_THAT(d.status().message(), HasSubstr("magic"));
}

TEST_F(FashionMnistFileTest, BadLabelsMagicIsDataLoss) {
  WriteValidTrain();
  WriteGz("train-labels-idx1-ubyte.gz", LabelsFile(0x803, kCount, kTestLabels));
  absl::StatusOr<Dataset> d = LoadFashionMnist(dir_.string(), Split::kTrain);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(d.status().message(), HasSubstr(Path("train-labels-idx1-ubyte.gz")));
  EXPECT_THAT(d.status().message(), HasSubstr("magic"));
}

TEST_F(FashionMnistFileTest, TruncatedImagesAreDataLoss) {
  WriteValidTrain();
  std::vector<uint8_t> pixels = TestPixels();
  pixels.pop_back();
  WriteGz("train-images-idx3-ubyte.gz", ImagesFile(0x803, kCount, kRows, kCols, pixels));
  absl::StatusOr<Dataset> d = LoadFashionMnist(dir_.string(), Split::kTrain);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(d.status().message(), HasSubstr(Path("train-images-idx3-ubyte.gz")));
  EXPECT_THAT(d.status().message(), HasSubstr("truncated"));
}

TEST_F(FashionMnistFileTest, TruncatedHeaderIsDataLoss) {
  WriteValidTrain();
  WriteGz("train-images-idx3-ubyte.gz", {0, 0, 8, 3, 0, 0});
  absl::StatusOr<Dataset> d = LoadFashionMnist(dir_.string(), Split::kTrain);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(d.status().message(), HasSubstr(Path("train-images-idx3-ubyte.gz")));
}

TEST_F(FashionMnistFileTest, TruncatedLabelsAreDataLoss) {
  WriteValidTrain();
  WriteGz("train-labels-idx1-ubyte.gz", LabelsFile(0x801, kCount, {1, 2}));
  absl::StatusOr<Dataset> d = LoadFashionMnist(dir_.string(), Split::kTrain);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(d.status().message(), HasSubstr(Path("train-labels-idx1-ubyte.gz")));
}

TEST_F(FashionMnistFileTest, ImageLabelCountMismatchIsDataLoss) {
  WriteValidTrain();
  WriteGz("train-labels-idx1-ubyte.gz", LabelsFile(0x801, kCount - 1, {3, 0, 9, 1}));
  absl::StatusOr<Dataset> d = LoadFashionMnist(dir_.string(), Split::kTrain);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(d.status().message(), HasSubstr(Path("train-images-idx3-ubyte.gz")));
  EXPECT_THAT(d.status().message(), HasSubstr(Path("train-labels-idx1-ubyte.gz")));
}

TEST_F(FashionMnistFileTest, LabelOutOfRangeIsDataLoss) {
  WriteValidTrain();
  WriteGz("train-labels-idx1-ubyte.gz", LabelsFile(0x801, kCount, {3, 0, 10, 1, 3}));
  absl::StatusOr<Dataset> d = LoadFashionMnist(dir_.string(), Split::kTrain);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(d.status().message(), HasSubstr(Path("train-labels-idx1-ubyte.gz")));
  EXPECT_THAT(d.status().message(), HasSubstr("label 10"));
}

TEST_F(FashionMnistFileTest, CorruptGzipIsDataLoss) {
  WriteValidTrain();
  // A gzip stream cut in the middle of its deflate data.
  const std::string path = Path("train-images-idx3-ubyte.gz");
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 12);
  absl::StatusOr<Dataset> d = LoadFashionMnist(dir_.string(), Split::kTrain);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(d.status().message(), HasSubstr(path));
}

void ExpectNormalisedStatistics(const Dataset& d) {
  double sum = 0, sum_sq = 0;
  for (float v : d.x) {
    sum += v;
    sum_sq += double{v} * v;
  }
  const double n = static_cast<double>(d.x.size());
  const double mean = sum / n;
  const double stddev = std::sqrt(sum_sq / n - mean * mean);
  EXPECT_NEAR(mean, 0.0, 1e-3);
  EXPECT_NEAR(stddev, 1.0, 1e-3);
}

TEST(RealFashionMnistTest, LoadsBothSplitsWithBalancedClassesAndUnitStatistics) {
  if (!std::filesystem::exists(kDefaultFashionMnistDir)) {
    GTEST_SKIP() << kDefaultFashionMnistDir
                 << " is absent; apt-get install dataset-fashion-mnist to run this test";
  }
  for (Split split : {Split::kTrain, Split::kTest}) {
    const bool train = split == Split::kTrain;
    SCOPED_TRACE(train ? "train" : "test");
    absl::StatusOr<Dataset> d = LoadFashionMnist(kDefaultFashionMnistDir, split);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(d->size, train ? 60000 : 10000);
    EXPECT_EQ(d->dim, 784);
    EXPECT_EQ(d->classes, 10);
    EXPECT_EQ(d->x.size(), static_cast<size_t>(d->size) * 784);
    ASSERT_EQ(d->y.size(), static_cast<size_t>(d->size));
    std::array<int64_t, 10> histogram{};
    for (int32_t label : d->y) {
      ASSERT_GE(label, 0);
      ASSERT_LT(label, 10);
      ++histogram[label];
    }
    for (int c = 0; c < 10; ++c) {
      EXPECT_EQ(histogram[c], train ? 6000 : 1000) << "class " << c;
    }
    if (train) ExpectNormalisedStatistics(*d);
  }
}

TEST(MakeSyntheticTest, IsDeterministicInItsArguments) {
  const Dataset a = MakeSynthetic(200, 16, 4, /*seed=*/42);
  const Dataset b = MakeSynthetic(200, 16, 4, /*seed=*/42);
  EXPECT_EQ(a.size, 200);
  EXPECT_EQ(a.dim, 16);
  EXPECT_EQ(a.classes, 4);
  ASSERT_EQ(a.x.size(), 200u * 16);
  ASSERT_EQ(a.y.size(), 200u);
  EXPECT_EQ(a.x, b.x);
  EXPECT_EQ(a.y, b.y);
}

TEST(MakeSyntheticTest, DiffersWithTheSeed) {
  const Dataset a = MakeSynthetic(200, 16, 4, /*seed=*/42);
  const Dataset b = MakeSynthetic(200, 16, 4, /*seed=*/43);
  EXPECT_NE(a.x, b.x);
}

TEST(MakeSyntheticTest, LabelsAreBalancedAndInRange) {
  const Dataset d = MakeSynthetic(100, 8, 5, /*seed=*/7);
  std::vector<int> histogram(5);
  for (int32_t label : d.y) {
    ASSERT_GE(label, 0);
    ASSERT_LT(label, 5);
    ++histogram[label];
  }
  EXPECT_THAT(histogram, ::testing::Each(20));
}

TEST(MakeSyntheticTest, ZeroNoisePutsEveryExampleOnItsCentroid) {
  const Dataset d = MakeSynthetic(30, 8, 3, /*seed=*/5, /*noise=*/0.0f);
  for (int64_t i = 3; i < d.size; ++i) {
    const std::vector<float> row(d.x.begin() + i * 8, d.x.begin() + (i + 1) * 8);
    const std::vector<float> same_class(d.x.begin() + (i % 3) * 8, d.x.begin() + (i % 3 + 1) * 8);
    EXPECT_EQ(row, same_class) << "example " << i;
  }
}

TEST(MakeSyntheticTest, ClassesAreSeparableByNearestClassMean) {
  constexpr int kDim = 20, kClasses = 10;
  const Dataset d = MakeSynthetic(2000, kDim, kClasses, /*seed=*/11);
  std::vector<double> means(kClasses * kDim, 0.0);
  std::vector<int> counts(kClasses, 0);
  for (int64_t i = 0; i < d.size; ++i) {
    ++counts[d.y[i]];
    for (int j = 0; j < kDim; ++j) means[d.y[i] * kDim + j] += d.x[i * kDim + j];
  }
  for (int c = 0; c < kClasses; ++c) {
    for (int j = 0; j < kDim; ++j) means[c * kDim + j] /= counts[c];
  }
  int correct = 0;
  for (int64_t i = 0; i < d.size; ++i) {
    int best = -1;
    double best_dist = 0;
    for (int c = 0; c < kClasses; ++c) {
      double dist = 0;
      for (int j = 0; j < kDim; ++j) {
        const double diff = d.x[i * kDim + j] - means[c * kDim + j];
        dist += diff * diff;
      }
      if (best < 0 || dist < best_dist) best = c, best_dist = dist;
    }
    correct += best == d.y[i];
  }
  EXPECT_GT(correct, 0.95 * d.size);
}

}  // namespace
}  // namespace pscluster::data
