#include "server/coordinator/kv_store.h"

#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/parking_testing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pscluster::coord {
namespace {

using ::testing::HasSubstr;

absl::Time Past() { return absl::Now() - absl::Seconds(1); }
absl::Time Generous() { return absl::Now() + absl::Seconds(30); }
std::string Msg(const absl::Status& s) { return std::string(s.message()); }

TEST(KvStoreTest, AParkedGetIsWokenByThePutOfItsKeyOnly) {
  KvStore kv;
  auto waiter = std::make_shared<testing::CountingWaiter>();
  Wait how = testing::ParkedWait(waiter, Generous());
  EXPECT_TRUE(IsParked(kv.Get("rank0/addr", /*wait=*/true, how).status()));
  ASSERT_TRUE(kv.Put("rank1/addr", "b").ok());
  EXPECT_EQ(waiter->wakes, 0) << "another key's Put woke it";
  ASSERT_TRUE(kv.Put("rank0/addr", "a").ok());
  EXPECT_EQ(waiter->wakes, 1);
  EXPECT_TRUE(waiter->last.ok());
  // Asked again (as the woken call is), it has its value; a second Put wakes no one.
  absl::StatusOr<std::string> v = kv.Get("rank0/addr", /*wait=*/true, how);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "a");
  ASSERT_TRUE(kv.Put("rank0/addr", "c").ok());
  EXPECT_EQ(waiter->wakes, 1);
}

TEST(KvStoreTest, AParkedGetHearsOfShutdownAndOfItsDeadline) {
  KvStore kv;
  auto waiter = std::make_shared<testing::CountingWaiter>();
  Wait how = testing::ParkedWait(waiter, Generous());
  EXPECT_TRUE(IsParked(kv.Get("k", /*wait=*/true, how).status()));
  how.deadline = Past();  // the deadline came: asked again, it does not park
  EXPECT_EQ(kv.Get("k", /*wait=*/true, how).status().code(), absl::StatusCode::kDeadlineExceeded);
  how.deadline = Generous();
  EXPECT_TRUE(IsParked(kv.Get("k", /*wait=*/true, how).status()));
  kv.Shutdown();
  EXPECT_GE(waiter->wakes, 1);
  EXPECT_EQ(kv.Get("k", /*wait=*/true, how).status().code(), absl::StatusCode::kUnavailable);
}

TEST(KvStoreTest, PutThenGetRoundTrips) {
  KvStore kv;
  ASSERT_TRUE(kv.Put("nccl/unique_id", "abc").ok());
  absl::StatusOr<std::string> v = kv.Get("nccl/unique_id", /*wait=*/false, Past());
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "abc");
  // With wait and a past deadline, a present key is still returned at once.
  absl::StatusOr<std::string> w = kv.Get("nccl/unique_id", /*wait=*/true, Past());
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(*w, "abc");
}

TEST(KvStoreTest, BinaryValuesWithNulBytesRoundTrip) {
  KvStore kv;
  std::string value("\0a\0\xff\x01\0", 6);
  for (int c = 0; c < 256; ++c) value.push_back(static_cast<char>(c));
  ASSERT_TRUE(kv.Put("bin", value).ok());
  absl::StatusOr<std::string> v = kv.Get("bin", false, Past());
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->size(), value.size());
  EXPECT_EQ(*v, value);
}

TEST(KvStoreTest, KeysWithNulBytesAreDistinct) {
  KvStore kv;
  const std::string k1("a\0b", 3), k2("a\0c", 3);
  ASSERT_TRUE(kv.Put(k1, "one").ok());
  ASSERT_TRUE(kv.Put(k2, "two").ok());
  EXPECT_EQ(*kv.Get(k1, false, Past()), "one");
  EXPECT_EQ(*kv.Get(k2, false, Past()), "two");
  EXPECT_EQ(kv.Get("a", false, Past()).status().code(), absl::StatusCode::kNotFound);
}

TEST(KvStoreTest, EmptyValueIsStoredAndDistinctFromMissing) {
  KvStore kv;
  ASSERT_TRUE(kv.Put("empty", "").ok());
  absl::StatusOr<std::string> v = kv.Get("empty", false, Past());
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "");
}

TEST(KvStoreTest, PutOverwrites) {
  KvStore kv;
  ASSERT_TRUE(kv.Put("k", "first").ok());
  ASSERT_TRUE(kv.Put("k", "second").ok());
  EXPECT_EQ(*kv.Get("k", false, Past()), "second");
}

TEST(KvStoreTest, GetWithoutWaitOfMissingKeyIsNotFound) {
  KvStore kv;
  absl::StatusOr<std::string> v = kv.Get("missing", /*wait=*/false, Generous());
  ASSERT_EQ(v.status().code(), absl::StatusCode::kNotFound) << v.status();
  EXPECT_THAT(Msg(v.status()), HasSubstr("missing"));
}

TEST(KvStoreTest, GetWithWaitTimesOutNamingTheKey) {
  KvStore kv;
  ASSERT_TRUE(kv.Put("other", "x").ok());
  absl::StatusOr<std::string> v = kv.Get("rendezvous/rank3", /*wait=*/true, Past());
  ASSERT_EQ(v.status().code(), absl::StatusCode::kDeadlineExceeded) << v.status();
  EXPECT_THAT(Msg(v.status()), HasSubstr("rendezvous/rank3"));
}

TEST(KvStoreTest, BlockedGetWakesOnPut) {
  KvStore kv;
  absl::StatusOr<std::string> result = absl::UnknownError("not run");
  std::thread waiter([&] { result = kv.Get("id", /*wait=*/true, Generous()); });
  ASSERT_TRUE(kv.Put("unrelated", "u").ok());
  ASSERT_TRUE(kv.Put("id", std::string("\0id\0", 4)).ok());
  waiter.join();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(*result, std::string("\0id\0", 4));
}

