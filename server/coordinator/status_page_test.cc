#include "server/coordinator/status_page.h"

#include <fstream>
#include <iterator>

#include "common/testing/http_get.h"
#include "common/testing/idle_connections.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pscluster::coord {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

ClusterView TwoWorkersOneShard(int64_t now_ms) {
  ClusterView v;
  v.set_version(7);
  v.set_num_shards(1);
  v.set_num_workers(2);
  v.set_mode(ALLREDUCE);
  v.set_initial_mode(PS);
  v.set_global_step(40);
  v.add_shard_addresses("<script>alert('x')</script>:5000");
  Member* s = v.add_members();
  s->set_role(SHARD);
  s->set_address("<script>alert('x')</script>:5000");
  s->set_alive(true);
  s->set_last_heartbeat_ms(now_ms - 1500);
  for (int r = 0; r < 2; ++r) {
    Member* w = v.add_members();
    w->set_role(WORKER);
    w->set_id(r);
    w->set_alive(r == 0);
    w->set_step(40 + r);
    w->set_loss(0.5);
    w->set_last_heartbeat_ms(now_ms - 9000);
  }
  SwitchRecord* sw = v.add_switches();
  sw->set_switch_id(1);
  sw->set_at_step(20);
  sw->set_from_mode(PS);
  sw->set_to_mode(ALLREDUCE);
  Checkpoint* c = v.add_checkpoints();
  c->set_step(32);
  c->set_has_metric(true);
  c->set_metric(0.84);
  return v;
}

TEST(StatusPageTest, ShowsEveryMemberTheModeSwitchesCheckpointsAndCurves) {
  const absl::Time now = absl::FromUnixSeconds(1800000000);
  ProgressHistory history;
  for (int step = 10; step <= 40; step += 10) {
    ReportProgressRequest r;
    r.set_rank(0);
    r.set_step(step);
    r.set_loss(1.0 / step);
    r.set_samples_per_sec(1000 + step);
    history.Record(r);
  }
  ReportProgressRequest eval;
  eval.set_rank(0);
  eval.set_step(40);
  eval.set_has_metric(true);
  eval.set_metric(0.84);
  history.Record(eval);
  const std::string page =
      RenderStatusPage(TwoWorkersOneShard(absl::ToUnixMillis(now)), history.Curves(), now);
  EXPECT_THAT(page, HasSubstr("<meta http-equiv=\"refresh\""));
  EXPECT_THAT(page, HasSubstr("<b id=\"mode\">allreduce</b>"));
  EXPECT_THAT(page, HasSubstr("data-role=\"shard\" data-id=\"0\""));
  EXPECT_THAT(page, HasSubstr("data-role=\"worker\" data-id=\"0\""));
  EXPECT_THAT(page, HasSubstr("data-role=\"worker\" data-id=\"1\""));
  EXPECT_THAT(page, HasSubstr("class=\"dead\">DEAD"));
  EXPECT_THAT(page, HasSubstr("1.5 s"));  // the shard's heartbeat age
  EXPECT_THAT(page, HasSubstr("<td>32</td><td>0.84</td><td>yes</td>"));
  EXPECT_THAT(page, HasSubstr("<td>1</td><td>20</td><td>ps</td><td>allreduce</td>"));
  // Four loss and rate points, one metric point, for worker 0; none for worker 1.
  EXPECT_THAT(page, HasSubstr("class=\"curve\" data-worker=\"0\" data-points=\"4\""));
  EXPECT_THAT(page, HasSubstr("class=\"curve\" data-worker=\"0\" data-points=\"1\""));
  EXPECT_THAT(page, Not(HasSubstr("data-worker=\"1\"")));
}

