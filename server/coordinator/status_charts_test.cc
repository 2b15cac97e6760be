#include "server/coordinator/status_charts.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/coordinator/status_page.h"

namespace pscluster::coord {
namespace {

using ::testing::DoubleNear;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::Pointwise;

TEST(StatusChartsTest, TicksAreRoundNumbersInsideTheRange) {
  auto near = [](std::vector<double> want) {
    return Pointwise(DoubleNear(1e-12), std::move(want));
  };
  EXPECT_THAT(Ticks(0, 100), near({0, 20, 40, 60, 80, 100}));
  EXPECT_THAT(Ticks(0.856, 0.895), near({0.86, 0.87, 0.88, 0.89}));
  EXPECT_THAT(Ticks(-1, 1), near({-1, -0.5, 0, 0.5, 1}));
  EXPECT_TRUE(Ticks(3, 3).empty());
}

// Regression (issue 50): the accuracy axis was fixed at 0..1, so 0.856 -> 0.895 drew as a
// flat line; a single point drew nothing.
TEST(StatusChartsTest, TheAxisFitsTheDataAndALonePointShows) {
  const std::vector<ProgressPoint> accuracy = {{100, 0.856}, {200, 0.881}, {300, 0.895}};
  const std::string svg = LineChart("metric-chart", "test accuracy", {{0, &accuracy}}, {});
  EXPECT_THAT(svg, HasSubstr(">0.86</text>"));
  EXPECT_THAT(svg, HasSubstr(">0.89</text>"));
  EXPECT_THAT(svg, Not(HasSubstr(">1</text>")));
  EXPECT_THAT(svg, HasSubstr("worker 0: 0.895"));
  const std::vector<ProgressPoint> one = {{40, 0.84}};
  const std::string lone = LineChart("c", "t", {{1, &one}}, {});
  EXPECT_THAT(lone, HasSubstr("data-points=\"1\""));
  EXPECT_THAT(lone, HasSubstr("<circle"));
  EXPECT_THAT(LineChart("c", "t", {}, {}), HasSubstr("no reports yet"));
}

TEST(StatusChartsTest, SwitchesCheckpointsAndTheRollbackAreMarkedWhereTheyFall) {
  ClusterView view;
  SwitchRecord* s = view.add_switches();
  s->set_at_step(150);
  s->set_from_mode(PS);
  s->set_to_mode(ALLREDUCE);
  view.add_checkpoints()->set_step(200);
  view.add_checkpoints()->set_step(9000);  // outside the data: no marker
  view.mutable_rollback()->set_decided(true);
  view.mutable_rollback()->set_step(200);
  const std::vector<ChartEvent> events = ChartEvents(view);
  ASSERT_EQ(events.size(), 4u);
  const std::vector<ProgressPoint> loss = {{100, 2.0}, {300, 1.0}};
  const std::string svg = LineChart("loss-chart", "training loss", {{0, &loss}}, events);
  EXPECT_THAT(svg, HasSubstr("class=\"event switch\""));
  EXPECT_THAT(svg, HasSubstr("<title>switch ps -&gt; allreduce at step 150</title>"));
  EXPECT_THAT(svg, HasSubstr("<title>checkpoint of step 200</title>"));
  EXPECT_THAT(svg, HasSubstr("<title>rollback to step 200</title>"));
  EXPECT_THAT(svg, Not(HasSubstr("step 9000")));
}

// Issue 50: the step-time split per worker, so that a straggler shows.
TEST(StatusChartsTest, StepTimeBarsShowAStraggler) {
  ClusterView view;
  EXPECT_THAT(StepTimeChart(view), HasSubstr("no reports yet"));
  for (int rank = 0; rank < 2; ++rank) {
    Member* w = view.add_members();
    w->set_role(WORKER);
    w->set_id(rank);
    w->mutable_step_time()->set_compute_ms(rank == 1 ? 80 : 20);       // rank 1 is slow
    w->mutable_step_time()->set_communication_ms(rank == 1 ? 5 : 65);  // rank 0 waits
    w->mutable_step_time()->set_other_ms(15);
  }
  view.add_members()->set_role(SHARD);
  const std::string svg = StepTimeChart(view);
  // Both totals are 100 ms: full width (300) each; compute 60 and 240 wide.
  EXPECT_THAT(svg,
              HasSubstr("class=\"compute\" data-worker=\"0\" x=\"70.0\" y=\"26\" width=\"60.0\""));
  EXPECT_THAT(svg,
              HasSubstr("class=\"compute\" data-worker=\"1\" x=\"70.0\" y=\"48\" width=\"240.0\""));
  EXPECT_THAT(svg, HasSubstr("<title>communication 65 ms</title>"));
  EXPECT_THAT(svg, Not(HasSubstr("worker 2")));
}

TEST(StatusChartsTest, ChartsComeBeforeTheTables) {
  const std::string page = RenderStatusPage(ClusterView(), {}, absl::FromUnixSeconds(1800000000));
  EXPECT_LT(page.find("id=\"loss-chart\""), page.find("id=\"members\""));
}

}  // namespace
}  // namespace pscluster::coord