TEST(KvStoreTest, SeveralBlockedGetsAllWake) {
  KvStore kv;
  constexpr int kWaiters = 4;
  absl::StatusOr<std::string> results[kWaiters];
  std::thread waiters[kWaiters];
  for (int i = 0; i < kWaiters; ++i) {
    results[i] = absl::UnknownError("not run");
    waiters[i] = std::thread([&, i] { results[i] = kv.Get("go", true, Generous()); });
  }
  ASSERT_TRUE(kv.Put("go", "now").ok());
  for (std::thread& t : waiters) t.join();
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(*r, "now");
  }
}

TEST(KvStoreTest, EmptyKeyIsInvalidArgument) {
  KvStore kv;
  absl::Status s = kv.Put("", "v");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
}

TEST(KvStoreTest, OversizedKeyIsInvalidArgumentAndMaxSizeKeyIsAccepted) {
  KvStore kv;
  const std::string max_key(KvStore::kMaxKeyBytes, 'k');
  ASSERT_TRUE(kv.Put(max_key, "v").ok());
  EXPECT_EQ(*kv.Get(max_key, false, Past()), "v");
  const std::string too_long(KvStore::kMaxKeyBytes + 1, 'k');
  absl::Status s = kv.Put(too_long, "v");
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(Msg(s), HasSubstr(absl::StrCat(KvStore::kMaxKeyBytes + 1)));
  EXPECT_EQ(kv.Get(too_long, false, Past()).status().code(), absl::StatusCode::kNotFound);
}

TEST(KvStoreTest, OversizedValueIsResourceExhaustedAndMaxSizeValueIsAccepted) {
  KvStore kv;
  const std::string max_value(KvStore::kMaxValueBytes, 'v');
  ASSERT_TRUE(kv.Put("max", max_value).ok());
  EXPECT_EQ(kv.Get("max", false, Past())->size(), KvStore::kMaxValueBytes);
  absl::Status s = kv.Put("big", std::string(KvStore::kMaxValueBytes + 1, 'v'));
  ASSERT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(Msg(s), HasSubstr("big"));
  EXPECT_EQ(kv.Get("big", false, Past()).status().code(), absl::StatusCode::kNotFound);
  // An oversized overwrite leaves the old value in place.
  EXPECT_EQ(kv.Put("max", std::string(KvStore::kMaxValueBytes + 1, 'w')).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(*kv.Get("max", false, Past()), max_value);
}

TEST(KvStoreTest, MoreThanMaxKeysIsResourceExhaustedButOverwritingWhenFullIsAllowed) {
  KvStore kv;
  for (size_t i = 0; i < KvStore::kMaxKeys; ++i) {
    absl::Status s = kv.Put(absl::StrCat("key", i), "v");
    ASSERT_TRUE(s.ok()) << "key " << i << ": " << s;
  }
  absl::Status full = kv.Put("one-too-many", "v");
  ASSERT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_EQ(kv.Get("one-too-many", false, Past()).status().code(), absl::StatusCode::kNotFound);

  absl::Status overwrite = kv.Put("key0", "new");
  ASSERT_TRUE(overwrite.ok()) << overwrite;
  EXPECT_EQ(*kv.Get("key0", false, Past()), "new");
  const std::string last = absl::StrCat("key", KvStore::kMaxKeys - 1);
  EXPECT_EQ(*kv.Get(last, false, Past()), "v");
}

}  // namespace
}  // namespace pscluster::coord

namespace pscluster::coord {
namespace {

TEST(KvStoreBoundsTest, TheTotalBytesAreBoundedAndARefusedPutChangesNothing) {
  KvStore kv;
  const std::string mib(KvStore::kMaxValueBytes, 'x');
  size_t puts = 0;
  absl::Status s;
  while ((s = kv.Put(absl::StrCat("k", puts), mib)).ok()) ++puts;
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("the limit is 67108864"));
  EXPECT_EQ(puts, 63u);  // 64 MiB holds 63 MiB values and their keys, not 64
  const size_t total = kv.total_bytes();
  EXPECT_LE(total, KvStore::kMaxTotalBytes);
  EXPECT_EQ(kv.Get(absl::StrCat("k", puts), false, absl::Now()).status().code(),
            absl::StatusCode::kNotFound);
  // Overwriting a key with a value of the same size fits: only the difference counts.
  EXPECT_TRUE(kv.Put("k0", mib).ok());
  EXPECT_EQ(kv.total_bytes(), total);
}

TEST(KvStoreBoundsTest, AGenerationThatIsOverIsDropped) {
  KvStore kv;
  ASSERT_TRUE(kv.Put("gen/s0.1-w0.1-/gloo/0", "a").ok());
  ASSERT_TRUE(kv.Put("gen/s0.1-w0.1-/gloo/1", "b").ok());
  ASSERT_TRUE(kv.Put("gen/s0.1-w0.2-/gloo/0", "c").ok());
  ASSERT_TRUE(kv.Put("other", "d").ok());
  EXPECT_EQ(kv.DropPrefixedExcept("gen/", "gen/s0.1-w0.2-/"), 2);
  EXPECT_EQ(kv.Get("gen/s0.1-w0.1-/gloo/0", false, absl::Now()).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(*kv.Get("gen/s0.1-w0.2-/gloo/0", false, absl::Now()), "c");
  EXPECT_EQ(*kv.Get("other", false, absl::Now()), "d");
  EXPECT_EQ(kv.total_bytes(), std::string("gen/s0.1-w0.2-/gloo/0c").size() + 6);
}

}  // namespace
}  // namespace pscluster::coord
