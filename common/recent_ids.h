#ifndef PSCLUSTER_COMMON_RECENT_IDS_H_
#define PSCLUSTER_COMMON_RECENT_IDS_H_

#include <algorithm>
#include <cstddef>
#include <deque>
#include <string>
#include <unordered_map>
#include <utility>

namespace pscluster {

// The last `capacity` request ids added, each with a value, the oldest forgotten first: what
// a shard remembers to answer a client's repeat of a request it applied without applying it
// twice. Not thread-safe: its owner's mutex guards it.
template <typename V>
class RecentIds {
 public:
  explicit RecentIds(size_t capacity) : capacity_(capacity) {}

  // Remembers id -> value; false, and nothing changes, when the id is remembered already.
  bool Add(const std::string& id, V value) {
    if (!values_.emplace(id, std::move(value)).second) return false;
    order_.push_back(id);
    while (order_.size() > capacity_) {
      values_.erase(order_.front());
      order_.pop_front();
    }
    return true;
  }
  // Remembers id -> value, replacing the value an id remembered already has.
  void Set(const std::string& id, V value) {
    auto it = values_.find(id);
    if (it == values_.end()) {
      Add(id, std::move(value));
    } else {
      it->second = std::move(value);
    }
  }
  // Forgets id (linear in size: for the rare failed request).
  void Erase(const std::string& id) {
    if (values_.erase(id) == 0) return;
    order_.erase(std::find(order_.begin(), order_.end(), id));
  }
  // The id's value, or null when it is not (or no longer) remembered.
  const V* Find(const std::string& id) const {
    auto it = values_.find(id);
    return it == values_.end() ? nullptr : &it->second;
  }
  void Clear() {
    values_.clear();
    order_.clear();
  }
  // Every remembered id and its value, the oldest first.
  template <typename F>
  void ForEach(F f) const {
    for (const std::string& id : order_) f(id, values_.at(id));
  }
  size_t size() const { return order_.size(); }

 private:
  size_t capacity_;
  std::unordered_map<std::string, V> values_;
  std::deque<std::string> order_;  // oldest first
};

}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_RECENT_IDS_H_
