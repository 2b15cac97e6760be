#include "tools/psctl/plan.h"

#include <cmath>
#include <limits>
#include <string>

#include "gtest/gtest.h"
#include "tools/psctl/plan_testing.h"

namespace pscluster::plan {
namespace {

using testing::Exercise13B;
using testing::MustPlan;

// GPT-3 125M's shape (L 12, h 768, 12 heads) on one node of 8 A100s.
PlanInput Small125M() {
  PlanInput in;
  in.layers = 12;
  in.width = 768;
  in.heads = 12;
  in.dataset_tokens = 10e9;
  in.nodes = 1;
  in.gpus_per_node = 8;
  return in;
}

Layout MustFind(const Plan& plan, absl::string_view name) {
  absl::optional<Layout> l = FindLayout(plan, name);
  EXPECT_TRUE(l.has_value()) << name;
  return l.value_or(Layout{});
}

void ExpectInvalid(const PlanInput& in, absl::string_view flag) {
  absl::StatusOr<Plan> plan = MakePlan(in);
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument) << flag;
  EXPECT_NE(plan.status().message().find(flag), absl::string_view::npos)
      << plan.status().message() << " does not name " << flag;
}

TEST(PlanTest, ExerciseModelStateIs16BytesPerParameterAndZero3DividesItBy32) {
  const Plan plan = MustPlan(Exercise13B());
  EXPECT_EQ(plan.gpus, 32);
  EXPECT_DOUBLE_EQ(MustFind(plan, "DDP").model_state_bytes, 16 * 13e9);               // 208 GB
  EXPECT_DOUBLE_EQ(MustFind(plan, "ZeRO-3/FSDP").model_state_bytes, 16 * 13e9 / 32);  // 6.5 GB
  EXPECT_DOUBLE_EQ(MustFind(plan, "ZeRO-1").model_state_bytes, (4 + 12.0 / 32) * 13e9);
  EXPECT_DOUBLE_EQ(MustFind(plan, "ZeRO-2").model_state_bytes, (2 + 14.0 / 32) * 13e9);
  EXPECT_DOUBLE_EQ(MustFind(plan, "T8xP4xD1").model_state_bytes, 16 * 13e9 / 32);
}

TEST(PlanTest, ExerciseTokensFlopsAndDaysAtTheMfuRange) {
  const Plan plan = MustPlan(Exercise13B());
  const double tokens = 200e9 / 4;         // 50 B
  const double flops = 6 * 13e9 * tokens;  // 3.9e21
  EXPECT_DOUBLE_EQ(plan.data.total_tokens, tokens);
  EXPECT_DOUBLE_EQ(plan.data.tokens_per_gpu, tokens / 32);
  EXPECT_DOUBLE_EQ(plan.compute.flops, flops);
  EXPECT_DOUBLE_EQ(plan.compute.total_seconds_high, flops / (32 * 312e12 * 0.5));  // 7.8e5 s
  EXPECT_DOUBLE_EQ(plan.compute.total_seconds_low, flops / (32 * 312e12 * 0.4));
  EXPECT_NEAR(plan.compute.total_seconds_high / 86400, 9.04, 0.01);  // about 9 days
}

TEST(PlanTest, ExerciseBatchIs4MiTokensInStepsOfTheChosenLayoutsAccumulation) {
  const Plan plan = MustPlan(Exercise13B());
  const double sequences = 4194304.0 / 2048;  // 2048
  EXPECT_DOUBLE_EQ(plan.data.batch_sequences, sequences);
  EXPECT_DOUBLE_EQ(plan.data.batch_tokens, 4194304);
  EXPECT_EQ(plan.data.micro_batches, sequences / plan.data.data_parallel);
  EXPECT_EQ(plan.data.steps_per_epoch, std::ceil(50e9 / 4194304));  // 11921
  EXPECT_EQ(MustFind(plan, "DDP").micro_batches, 2048 / 32);
  EXPECT_EQ(MustFind(plan, "T8xP4xD1").micro_batches, 2048);
}

TEST(PlanTest, DdpOf13BDoesNotFitIn80GBButZero3Does) {
  const Plan plan = MustPlan(Exercise13B());
  EXPECT_GT(16 * 13e9, plan.device.memory_bytes);
  EXPECT_EQ(MustFind(plan, "DDP").fit, Fit::kNo);
  EXPECT_EQ(MustFind(plan, "ZeRO-3/FSDP").fit, Fit::kFits);
  EXPECT_TRUE(plan.recommended >= 0);
  EXPECT_NE(plan.layouts[plan.recommended].name, "DDP");
}

TEST(PlanTest, ALayoutThatFitsOnlyWithRecomputationIsMarkedSo) {
  // ZeRO-1: 56.9 GB of state + 47.8 GB of activations > 77.3 GB usable; + 2.0 GB recomputed.
  const Plan plan = MustPlan(Exercise13B());
  const Layout zero1 = MustFind(plan, "ZeRO-1");
  EXPECT_GT(zero1.model_state_bytes + zero1.activation_bytes, plan.usable_memory_bytes);
  EXPECT_EQ(zero1.fit, Fit::kWithRecompute);
  EXPECT_TRUE(zero1.recompute);
}

TEST(PlanTest, ActivationsFollowKorthikanti) {
  const Plan plan = MustPlan(Exercise13B());
  ASSERT_TRUE(plan.model.shape_derived);
  EXPECT_EQ(plan.model.layers, 40);
  EXPECT_EQ(plan.model.width, 5120);
  EXPECT_EQ(plan.model.heads, 40);
  const double s = 2048, b = 1, h = 5120, a = 40, layers = 40;
  const double layer = s * b * h * (34 + 5 * a * s / h);
  const Layout ddp = MustFind(plan, "DDP");
  EXPECT_DOUBLE_EQ(ddp.activation_bytes, layers * layer);
  EXPECT_DOUBLE_EQ(ddp.activation_recompute_bytes, layers * 2 * s * b * h + layer);
  // Tensor 8-way with sequence parallelism divides both by 8.
  EXPECT_DOUBLE_EQ(MustFind(plan, "T8xP1xD4").activation_bytes, layers * layer / 8);
  // 4 stages of 10 layers, 4 micro-batches in flight on the first under 1F1B.
  EXPECT_DOUBLE_EQ(MustFind(plan, "T1xP4xD8").activation_bytes, 10 * 4 * layer);
}

TEST(PlanTest, ShapeCountsParametersGpt2Style) {
  // GPT-2 small: 124,439,808.
  EXPECT_DOUBLE_EQ(ShapeParams(12, 768, 50257, 1024), 124439808);
  const double l = 12, d = 768, v = 50257, t = 2048;
  const Plan plan = MustPlan(Small125M());
  EXPECT_DOUBLE_EQ(plan.model.params, 12 * l * d * d + 13 * l * d + v * d + t * d + 2 * d);
  EXPECT_FALSE(plan.model.params_given);
}

TEST(PlanTest, ParamsWinOverTheShapeWhichStillGivesActivations) {
  PlanInput in = Small125M();
  in.params = 200e6;
  const Plan plan = MustPlan(in);
  EXPECT_DOUBLE_EQ(plan.model.params, 200e6);
  EXPECT_EQ(plan.model.width, 768);
  EXPECT_DOUBLE_EQ(MustFind(plan, "DDP").activation_bytes,
                   12 * ActivationBytesPerLayer(2048, 1, 768, 12, 1));
}

TEST(PlanTest, SmallModelOnOneNodeIsPlainDdp) {
  const Plan plan = MustPlan(Small125M());
  ASSERT_GE(plan.recommended, 0);
  const Layout& l = plan.layouts[plan.recommended];
  EXPECT_EQ(l.name, "DDP");
  EXPECT_FALSE(l.recompute);
  ASSERT_EQ(l.collectives.size(), 1u);
  EXPECT_FALSE(l.collectives[0].inter_node);
  // Ring all-reduce of the bf16 gradients: 2·(n-1)/n·2·N bytes.
  EXPECT_DOUBLE_EQ(l.comm_bytes, 2.0 * 7 / 8 * 2 * plan.model.params);
}

TEST(PlanTest, Zero3MovesThreeTimesTheParametersPerMicroBatch) {
  const Plan plan = MustPlan(Exercise13B());
  const Layout ddp = MustFind(plan, "DDP"), zero3 = MustFind(plan, "ZeRO-3/FSDP");
  const double ring = 31.0 / 32 * 2 * 13e9;  // (n-1)/n of the bf16 parameters
  EXPECT_DOUBLE_EQ(ddp.comm_bytes, 2 * ring);
  EXPECT_DOUBLE_EQ(zero3.comm_bytes, 3 * ring * zero3.micro_batches);
}

TEST(PlanTest, TensorParallelStaysOnNvlinkAndDataParallelSharesTheNics) {
  const Plan plan = MustPlan(Exercise13B());
  const Layout l = MustFind(plan, "T8xP1xD4");
  ASSERT_EQ(l.collectives.size(), 2u);
  const Collective& data = l.collectives[0];
  const Collective& tensor = l.collectives[1];
  EXPECT_TRUE(data.inter_node);
  EXPECT_DOUBLE_EQ(data.gbps, 200.0 / 8 / 8);  // 8 groups, one GPU per node each
  EXPECT_FALSE(tensor.inter_node);
  EXPECT_DOUBLE_EQ(tensor.gbps, 300);
  const double sbh = 2048.0 * 5120;
  EXPECT_DOUBLE_EQ(tensor.bytes, 4 * 40 * l.micro_batches * 2.0 * 7 / 8 * 2 * sbh);
  // DDP's one ring per node crosses the NICs once: the whole 25 GB/s.
  EXPECT_DOUBLE_EQ(MustFind(plan, "DDP").collectives[0].gbps, 200.0 / 8);
}

TEST(PlanTest, LayoutsKeepTensorParallelWithinANodeAndDividingTheHeads) {
  PlanInput in = Exercise13B();
  in.gpus_per_node = 4;
  in.nodes = 8;
  for (const Layout& l : MustPlan(in).layouts) {
    EXPECT_LE(l.t, 4) << l.name;
    EXPECT_EQ(l.t * l.p * l.d, 32) << l.name;
    EXPECT_EQ(40 % l.t, 0) << l.name;
  }
}

TEST(PlanTest, NothingFitsWhenTheModelOutgrowsEveryLayout) {
  PlanInput in = Exercise13B();
  in.params = 2e12;
  in.gpu = "a100-40gb";
  in.nodes = 1;
  const Plan plan = MustPlan(in);
  EXPECT_EQ(plan.recommended, -1);
  for (const Layout& l : plan.layouts) EXPECT_EQ(l.fit, Fit::kNo) << l.name;
}

TEST(PlanTest, YoungDalyIntervalIsSqrtOfTwiceCheckpointTimesMtbf) {
  EXPECT_DOUBLE_EQ(YoungDalyInterval(20, 900000), std::sqrt(2 * 20 * 900000.0));
  const Plan plan = MustPlan(Exercise13B());
  const Checkpoint& c = plan.checkpoint;
  EXPECT_DOUBLE_EQ(c.bytes, 12 * 13e9);
  EXPECT_DOUBLE_EQ(c.write_seconds, 12 * 13e9 / (4 * 2e9));  // 4 nodes at 2 GB/s each
  EXPECT_DOUBLE_EQ(c.cluster_mtbf_seconds, 1000 * 3600.0 / 4);
  EXPECT_DOUBLE_EQ(c.interval_seconds, std::sqrt(2 * c.write_seconds * c.cluster_mtbf_seconds));
  EXPECT_DOUBLE_EQ(c.lost_seconds, c.interval_seconds / 2);
  EXPECT_DOUBLE_EQ(c.pause_seconds, 12 * 13e9 / 32 / 25e9);
  EXPECT_GE(c.async_interval_seconds, c.write_seconds);
}

TEST(PlanTest, CustomDeviceTakesItsMeasuredFigures) {
  // A local 2-worker CPU run (--calibrate's path): no preset, every figure given.
  PlanInput in;
  in.layers = 2;
  in.width = 64;
  in.heads = 4;
  in.vocab = 256;
  in.context = 64;
  in.dataset_bytes = 1e6;
  in.bytes_per_token = 1;
  in.global_batch_tokens = 0;
  in.nodes = 1;
  in.gpus_per_node = 2;
  in.gpu = "cpu";
  in.gpu_memory_bytes = 8e9;
  in.gpu_flops = 50e9;
  in.intra_node_gbps = 2;
  in.host_copy_gbps = 5;
  in.memory_gbps = 10;
  const Plan plan = MustPlan(in);
  EXPECT_EQ(plan.device.name, "cpu");
  EXPECT_DOUBLE_EQ(plan.device.memory_gbps, 10);
  EXPECT_DOUBLE_EQ(plan.compute.total_seconds_high,
                   6 * plan.model.params * 1e6 / (2 * 50e9 * in.mfu_high));
  const Layout ddp = MustFind(plan, "DDP");
  EXPECT_DOUBLE_EQ(ddp.batch_sequences, 2);  // one sequence per worker
  ASSERT_EQ(ddp.collectives.size(), 1u);
  EXPECT_FALSE(ddp.collectives[0].inter_node);
  EXPECT_DOUBLE_EQ(ddp.collectives[0].seconds, 2 * 0.5 * 2 * plan.model.params / 2e9);
  EXPECT_DOUBLE_EQ(plan.checkpoint.pause_seconds, 12 * plan.model.params / 2 / 5e9);
}

// pscluster's CPU workers: everything in fp32 (4-byte activations, no dropout masks,
// 4-byte gradients on the wire) and the replica's own copies (24 bytes/param).
TEST(PlanTest, Fp32PrecisionAndAFrameworksReplicaBytes) {
  PlanInput in;
  in.layers = 4;
  in.width = 256;
  in.heads = 4;
  in.vocab = 256;
  in.context = 128;
  in.dataset_tokens = 2314000;
  in.bytes_per_token = 1;
  in.global_batch_tokens = 4096;
  in.micro_batch = 16;
  in.nodes = 1;
  in.gpus_per_node = 2;
  in.gpu = "cpu";
  in.gpu_memory_bytes = 12e9;
  in.gpu_flops = 100e9;
  in.intra_node_gbps = 2;
  in.host_copy_gbps = 5;
  in.memory_gbps = 10;
  in.precision = "fp32";
  in.state_bytes_per_param = 24;
  const Plan plan = MustPlan(in);
  const double s = 128, b = 16, h = 256, a = 4, v = 256, n = plan.model.params;
  const double layer = s * b * h * (64 + 4 * a * s / h);
  const Layout ddp = MustFind(plan, "DDP");
  EXPECT_DOUBLE_EQ(ddp.model_state_bytes, 24 * n);
  EXPECT_DOUBLE_EQ(ddp.activation_bytes, 4 * layer);
  EXPECT_DOUBLE_EQ(ddp.buffer_bytes, 4 * s * b * v + layer);
  EXPECT_DOUBLE_EQ(MustFind(plan, "ZeRO-3/FSDP").model_state_bytes, 16 * n / 2);
  // ZeRO-1 shards what the replica keeps beyond its weights and gradients: 8 + 16 / D.
  EXPECT_DOUBLE_EQ(MustFind(plan, "ZeRO-1").model_state_bytes, (8 + 16.0 / 2) * n);
  ASSERT_EQ(ddp.collectives.size(), 1u);  // a float32 gradient ring all-reduce
  EXPECT_DOUBLE_EQ(ddp.collectives[0].bytes, 2 * 0.5 * 4 * n);
  // The step: PaLM's FLOPs per token at the GEMM rate, then the element-wise kernels (54·h +
  // 6·a·s elements per token per layer, 6·V for the loss) and Adam's state read and written
  // at the memory bandwidth. 2 x 16 sequences of 128 tokens: 2048 tokens per worker.
  const double tokens = 2 * b * s;
  EXPECT_DOUBLE_EQ(ddp.gemm_seconds, (6 * n + 12 * 4 * s * h) * tokens / (2 * 100e9 * in.mfu_high));
  EXPECT_DOUBLE_EQ(ddp.memory_seconds,
                   (4 * tokens / 2 * (4 * (54 * h + 6 * a * s) + 6 * v) + 2 * 24 * n) / 10e9);
  EXPECT_DOUBLE_EQ(ddp.step_seconds,
                   ddp.gemm_seconds + ddp.memory_seconds + ddp.collectives[0].seconds);

  // Tensor parallelism without sequence parallelism (pscluster's TENSOR mode): the
  // LayerNorms' inputs and outputs and the residual adds stay whole on both workers.
  in.global_batch_tokens = 0;
  const Layout sp = MustFind(MustPlan(in), "T2xP1xD1");
  in.sequence_parallel = false;
  const Layout whole = MustFind(MustPlan(in), "T2xP1xD1");
  EXPECT_DOUBLE_EQ(sp.activation_bytes, 4 * layer / 2);
  EXPECT_DOUBLE_EQ(whole.activation_bytes, 4 * s * b * h * (16 + (48 + 4 * a * s / h) / 2));
  EXPECT_DOUBLE_EQ(whole.memory_seconds - sp.memory_seconds, 4 * b * s * 4 * 30 * h / 2 / 10e9);
  in.precision = "fp16";
  EXPECT_EQ(MakePlan(in).status().code(), absl::StatusCode::kInvalidArgument);
}

// A bad value is named even while required flags are missing (issue 49: a bad --precision
// was answered with a complaint about the dataset flags).
TEST(PlanTest, ABadValueIsNamedBeforeAMissingFlag) {
  PlanInput in;
  in.params = 1e9;
  in.precision = "fp8";
  const absl::Status s = MakePlan(in).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--precision=fp8"), absl::string_view::npos) << s;
}

TEST(PlanTest, PresetFiguresCanBeOverridden) {
  PlanInput in = Exercise13B();
  in.gpu_flops = 400e12;
  EXPECT_DOUBLE_EQ(MustPlan(in).device.flops, 400e12);
  EXPECT_DOUBLE_EQ(MustPlan(in).device.memory_bytes, 80.0 * (1 << 30));
}

TEST(PlanTest, InvalidInputNamesTheFlag) {
  PlanInput in = Exercise13B();
  in.nodes = 0;
  ExpectInvalid(in, "--nodes");
  in = Exercise13B();
  in.gpus_per_node = 0;
  ExpectInvalid(in, "--gpus_per_node");
  in = Small125M();
  in.heads = 7;
  ExpectInvalid(in, "--heads");
  in = Exercise13B();
  in.dataset_bytes = -1;
  ExpectInvalid(in, "--dataset_bytes");
  in = Exercise13B();
  in.params = -13e9;
  ExpectInvalid(in, "--params");
  in = Exercise13B();
  in.params = 0;
  ExpectInvalid(in, "--params");
  in = Exercise13B();
  in.dataset_tokens = 1e9;
  ExpectInvalid(in, "--dataset_tokens");
  in = Exercise13B();
  in.mfu_high = 0.3;
  ExpectInvalid(in, "--mfu_high");
  in = Exercise13B();
  in.bytes_per_token = std::nan("");
  ExpectInvalid(in, "--bytes_per_token=nan is not a finite number");
  in = Exercise13B();
  in.dataset_bytes = std::numeric_limits<double>::infinity();
  ExpectInvalid(in, "--dataset_bytes=inf is not a finite number");
  in = Exercise13B();
  in.gpu = "tpu-v9";
  ExpectInvalid(in, "--gpu_memory_bytes");
  in.gpu_memory_bytes = 32e9;
  ExpectInvalid(in, "--gpu_flops");
  in.gpu_flops = 100e12;
  in.intra_node_gbps = 300;
  in.host_copy_gbps = 25;
  ExpectInvalid(in, "--memory_gbps");
  in = Small125M();
  in.width = 0;
  ExpectInvalid(in, "--width");
  in = Small125M();  // a shape of ~0.1 B with --params 100x that
  in.params = 100 * MustPlan(Small125M()).model.shape_params;
  ExpectInvalid(in, "does not agree with the shape given");
}

// A data set smaller than one global batch still takes one whole step, not a fraction of
// one (it planned microseconds of wall time for a 65 s step).
TEST(PlanTest, ADataSetSmallerThanOneStepTakesAWholeStep) {
  PlanInput in = Exercise13B();
  in.dataset_bytes = 1;
  absl::StatusOr<Plan> plan = MakePlan(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->data.total_steps, 1);
  EXPECT_EQ(plan->compute.total_seconds_low, plan->compute.step_seconds_low);
  EXPECT_EQ(plan->compute.total_seconds_high, plan->compute.step_seconds_high);
}

TEST(PlanTest, InputBeyondAnyJobIsInvalidRatherThanOverflowing) {
  PlanInput in = Exercise13B();
  in.nodes = int64_t{1} << 40;
  ExpectInvalid(in, "--nodes");
  in = Exercise13B();
  in.dataset_bytes = 1e300;
  ExpectInvalid(in, "--dataset_bytes");
  in = Exercise13B();
  in.global_batch_tokens = 1e30;
  ExpectInvalid(in, "--global_batch_tokens");
}

}  // namespace
}  // namespace pscluster::plan
