#include "tools/psctl/plan.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "tools/psctl/internal/layouts.h"

namespace pscluster::plan {
namespace {

constexpr double kGiB = 1024.0 * 1024 * 1024;

absl::Status Invalid(absl::string_view flag, double value, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", value, " ", what));
}

// !(v > 0) also refuses NaN.
absl::Status Positive(absl::string_view flag, double value) {
  if (!std::isfinite(value)) return Invalid(flag, value, "is not a finite number");
  if (!(value > 0)) return Invalid(flag, value, "must be positive");
  return absl::OkStatus();
}

absl::Status NonNegative(absl::string_view flag, double value) {
  if (!std::isfinite(value)) return Invalid(flag, value, "is not a finite number");
  if (!(value >= 0)) return Invalid(flag, value, "must not be negative");
  return absl::OkStatus();
}

// Bounds far past any real job, so that counts stay within int64.
absl::Status AtMost(absl::string_view flag, double value, double limit) {
  if (value > limit) return Invalid(flag, value, absl::StrCat("must be at most ", limit));
  return absl::OkStatus();
}

absl::Status CheckData(const PlanInput& in) {
  RETURN_IF_ERROR(NonNegative("dataset_bytes", in.dataset_bytes));
  RETURN_IF_ERROR(NonNegative("dataset_tokens", in.dataset_tokens));
  if ((in.dataset_bytes > 0) == (in.dataset_tokens > 0)) {
    return absl::InvalidArgumentError("give one of --dataset_bytes and --dataset_tokens");
  }
  RETURN_IF_ERROR(Positive("bytes_per_token", in.bytes_per_token));
  RETURN_IF_ERROR(Positive("epochs", in.epochs));
  const double tokens =
      (in.dataset_tokens > 0 ? in.dataset_tokens : in.dataset_bytes / in.bytes_per_token);
  if (tokens * in.epochs > 1e18) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the dataset (--dataset_bytes / --bytes_per_token or --dataset_tokens, x --epochs) is ",
        tokens * in.epochs, " tokens; at most 1e18"));
  }
  RETURN_IF_ERROR(NonNegative("global_batch_tokens", in.global_batch_tokens));
  RETURN_IF_ERROR(AtMost("global_batch_tokens", in.global_batch_tokens, 1e15));
  RETURN_IF_ERROR(Positive("micro_batch", in.micro_batch));
  return AtMost("micro_batch", in.micro_batch, 1e9);
}

absl::Status CheckCluster(const PlanInput& in) {
  RETURN_IF_ERROR(Positive("nodes", in.nodes));
  RETURN_IF_ERROR(Positive("gpus_per_node", in.gpus_per_node));
  RETURN_IF_ERROR(AtMost("gpus_per_node", in.gpus_per_node, 1e4));
  RETURN_IF_ERROR(AtMost("nodes", in.nodes, 1e7 / in.gpus_per_node));
  if (in.nodes > 1) RETURN_IF_ERROR(Positive("inter_node_gbit", in.inter_node_gbit));
  RETURN_IF_ERROR(Positive("checkpoint_write_gbps", in.checkpoint_write_gbps));
  RETURN_IF_ERROR(Positive("mtbf_hours", in.mtbf_hours));
  RETURN_IF_ERROR(Positive("mfu_low", in.mfu_low));
  if (!(in.mfu_high >= in.mfu_low && in.mfu_high <= 1)) {
    return Invalid("mfu_high", in.mfu_high, "must be within [--mfu_low, 1]");
  }
  if (in.precision != "mixed" && in.precision != "fp32") {
    return absl::InvalidArgumentError(
        absl::StrCat("--precision=", in.precision, " is not mixed or fp32"));
  }
  if (!(in.state_bytes_per_param == 0 ||
        (in.state_bytes_per_param >= 1 && in.state_bytes_per_param <= 1000))) {
    return Invalid("state_bytes_per_param", in.state_bytes_per_param,
                   "must be 0 (the precision's 16) or within [1, 1000]");
  }
  if (!(in.memory_headroom >= 0 && in.memory_headroom < 1)) {
    return Invalid("memory_headroom", in.memory_headroom, "must be within [0, 1)");
  }
  return absl::OkStatus();
}

