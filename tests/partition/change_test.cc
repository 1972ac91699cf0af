// When a member of a ring leaves because its mark was removed
// (partition::MustLeave, ChangeMachine::Leaving), from ring views as the
// registry builds them: marks from .cluster/marks, members from their
// nodes.
#include "partition/change.h"

#include <catch2/catch.hpp>

#include "partition/ring.h"

using flatkv::partition::ChangeMachine;
using flatkv::partition::ChangeStep;
using flatkv::partition::Member;
using flatkv::partition::MustLeave;
using flatkv::partition::Ring;
using flatkv::partition::RingChange;
using flatkv::partition::RingSettings;

namespace {

Ring::Registration Reg(int64_t mark, const std::string& host, int64_t czxid) {
  return Ring::Registration{mark, Member{host, 9901, czxid}};
}

RingChange Change(const std::string& kind, int64_t mark, int64_t into, int64_t source,
                  const std::string& importer, const std::string& state, int64_t czxid) {
  RingChange c;
  c.kind = kind;
  c.mark = mark;
  c.into = into;
  c.source = source;
  c.importer = importer;
  c.state = state;
  c.ranges = {{1000, 1999}};
  c.czxid = czxid;
  return c;
}

}  // namespace

TEST_CASE("A removed mark's member leaves even if its session expired during the remove",
          "[partition][change]") {
  // Mark 2000 with this member (b1) and another; mark 1000 beside it.
  const auto before = Ring::Make(3, RingSettings{}, {1000, 2000},
                                 {Reg(1000, "a1", 1), Reg(2000, "b1", 5), Reg(2000, "b2", 6)});
  // The remove finished while b1 was cut off from ZooKeeper past its
  // session: mark 2000's node and both member nodes are gone.
  const auto after = Ring::Make(9, RingSettings{}, {1000}, {Reg(1000, "a1", 1)});

  ChangeMachine running(2000, "b1:9901");
  running.Join();
  CHECK_FALSE(running.Leaving(*before));
  CHECK(running.Leaving(*after));
  // ... and makes no step: it does not add its mark back.
  CHECK(running.Next(*after, false).kind == ChangeStep::kWait);

  // A new process on the removed mark's data has not seen the mark: it
  // adds it again (a new mark), the way a member of a new mark does.
  ChangeMachine restarted(2000, "b1:9901");
  restarted.Join();
  CHECK_FALSE(restarted.Leaving(*after));
  CHECK(restarted.Next(*after, false).kind != ChangeStep::kWait);
  CHECK_FALSE(MustLeave(*after, 2000, /*mark_seen=*/false));
  CHECK(MustLeave(*after, 2000, /*mark_seen=*/true));
}

TEST_CASE("A member does not leave while its mark is in the ring, with or without members",
          "[partition][change]") {
  // Its own session expired, the mark stays: it registers again.
  const auto expired = Ring::Make(4, RingSettings{}, {1000, 2000}, {Reg(1000, "a1", 1)});
  ChangeMachine m(2000, "b1:9901");
  CHECK_FALSE(m.Leaving(*Ring::Make(3, RingSettings{}, {1000, 2000},
                                    {Reg(1000, "a1", 1), Reg(2000, "b1", 5)})));
  CHECK_FALSE(m.Leaving(*expired));
  // No marks at all (ZooKeeper's data lost): nothing says the mark was removed.
  CHECK_FALSE(m.Leaving(*Ring::Make(5, RingSettings{}, {}, {})));
  // A member listed without its mark's node: the node was deleted.
  CHECK(MustLeave(*Ring::Make(6, RingSettings{}, {1000}, {Reg(1000, "a1", 1), Reg(2000, "b2", 6)}),
                  2000, /*mark_seen=*/false));
}

TEST_CASE("A remove's importer cut off past its session does not delete the node of the mark "
          "added back since",
          "[partition][change]") {
  // a1 heads mark 1000 and imports the remove of mark 2000; it flipped the
  // change and mark 2000's members have left, so its next step deletes mark
  // 2000's node. It is cut off from ZooKeeper then (the delete times out);
  // meanwhile another head of mark 1000 finishes the remove (mark node and
  // change node deleted), and mark 2000 is added back: a new node of the
  // same name, its importer still copying.
  const RingChange remove = Change("remove", 2000, 1000, 2000, "a1:9901", "flip", 50);
  const auto flipped = Ring::Make(10, RingSettings{}, {1000, 2000}, {Reg(1000, "a1", 1)}, {},
                                  remove);
  ChangeMachine a1(1000, "a1:9901");
  a1.Join();
  const ChangeStep del = a1.Next(*flipped, /*head=*/true);
  REQUIRE(del.kind == ChangeStep::kDeleteMark);
  a1.Done(del, flatkv::Status::IOError("zookeeper delete: operation timeout"));

  const RingChange add = Change("add", 2000, 2000, 1000, "b1:9901", "precopy", 80);
  // Back, a1 sees the add running, or (a view read between the two
  // changes, or after the add) no change node at all beside the mark's
  // new node: either way the remove is over, and it deletes nothing.
  for (const auto& change : {std::optional<RingChange>(add), std::optional<RingChange>()}) {
    ChangeMachine back = a1;
    const auto later = Ring::Make(14, RingSettings{}, {1000, 2000}, {Reg(1000, "a1", 1)}, {},
                                  change);
    const ChangeStep next = back.Next(*later, /*head=*/true);
    CHECK(next.kind != ChangeStep::kDeleteMark);
    CHECK(next.kind != ChangeStep::kDelete);
    CHECK_FALSE(back.Leaving(*later));
  }
}