TEST(StatusPageTest, EscapesEverythingItPrints) {
  const absl::Time now = absl::FromUnixSeconds(1800000000);
  const std::string page = RenderStatusPage(TwoWorkersOneShard(absl::ToUnixMillis(now)), {}, now);
  EXPECT_THAT(page, Not(HasSubstr("<script>")));
  EXPECT_THAT(page, HasSubstr("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;:5000"));
  EXPECT_EQ(HtmlEscape("a&b\"c'<>"), "a&amp;b&quot;c&#39;&lt;&gt;");
  EXPECT_THAT(page, HasSubstr("no reports yet"));
}

// A finished run's page outlives the coordinator: a file that does not refresh itself (a
// reload of a static file would only blink) and says the run finished.
TEST(StatusPageTest, WritesAFinishedRunsPageAsAStaticFile) {
  const absl::Time now = absl::FromUnixSeconds(1800000000);
  ClusterView view = TwoWorkersOneShard(absl::ToUnixMillis(now));
  view.set_finished(true);
  const std::string path = ::testing::TempDir() + "/status.html";
  ASSERT_TRUE(WriteStatusPage(path, view, {}, now).ok());
  std::ifstream in(path);
  const std::string page((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_THAT(page, HasSubstr("<b id=\"finished\">run finished</b>"));
  EXPECT_THAT(page, Not(HasSubstr("http-equiv=\"refresh\"")));
  EXPECT_THAT(page, HasSubstr("</html>"));
  EXPECT_FALSE(WriteStatusPage("/nonexistent-dir/status.html", view, {}, now).ok());
}

TEST(ProgressHistoryTest, KeepsTheWholeRunInBoundedMemory) {
  ProgressHistory history(8);
  for (int step = 0; step < 1000; ++step) {
    ReportProgressRequest r;
    r.set_rank(3);
    r.set_step(step);
    r.set_samples_per_sec(1);
    history.Record(r);
  }
  const WorkerCurves c = history.Curves().at(3);
  ASSERT_LE(c.loss.size(), 8u);
  EXPECT_EQ(c.loss.front().step, 0);
  EXPECT_EQ(c.loss.back().step, 999);
  for (size_t i = 1; i < c.loss.size(); ++i) EXPECT_LT(c.loss[i - 1].step, c.loss[i].step);
}

std::string Get(int port, const std::string& path) { return testing::HttpGet(port, path); }

TEST(StatusPageServerTest, ServesThePageAtTheRootOnly) {
  ClusterStateOptions options;
  options.num_shards = 1;
  options.num_workers = 1;
  ClusterState cluster(options);
  ProgressHistory history;
  auto server = StatusPageServer::Start("127.0.0.1", 0, &cluster, &history);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string page = Get((*server)->port(), "/");
  EXPECT_THAT(page, HasSubstr("200 OK"));
  EXPECT_THAT(page, HasSubstr("Content-Type: text/html"));
  EXPECT_THAT(page, HasSubstr("<h1>pscluster</h1>"));
  EXPECT_THAT(Get((*server)->port(), "/etc/passwd"), HasSubstr("404"));
  auto taken = StatusPageServer::Start("127.0.0.1", (*server)->port(), &cluster, &history);
  ASSERT_FALSE(taken.ok());
  EXPECT_THAT(std::string(taken.status().message()), HasSubstr("cannot serve the status page"));
}

// Slowloris (issue 49): the page answers while 24 connections hold half a request each.
TEST(StatusPageServerTest, AnswersWhileIdleConnectionsHang) {
  ClusterStateOptions options;
  ClusterState cluster(options);
  ProgressHistory history;
  auto server = StatusPageServer::Start("127.0.0.1", 0, &cluster, &history);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::vector<int> idle = testing::OpenHalfRequests((*server)->port(), 24);
  ASSERT_EQ(idle.size(), 24u);
  EXPECT_THAT(Get((*server)->port(), "/"), HasSubstr("200 OK"));
  int open = 0;
  for (int fd : idle) open += testing::StillOpen(fd) ? 1 : 0;
  EXPECT_EQ(open, 24) << "the page was answered only after the server dropped idle connections";
  for (int fd : idle) close(fd);
}

}  // namespace
}  // namespace pscluster::coord