DataSplit SplitData(const PlanInput& in, const Model& model, int64_t gpus, const Layout& l) {
  DataSplit s;
  s.tokens = in.dataset_tokens > 0 ? in.dataset_tokens : in.dataset_bytes / in.bytes_per_token;
  s.total_tokens = s.tokens * in.epochs;
  s.tokens_per_gpu = s.total_tokens / gpus;
  s.layout = l.name;
  s.data_parallel = l.d;
  s.batch_sequences = l.batch_sequences;
  s.batch_tokens = l.batch_sequences * model.context;
  s.micro_batches = l.micro_batches;
  s.steps_per_epoch = static_cast<int64_t>(std::ceil(s.tokens / s.batch_tokens));
  s.total_steps = static_cast<int64_t>(std::ceil(s.total_tokens / s.batch_tokens));
  return s;
}

Compute ComputeTime(const PlanInput& in, const Model& model, const Device& device, int64_t gpus,
                    const DataSplit& data) {
  Compute c;
  c.flops = 6 * model.params * data.total_tokens;
  c.peak_flops = gpus * device.flops;
  const double step_flops = 6 * model.params * data.batch_tokens;
  c.step_seconds_low = step_flops / (c.peak_flops * in.mfu_low);
  c.step_seconds_high = step_flops / (c.peak_flops * in.mfu_high);
  // At least one step: a data set smaller than one global batch still takes a whole one.
  c.total_seconds_low = std::max(c.flops / (c.peak_flops * in.mfu_low), c.step_seconds_low);
  c.total_seconds_high = std::max(c.flops / (c.peak_flops * in.mfu_high), c.step_seconds_high);
  return c;
}

Checkpoint CheckpointTimes(const PlanInput& in, const Model& model, const Device& device,
                           int64_t gpus, const Compute& compute) {
  Checkpoint c;
  c.bytes = 12 * model.params;
  c.write_seconds = c.bytes / (in.nodes * in.checkpoint_write_gbps * 1e9);
  c.pause_seconds = c.bytes / gpus / (device.host_copy_gbps * 1e9);
  c.cluster_mtbf_seconds = in.mtbf_hours * 3600 / in.nodes;
  const double m = c.cluster_mtbf_seconds;
  c.interval_seconds = YoungDalyInterval(c.write_seconds, m);
  c.async_interval_seconds = std::max(YoungDalyInterval(c.pause_seconds, m), c.write_seconds);
  c.lost_seconds = c.interval_seconds / 2;
  c.async_lost_seconds = c.async_interval_seconds / 2;
  c.overhead = c.write_seconds / c.interval_seconds + c.interval_seconds / (2 * m);
  c.async_overhead =
      c.pause_seconds / c.async_interval_seconds + c.async_interval_seconds / (2 * m);
  c.expected_failures = compute.total_seconds_low / m;
  return c;
}

// The fitting layout with the shortest estimated step per sequence of its batch (the step
// when the batches are equal; they differ with no global batch given, or when rounding up
// to whole micro-batches). A later one must be 1 % shorter to win, so ties go to the
// simpler: DDP before ZeRO, ZeRO before tensor, tensor before pipeline. -1 when none fits.
int Recommend(const std::vector<Layout>& layouts) {
  const auto per_sequence = [](const Layout& l) { return l.step_seconds / l.batch_sequences; };
  int best = -1;
  for (int i = 0; i < static_cast<int>(layouts.size()); ++i) {
    if (layouts[i].fit == Fit::kNo) continue;
    if (best < 0 || per_sequence(layouts[i]) < 0.99 * per_sequence(layouts[best])) best = i;
  }
  return best;
}

}  // namespace

