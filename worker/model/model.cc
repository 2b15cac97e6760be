#include "worker/model/model.h"

namespace pscluster::model {

size_t TensorSpec::size() const {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

}  // namespace pscluster::model
