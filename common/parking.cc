#include "common/parking.h"

namespace pscluster {

absl::Status Parked() {
  return absl::Status(absl::StatusCode::kAborted, "parked until what it waits for holds");
}

bool IsParked(const absl::Status& s) {
  return s.code() == absl::StatusCode::kAborted && s.message() == Parked().message();
}

}  // namespace pscluster