const std::vector<Device>& GpuPresets() {
  static const auto* const kPresets = new std::vector<Device>{
      {"a100-40gb", 40 * kGiB, 312e12, 300, 25, 1555},
      {"a100-80gb", 80 * kGiB, 312e12, 300, 25, 2039},
      {"h100-80gb", 80 * kGiB, 989e12, 450, 50, 3350},
      {"h200-141gb", 141 * kGiB, 989e12, 450, 50, 4800},
  };
  return *kPresets;
}

absl::StatusOr<Device> ResolveDevice(const PlanInput& in) {
  Device d{in.gpu};
  for (const Device& preset : GpuPresets()) {
    if (preset.name == in.gpu) d = preset;
  }
  const bool custom = d.memory_bytes == 0;
  const std::pair<double*, double> fields[] = {{&d.memory_bytes, in.gpu_memory_bytes},
                                               {&d.flops, in.gpu_flops},
                                               {&d.intra_node_gbps, in.intra_node_gbps},
                                               {&d.host_copy_gbps, in.host_copy_gbps},
                                               {&d.memory_gbps, in.memory_gbps}};
  for (const auto& [field, given] : fields) {
    if (given != 0) *field = given;
  }
  const std::string why =
      custom ? absl::StrCat("(--gpu=", in.gpu, " is no preset, so give it; presets: ",
                            absl::StrJoin(GpuPresets(), ", ",
                                          [](std::string* out, const Device& p) {
                                            absl::StrAppend(out, p.name);
                                          }),
                            ")")
             : "must be positive";
  if (!(d.memory_bytes > 0)) return Invalid("gpu_memory_bytes", d.memory_bytes, why);
  if (!(d.flops > 0)) return Invalid("gpu_flops", d.flops, why);
  if (in.gpus_per_node > 1 && !(d.intra_node_gbps > 0)) {
    return Invalid("intra_node_gbps", d.intra_node_gbps, why);
  }
  if (!(d.host_copy_gbps > 0)) return Invalid("host_copy_gbps", d.host_copy_gbps, why);
  if (!(d.memory_gbps > 0)) return Invalid("memory_gbps", d.memory_gbps, why);
  return d;
}

double ShapeParams(int64_t layers, int64_t width, int64_t vocab, int64_t context) {
  const double l = layers, d = width;
  return 12 * l * d * d + 13 * l * d + (static_cast<double>(vocab) + context) * d + 2 * d;
}

Model DeriveShape(double params, int64_t vocab, int64_t context) {
  Model m;
  m.params = params;
  m.params_given = true;
  m.shape_derived = true;
  m.layers = std::max<int64_t>(1, std::llround(std::cbrt(params / (12 * 128.0 * 128.0))));
  m.width = 128 * m.layers;
  m.heads = m.layers;
  m.vocab = vocab;
  m.context = context;
  m.shape_params = ShapeParams(m.layers, m.width, vocab, context);
  return m;
}

