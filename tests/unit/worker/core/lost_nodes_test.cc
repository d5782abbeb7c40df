// Which of a group's nodes the rendezvous left out (core/lost_nodes.h), as
// read from the marks it sets under --on_failure=heal (lost_nodes_key):
// only a mark set after the first reading is news, a node of another group
// or round is not reported, and a PeerWatch's wait stops at the first.

#include "core/lost_nodes.h"

#include <gtest/gtest.h>

#include "core/peer_watch.h"
#include "ddp/common/rendezvous_types.h"
#include "ddp/store.h"

namespace ddp::detail {
namespace {

using namespace std::chrono_literals;

// What the rendezvous sets when it leaves node `node` out of round `round`.
void leave_out(Store& store, std::int64_t round, int node, const std::string& why) {
  const std::int64_t k = store.add(lost_nodes_key(round), 1);
  store.set(lost_node_key(round, k), std::to_string(node) + " " + why);
}

TEST(LostNodes, OnlyANodeOfTheGroupLeftOutAfterTheFirstReadingIsNews) {
  const auto store = make_memory_store();
  leave_out(*store, 3, 1, "before the group");  // its ranks are in no group made since
  LostNodes lost(store, 3, {0, 1, 2});
  EXPECT_EQ(lost.first_lost(), std::nullopt);
  EXPECT_FALSE(lost.lost(1));
  leave_out(*store, 4, 2, "another round");
  leave_out(*store, 3, 5, "a node of another group");
  EXPECT_EQ(lost.first_lost(), std::nullopt);
  EXPECT_TRUE(lost.lost(5));  // seen all the same
  leave_out(*store, 3, 2, "node 2 (host 'h2') stopped sending heartbeats for 2.0s");
  const std::string said =
      "node 2 was left out by the rendezvous (node 2 (host 'h2') stopped sending heartbeats "
      "for 2.0s)";
  EXPECT_EQ(lost.first_lost(), said);
  EXPECT_TRUE(lost.lost(2));
  EXPECT_FALSE(lost.lost(0));
  leave_out(*store, 3, 0, "later");
  EXPECT_EQ(lost.first_lost(), said);  // the first answer stays
  lost.refresh();
  EXPECT_TRUE(lost.lost(0));
}

TEST(LostNodes, AMarkCountedButNotYetSetIsReadNextTime) {
  const auto store = make_memory_store();
  LostNodes lost(store, 1, {0, 1});
  store->add(lost_nodes_key(1), 1);
  EXPECT_EQ(lost.first_lost(), std::nullopt);
  store->set(lost_node_key(1, 1), "1 gone");
  EXPECT_EQ(lost.first_lost(), "node 1 was left out by the rendezvous (gone)");
}

// A store that fails every call while `down`.
class FlakyStore : public Store {
 public:
  bool down = true;
  void set(const std::string& k, const std::string& v) override { up().set(k, v); }
  std::string get(const std::string& k, std::chrono::milliseconds t) override {
    return up().get(k, t);
  }
  std::int64_t add(const std::string& k, std::int64_t d) override { return up().add(k, d); }
  void wait(const std::vector<std::string>& k, std::chrono::milliseconds t) override {
    up().wait(k, t);
  }
  bool remove(const std::string& k) override { return up().remove(k); }

 private:
  Store& up() {
    if (down) throw Error("store unreachable");
    return *inner_;
  }
  std::shared_ptr<Store> inner_ = make_memory_store();
};

TEST(LostNodes, WithoutTheFirstCountNothingIsNewsAndAnUnreachableStoreIsNoNews) {
  const auto flaky = std::make_shared<FlakyStore>();
  LostNodes blind(flaky, 1, {0, 1});  // which marks came before it cannot be told
  flaky->down = false;
  leave_out(*flaky, 1, 1, "gone");
  EXPECT_EQ(blind.first_lost(), std::nullopt);

  LostNodes watching(flaky, 1, {0, 1});
  flaky->down = true;
  EXPECT_EQ(watching.first_lost(), std::nullopt);
  flaky->down = false;
  leave_out(*flaky, 1, 0, "gone too");
  EXPECT_EQ(watching.first_lost(), "node 0 was left out by the rendezvous (gone too)");
}

// A wait of the Gloo backend on a rank of another machine: that machine
// died with its link (nothing closes), and the rendezvous left its node out.
TEST(LostNodes, APeerWatchsWaitStopsOnceTheRendezvousLeftOutANodeOfTheGroup) {
  const auto job = make_memory_store();
  const auto group = make_prefix_store(job, "pg");
  PeerWatch::Clock::time_point at{};
  PeerWatch watch(group, 0, 0, 1, nullptr, LostNodes(job, 2, {0, 1}), [&] { return at; });
  EXPECT_EQ(watch.gone(1), std::nullopt);
  leave_out(*job, 2, 1, "node 1 (host 'h1') stopped sending heartbeats for 2.0s");
  EXPECT_EQ(watch.gone(1), std::nullopt);  // the store was asked less than 200 ms ago
  at += 200ms;
  EXPECT_EQ(watch.gone(1),
            "node 1 was left out by the rendezvous (node 1 (host 'h1') stopped sending "
            "heartbeats for 2.0s)");
  EXPECT_EQ(watch.first_left(), watch.gone(1));
}

}  // namespace
}  // namespace ddp::detail