absl::StatusOr<Model> ResolveModel(const PlanInput& in) {
  RETURN_IF_ERROR(NonNegative("params", in.params));
  RETURN_IF_ERROR(AtMost("params", in.params, 1e16));
  RETURN_IF_ERROR(Positive("vocab", in.vocab));
  RETURN_IF_ERROR(AtMost("vocab", in.vocab, 1e9));
  RETURN_IF_ERROR(Positive("context", in.context));
  RETURN_IF_ERROR(AtMost("context", in.context, 1e9));
  const bool any_shape = in.layers != 0 || in.width != 0 || in.heads != 0;
  if (!any_shape) {
    if (in.params == 0) {
      return absl::InvalidArgumentError(
          "give the model: --params, or its shape --layers, --width and --heads");
    }
    return DeriveShape(in.params, in.vocab, in.context);
  }
  RETURN_IF_ERROR(Positive("layers", in.layers));
  RETURN_IF_ERROR(AtMost("layers", in.layers, 1e6));
  RETURN_IF_ERROR(Positive("width", in.width));
  RETURN_IF_ERROR(AtMost("width", in.width, 1e7));
  RETURN_IF_ERROR(Positive("heads", in.heads));
  if (in.width % in.heads != 0) {
    return Invalid("heads", in.heads, absl::StrCat("does not divide --width=", in.width));
  }
  Model m;
  m.layers = in.layers;
  m.width = in.width;
  m.heads = in.heads;
  m.vocab = in.vocab;
  m.context = in.context;
  m.shape_params = ShapeParams(m.layers, m.width, m.vocab, m.context);
  m.params_given = in.params > 0;
  m.params = m.params_given ? in.params : m.shape_params;
  // Both given: the memory would follow one and the activations the other. Close ones are a
  // rounded count (13e9 for a shape of 12.85 B); far apart, one of them is a mistake.
  if (m.params_given && (m.params > 2 * m.shape_params || 2 * m.params < m.shape_params)) {
    return Invalid("params", in.params,
                   absl::StrCat("does not agree with the shape given (--layers, --width, "
                                "--vocab, --context count ",
                                absl::StrFormat("%.4g", m.shape_params),
                                " parameters): give --params alone, or a shape within 2x of it"));
  }
  return m;
}

double ActivationBytesPerLayer(int64_t s, int64_t b, int64_t h, int64_t a, int64_t t, bool fp32,
                               bool sequence_parallel) {
  const double sbh = static_cast<double>(s) * b * h;
  const double attention = (fp32 ? 4.0 : 5.0) * a * s / h;
  if (sequence_parallel) return sbh * ((fp32 ? 64 : 34) + attention) / t;
  return sbh * ((fp32 ? 16 : 10) + ((fp32 ? 48 : 24) + attention) / t);
}

double FlopsPerToken(const Model& m) {
  return 6 * m.params + 12.0 * m.layers * m.context * m.width;
}

ElementwiseCounts ElementwisePerTokenLayer(const Model& m) {
  const double h = m.width;
  return {30 * h, 24 * h + 6.0 * m.heads * m.context, 6.0 * m.vocab};
}

double YoungDalyInterval(double checkpoint_seconds, double mtbf_seconds) {
  return std::sqrt(2 * checkpoint_seconds * mtbf_seconds);
}

absl::StatusOr<Plan> MakePlan(const PlanInput& input) {
  Plan plan;
  plan.input = input;
  // A value given wrong is named before a flag left out: that is the mistake just made.
  RETURN_IF_ERROR(CheckCluster(input));
  ASSIGN_OR_RETURN(plan.model, ResolveModel(input));
  RETURN_IF_ERROR(CheckData(input));
  ASSIGN_OR_RETURN(plan.device, ResolveDevice(input));
  plan.gpus = input.nodes * input.gpus_per_node;
  plan.usable_memory_bytes = plan.device.memory_bytes * (1 - input.memory_headroom);
  const internal::Cluster cluster{input, plan.model, plan.device, plan.gpus,
                                  plan.usable_memory_bytes};
  plan.layouts = internal::EvaluateLayouts(cluster);
  plan.recommended = Recommend(plan.layouts);
  // Nothing fits: the batch is still DDP's (D = every GPU).
  const Layout& chosen = plan.layouts[std::max(plan.recommended, 0)];
  plan.data = SplitData(input, plan.model, plan.gpus, chosen);
  plan.compute = ComputeTime(input, plan.model, plan.device, plan.gpus, plan.data);
  plan.checkpoint = CheckpointTimes(input, plan.model, plan.device, plan.gpus, plan.compute);
  return plan;
}

absl::optional<Layout> FindLayout(const Plan& plan, absl::string_view name) {
  for (const Layout& l : plan.layouts) {
    if (l.name == name) return l;
  }
  return absl::nullopt;
}

}  // namespace pscluster::plan
