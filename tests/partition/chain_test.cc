// ChainMember (partition/chain.h), one behaviour at a time, driven by hand:
// the rules a user relies on, each in a small scripted scenario. The
// seeded simulation (chain_sim_test.cc) covers their interleavings.
#include "partition/chain.h"

#include <catch2/catch.hpp>

#include <map>
#include <memory>
#include <string>
#include <vector>

using flatkv::partition::ChainConfig;
using flatkv::partition::ChainMember;
using flatkv::partition::ChainMessage;
using flatkv::partition::ChainOptions;
using flatkv::partition::ChainOutput;
using flatkv::partition::ChainPosition;

namespace {

// The session timeout ZooKeeper grants in these tests: a member's lease
// runs half of it from the send time of its last answered request.
constexpr int64_t kSessionMs = 6000;

// A chain of named members with a hand-cranked network: Deliver() moves
// every message sent so far, in order, until none is left (or just once).
struct Net {
  std::map<std::string, std::unique_ptr<ChainMember>> members;
  std::vector<std::pair<std::string, ChainOutput::Send>> wire;  // from, send
  std::map<std::string, std::vector<uint64_t>> applied;         // seqs applied per member
  std::map<uint64_t, bool> replies;                             // request -> ok
  std::vector<std::string> record;                              // last record asked for
  std::vector<uint64_t> reads;                                  // parked reads served
  int64_t now = 0;
  ChainOptions options;

  // A member whose ZooKeeper session has just answered (it holds a lease).
  ChainMember& Add(const std::string& name, ChainPosition durable = {}) {
    members[name] = std::make_unique<ChainMember>(name, options, durable);
    Answered(name);
    return *members[name];
  }
  // ZooKeeper answered a request "name" sent at "sent" (now by default).
  void Answered(const std::string& name, int64_t sent = -1) {
    ChainOutput out;
    members.at(name)->OnSessionAnswer(sent < 0 ? now : sent, kSessionMs, now, &out);
    Take(name, out);
  }
  void Tick(const std::string& name) {
    ChainOutput out;
    members.at(name)->OnTick(now, &out);
    Take(name, out);
  }
  void Take(const std::string& from, const ChainOutput& out) {
    for (const auto& e : out.apply) applied[from].push_back(e.seq);
    for (const auto& s : out.sends) wire.emplace_back(from, s);
    for (const auto& r : out.replies) replies[r.request] = r.status.ok();
    for (uint64_t r : out.reads) reads.push_back(r);
    if (!out.record.empty()) record = out.record;
  }
  void Config(const ChainConfig& c) {
    for (auto& [name, m] : members) {
      ChainOutput out;
      m->OnConfig(c, now, &out);
      Take(name, out);
    }
  }
  void Deliver() {
    while (!wire.empty()) {
      auto [from, send] = wire.front();
      wire.erase(wire.begin());
      auto it = members.find(send.to);
      if (it == members.end()) continue;
      ChainOutput out;
      it->second->OnMessage(from, send.msg, now, &out);
      Take(send.to, out);
    }
  }
  // Delivers the first message on the wire of kind "kind"; false if none.
  bool DeliverFirst(ChainMessage::Kind kind) {
    for (size_t i = 0; i < wire.size(); ++i) {
      if (wire[i].second.msg.kind != kind) continue;
      auto [from, send] = wire[i];
      wire.erase(wire.begin() + static_cast<std::ptrdiff_t>(i));
      ChainOutput out;
      members.at(send.to)->OnMessage(from, send.msg, now, &out);
      Take(send.to, out);
      return true;
    }
    return false;
  }
  // Passes the newest write down "hops" members (kReplicate only).
  void PassDown(int hops) {
    for (int i = 0; i < hops; ++i) REQUIRE(DeliverFirst(ChainMessage::Kind::kReplicate));
  }
  // Members "names" with epochs 1..n, registered, told the (recorded)
  // chain of id "id", and every first message delivered.
  void Start(const std::vector<std::string>& names, uint64_t id, bool sync = true);
  void Write(const std::string& at, uint64_t request, uint64_t key) {
    ChainOutput out;
    members.at(at)->OnWrite(request, {key}, "op" + std::to_string(request), now, &out);
    Take(at, out);
  }
};

ChainConfig Make(int64_t version, uint64_t id, std::vector<std::string> members,
                 std::vector<int64_t> epochs, bool sync = true) {
  ChainConfig c;
  c.version = version;
  c.id = id;
  c.members = std::move(members);
  c.epochs = std::move(epochs);
  c.sync = sync;
  c.recorded = c.members;  // recorded already (the head asks when it is not)
  c.recorded_version = version;
  c.recorded_zxid = 1000;   // after every registration
  return c;
}

// Registers each member of "names" with its epoch, as the shell would.
void Register(Net& net, const std::vector<std::string>& names, const std::vector<int64_t>& epochs) {
  for (size_t i = 0; i < names.size(); ++i) net.members.at(names[i])->OnRegistered(epochs[i], 0, net.now);
}

void Net::Start(const std::vector<std::string>& names, uint64_t id, bool sync) {
  std::vector<int64_t> epochs;
  for (const std::string& name : names) {
    Add(name);
    epochs.push_back(static_cast<int64_t>(epochs.size()) + 1);
  }
  Register(*this, names, epochs);
  Config(Make(1, id, names, epochs, sync));
  Deliver();
}

}  // namespace

TEST_CASE("each chain role has the name stats, NodeInfo.role and the logs use") {
  using flatkv::partition::ChainRole;
  using flatkv::partition::RoleName;
  CHECK(std::string(RoleName(ChainRole::kNone)) == "none");
  CHECK(std::string(RoleName(ChainRole::kSyncing)) == "syncing");
  CHECK(std::string(RoleName(ChainRole::kFenced)) == "fenced");
  CHECK(std::string(RoleName(ChainRole::kSingle)) == "single");
  CHECK(std::string(RoleName(ChainRole::kHead)) == "head");
  CHECK(std::string(RoleName(ChainRole::kMiddle)) == "middle");
  CHECK(std::string(RoleName(ChainRole::kTail)) == "tail");
  ChainMember fresh("a:1", ChainOptions{}, ChainPosition{}, /*intact=*/true);
  CHECK(fresh.chain_role() == ChainRole::kNone);
  CHECK(std::string(fresh.role()) == "none");
}

TEST_CASE("read repair at the head: a write not yet committed before another member's copy") {
  using RepairFrom = ChainMember::RepairFrom;
  Net net;
  net.Start({"a", "b", "c"}, 7);
  ChainMember& head = *net.members["a"];
  // A good copy here is written through the chain as it is.
  CHECK(ChainMember::ChooseRepair(true, false, false) == RepairFrom::kOwn);
  CHECK(ChainMember::ChooseRepair(true, true, true) == RepairFrom::kOwn);
  // Damaged here while the head holds a write of the key the tail has not
  // applied: that write is the newest value, newer than any member's copy.
  net.Write("a", 100, 5);
  REQUIRE(head.NewestUncommitted(5) != nullptr);
  CHECK(head.NewestUncommitted(6) == nullptr);
  CHECK(ChainMember::ChooseRepair(false, head.NewestUncommitted(5) != nullptr, false) ==
        RepairFrom::kUncommitted);
  // Once committed every member holds it: another member's copy is asked
  // for, and used once it is at hand.
  net.Deliver();
  REQUIRE(net.replies.count(100) == 1);
  CHECK(head.NewestUncommitted(5) == nullptr);
  CHECK(ChainMember::ChooseRepair(false, false, false) == RepairFrom::kFetch);
  CHECK(ChainMember::ChooseRepair(false, false, true) == RepairFrom::kCopy);
}

TEST_CASE("sync: a write is answered only once the tail applied it, and reads go to the tail") {
  Net net;
  net.Start({"a", "b", "c"}, 7);
  net.Write("a", 100, 5);
  CHECK(net.replies.count(100) == 0);  // not yet: nothing reached the tail
  CHECK(net.applied["a"] == std::vector<uint64_t>{1});
  net.Deliver();
  CHECK(net.applied["c"] == std::vector<uint64_t>{1});
  REQUIRE(net.replies.count(100) == 1);
  CHECK(net.replies[100]);
  ChainOutput out;
  CHECK(net.members["c"]->OnRead(1, 5, net.now, &out) == ChainMember::Read::kServe);
  CHECK(net.members["a"]->OnRead(2, 5, net.now, &out) == ChainMember::Read::kRefuse);
  CHECK(net.members["b"]->OnRead(3, 5, net.now, &out) == ChainMember::Read::kRefuse);
}

TEST_CASE("sync, direct commit: the tail's kCommit answers at the head before the middle's ack") {
  using Kind = ChainMessage::Kind;
  Net net;
  net.Start({"a", "b", "c"}, 7);
  net.Write("a", 100, 5);
  net.PassDown(2);                              // a -> b -> c
  CHECK(net.replies.count(100) == 0);
  REQUIRE(net.DeliverFirst(Kind::kCommit));     // c -> a, straight
  REQUIRE(net.replies.count(100) == 1);
  CHECK(net.replies[100]);
  // The relayed ack still comes (the middle's position, its log trimmed).
  net.Deliver();
  CHECK(net.members["b"]->committed() == 1);

  // Only the current tail's, under this chain: a middle's or another
  // chain's kCommit answers nothing.
  net.Write("a", 101, 6);
  net.PassDown(1);                              // a -> b only
  for (auto [from, chain] : {std::pair<std::string, uint64_t>{"b", 7}, {"c", 8}}) {
    ChainMessage m;
    m.kind = Kind::kCommit;
    m.chain = chain;
    m.applied = m.committed = 2;
    ChainOutput out;
    net.members["a"]->OnMessage(from, m, net.now, &out);
    net.Take("a", out);
    CHECK(net.replies.count(101) == 0);
  }
  net.Deliver();
  CHECK(net.replies.count(101) == 1);
}

TEST_CASE("sync, commit through the relayed acks only: the head waits for the middle's ack") {
  using Kind = ChainMessage::Kind;
  Net net;
  net.options.direct_commit = false;
  net.Start({"a", "b", "c"}, 7);
  net.Write("a", 100, 5);
  net.PassDown(2);
  CHECK_FALSE(net.DeliverFirst(Kind::kCommit));
  REQUIRE(net.DeliverFirst(Kind::kAck));  // c -> b
  CHECK(net.replies.count(100) == 0);
  REQUIRE(net.DeliverFirst(Kind::kAck));  // b -> a
  CHECK(net.replies.count(100) == 1);
}

TEST_CASE("sync, members send before they sync (storage.sync: always): the tail reads what the head committed") {
  Net net;
  net.options.sends_before_sync = true;
  net.Start({"a", "b", "c"}, 7);
  net.Write("a", 100, 5);
  net.PassDown(2);  // a -> b -> c
  // c applied it; a and b may not have synced it yet (a power cut there
  // and a restart of the chain from a or b would lose it): a read of the
  // key waits, a read of another key does not.
  ChainOutput out;
  CHECK(net.members["c"]->OnRead(1, 5, net.now, &out) == ChainMember::Read::kWait);
  CHECK(net.members["c"]->OnRead(2, 6, net.now, &out) == ChainMember::Read::kServe);
  net.Deliver();  // acks up, then the head's commit point down
  CHECK(net.replies[100]);
  CHECK(net.reads == std::vector<uint64_t>{1});
  CHECK(net.members["c"]->OnRead(3, 5, net.now, &out) == ChainMember::Read::kServe);
}

TEST_CASE("a verified member refuses a snapshot: its store is never emptied for one") {
  Net net;
  net.Start({"a", "b", "c"}, 7);
  net.Write("a", 100, 5);
  net.Deliver();
  REQUIRE(net.replies[100]);
  // A stale or confused offer from its own predecessor: b holds every
  // committed write, so it keeps its store and its place.
  ChainOutput out;
  const uint64_t refused = net.members["b"]->refused_messages();
  CHECK(net.members["b"]->OnSnapshotBegin("a", {1, 1}, net.now, &out) == 0);
  CHECK_FALSE(out.wipe);
  CHECK_FALSE(out.deregister);
  CHECK(net.members["b"]->refused_messages() == refused + 1);
  CHECK(std::string(net.members["b"]->role()) == "middle");
  CHECK(net.members["b"]->applied().seq == 1);
  // And it goes on applying writes.
  net.Write("a", 101, 6);
  net.Deliver();
  CHECK(net.replies[101]);
  CHECK(net.members["b"]->applied().seq == 2);
}

TEST_CASE("async: the head answers after its own apply, and any member reads") {
  Net net;
  net.Start({"a", "b"}, 7, /*sync=*/false);
  net.Write("a", 100, 5);
  REQUIRE(net.replies.count(100) == 1);  // before anything was delivered
  CHECK(net.applied["b"].empty());
  net.Deliver();
  CHECK(net.applied["b"] == std::vector<uint64_t>{1});
  CHECK(net.members["a"]->lag_writes() == 0);
  ChainOutput out;
  CHECK(net.members["a"]->OnRead(1, 5, net.now, &out) == ChainMember::Read::kServe);
}

TEST_CASE("writes are batched: many client writes go down in one message") {
  Net net;
  net.Start({"a", "b"}, 7);
  ChainOutput out;
  for (uint64_t r = 1; r <= 50; ++r) net.members["a"]->OnWrite(r, {r}, "x", 0, &out);
  size_t replicates = 0, entries = 0;
  for (const auto& s : out.sends) {
    if (s.msg.kind == ChainMessage::Kind::kReplicate) {
      ++replicates;
      entries += s.msg.entries.size();
    }
  }
  CHECK(replicates == 1);
  CHECK(entries == 50);
}

TEST_CASE("a message from another chain is refused: a woken old head gets no ack") {
  Net net;
  net.Start({"a", "b", "c"}, 7);
  // ZooKeeper dropped "a"; b and c know, a does not (it was paused).
  ChainConfig next = Make(2, 8, {"b", "c"}, {2, 3});
  for (const char* name : {"b", "c"}) {
    ChainOutput out;
    net.members[name]->OnConfig(next, 0, &out);
    net.Take(name, out);
  }
  net.Deliver();
  uint64_t refused_before = net.members["b"]->refused_messages();
  net.Write("a", 200, 9);  // a still believes it leads
  net.Deliver();
  CHECK(net.members["b"]->refused_messages() > refused_before);
  CHECK(net.replies.count(200) == 0);  // never acknowledged
  CHECK(net.applied["c"].empty());     // and the current chain does not hold it
  // The new head takes writes.
  net.Write("b", 201, 9);
  net.Deliver();
  CHECK(net.replies[201]);
}

TEST_CASE("the lease runs half a session timeout from the send time of the last answer") {
  Net net;
  net.now = 1000;
  net.Start({"a", "b"}, 7);  // answered at 1000: leased until 1000 + 3000
  ChainMember& a = *net.members["a"];
  CHECK(a.leased(3999));
  CHECK_FALSE(a.leased(4000));
  // An answer that took long counts from when its request was sent, so it
  // renews less: sent at 2000, answered at 4500 (ZooKeeper could expire
  // the session 6000 after it last heard from it, 2000 at the earliest).
  net.now = 4500;
  net.Answered("a", 2000);
  CHECK(a.leased(4999));
  CHECK_FALSE(a.leased(5000));
  // An answer to an earlier request never shortens it.
  net.Answered("a", 1500);
  CHECK(a.leased(4999));
  // One whose lease had ended by the time it came back renews nothing.
  net.now = 9000;
  net.Answered("a", 5000);
  CHECK_FALSE(a.leased(9000));
}

TEST_CASE("without a lease a head refuses writes at once and fails those waiting") {
  Net net;
  net.Start({"a", "b"}, 7);
  // A write still waiting for the tail's ack when the lease ends is failed
  // (it may still commit); nothing is left hanging for the client.
  net.Write("a", 300, 1);  // applied at a, on the wire to b
  net.now = kSessionMs / 2;
  net.Tick("a");
  REQUIRE(net.replies.count(300) == 1);
  CHECK_FALSE(net.replies[300]);
  net.Deliver();  // b applies and acks it: the answer was already given
  // A write that arrives without the lease is refused before it is applied.
  const size_t applied = net.applied["a"].size();
  net.Write("a", 301, 1);
  REQUIRE(net.replies.count(301) == 1);
  CHECK_FALSE(net.replies[301]);
  CHECK(net.applied["a"].size() == applied);
  // The tail refuses reads under sync, whose lease ended too.
  ChainOutput out;
  CHECK(net.members["b"]->OnRead(1, 1, net.now, &out) == ChainMember::Read::kRefuse);
  // ZooKeeper answers again: writes are taken and answered.
  net.Answered("a");
  net.Answered("b");
  net.Write("a", 302, 1);
  net.Deliver();
  CHECK(net.replies[302]);
  CHECK(net.members["b"]->OnRead(2, 1, net.now, &out) == ChainMember::Read::kServe);
}

TEST_CASE("a member frozen past its lease serves nothing when it wakes") {
  // A SIGSTOP or a stalled VM: no event ran meanwhile, and the first one
  // after it is judged at the time it runs, before any answer the session
  // may have had waiting in its socket.
  Net net;
  net.Start({"a", "b", "c"}, 7);
  net.now = 20000;
  ChainOutput out;
  CHECK(net.members["c"]->OnRead(1, 1, net.now, &out) == ChainMember::Read::kRefuse);
  net.Write("a", 400, 1);
  CHECK_FALSE(net.replies[400]);
  // The answer that waited was sent before the pause: it renews nothing.
  net.Answered("c", 100);
  CHECK(net.members["c"]->OnRead(2, 1, net.now, &out) == ChainMember::Read::kRefuse);
}

TEST_CASE("a chain of one that never had company serves without a lease") {
  Net solo;
  solo.Add("s");
  Register(solo, {"s"}, {1});
  solo.Config(Make(1, 9, {"s"}, {1}));
  solo.now = 10 * kSessionMs;
  solo.Tick("s");
  solo.Write("s", 1, 1);
  CHECK(solo.replies[1]);  // nobody could have taken over from it
}

TEST_CASE("a joiner catches up from the tail's log, then asks to register") {
  Net net;
  net.Add("a");
  Register(net, {"a"}, {1});
  net.Config(Make(1, 7, {"a"}, {1}));
  for (uint64_t r = 1; r <= 5; ++r) net.Write("a", r, r);
  net.Add("j");
  ChainOutput out;
  net.members["j"]->OnConfig(Make(1, 7, {"a"}, {1}), 0, &out);
  net.members["j"]->StartJoin(0, &out);
  net.Take("j", out);
  CHECK(std::string(net.members["j"]->role()) == "syncing");
  // Deliver by hand to see register_now.
  bool asked = false;
  while (!net.wire.empty()) {
    auto [from, send] = net.wire.front();
    net.wire.erase(net.wire.begin());
    ChainOutput o;
    net.members.at(send.to)->OnMessage(from, send.msg, 0, &o);
    asked = asked || o.register_now;
    net.Take(send.to, o);
  }
  CHECK(net.applied["j"] == std::vector<uint64_t>({1, 2, 3, 4, 5}));
  CHECK(asked);
  CHECK(net.members["j"]->wants_registration());
}

TEST_CASE("a catch-up is sent in messages of at most max_batch_bytes of writes") {
  // Found by a process test: merging the log's batches into one message
  // ignored the byte bound, and a joiner 24 MB behind got one 24 MB frame,
  // over the server's frame limit, forever.
  Net net;
  net.Add("a");
  Register(net, {"a"}, {1});
  net.Config(Make(1, 7, {"a"}, {1}));
  const std::string big(1u << 20, 'x');  // 1 MiB per write
  for (uint64_t r = 1; r <= 12; ++r) {
    ChainOutput out;
    net.members["a"]->OnWrite(r, {r}, big, net.now, &out);
    net.Take("a", out);
  }
  net.Add("j");
  ChainOutput out;
  net.members["j"]->OnConfig(Make(1, 7, {"a"}, {1}), 0, &out);
  net.members["j"]->StartJoin(0, &out);
  net.Take("j", out);
  size_t messages = 0;
  while (!net.wire.empty()) {
    auto [from, send] = net.wire.front();
    net.wire.erase(net.wire.begin());
    if (from == "a" && send.msg.kind == ChainMessage::Kind::kReplicate &&
        !send.msg.entries.empty()) {
      ++messages;
      uint64_t bytes = 0;
      for (const auto& e : send.msg.entries) bytes += e.op.size();
      CHECK(bytes <= ChainOptions().max_batch_bytes);
    }
    ChainOutput o;
    net.members.at(send.to)->OnMessage(from, send.msg, 0, &o);
    net.Take(send.to, o);
  }
  CHECK(messages >= 3);
  CHECK(net.applied["j"].size() == 12);
}

TEST_CASE("a joiner the tail's log no longer covers gets a snapshot") {
  Net net;
  ChainOptions small;
  small.backlog_bytes = 1;  // keep nothing committed
  net.members["a"] = std::make_unique<ChainMember>("a", small, ChainPosition{});
  Register(net, {"a"}, {1});
  net.Config(Make(1, 7, {"a"}, {1}));
  for (uint64_t r = 1; r <= 5; ++r) net.Write("a", r, r);
  net.Add("j");
  ChainOutput out;
  net.members["j"]->OnConfig(Make(1, 7, {"a"}, {1}), 0, &out);
  net.members["j"]->StartJoin(0, &out);
  net.Take("j", out);
  ChainOutput tail_out;
  auto [from, send] = net.wire.front();
  net.members["a"]->OnMessage(from, send.msg, 0, &tail_out);
  REQUIRE(tail_out.snapshots.size() == 1);
  CHECK(tail_out.snapshots[0].to == "j");
  CHECK(tail_out.snapshots[0].at.seq == 5);
  ChainOutput jo;
  uint64_t token = net.members["j"]->OnSnapshotBegin("a", tail_out.snapshots[0].at, 0, &jo);
  CHECK(token != 0);
  CHECK(jo.wipe);
  // A stream from anyone else is refused.
  CHECK(net.members["j"]->OnSnapshotBegin("x", tail_out.snapshots[0].at, 0, &jo) == 0);
  net.members["j"]->OnSnapshotLoaded(token, {}, 0, &jo);
  CHECK(net.members["j"]->applied().seq == 5);
}

TEST_CASE("an empty chain restarts only from a member of the recorded chain") {
  ChainConfig empty;
  empty.version = 5;
  empty.id = 1;
  empty.recorded = {"a", "b"};
  for (const char* name : {"a", "c"}) {
    ChainMember m(name, ChainOptions{}, ChainPosition{3, 10});
    ChainOutput out;
    m.OnConfig(empty, 0, &out);
    m.StartJoin(0, &out);
    CHECK(out.register_now == (std::string(name) == "a"));
  }
  ChainMember wiped("b", ChainOptions{}, ChainPosition{}, /*intact=*/false);
  ChainOutput out;
  wiped.OnConfig(empty, 0, &out);
  wiped.StartJoin(0, &out);
  CHECK_FALSE(out.register_now);  // its copy is gone: it waits for "a"
}

TEST_CASE("a joiner neither registers nor asks anyone before it has read the ring") {
  // Started and ticking before ZooKeeper answered: no chain is known, which
  // is not the same as a mark nobody serves. Registering now would make an
  // empty member the tail of a chain that holds data.
  for (bool intact : {false, true}) {
    ChainMember m("new", ChainOptions{}, ChainPosition{}, intact);
    ChainOutput out;
    m.StartJoin(0, &out);
    for (int64_t now = 50; now <= 10000; now += 50) m.OnTick(now, &out);
    CHECK_FALSE(out.register_now);
    CHECK(out.sends.empty());
    // Once the ring is read (a chain of one serving the mark), it asks the tail.
    ChainConfig c;
    c.version = 4;
    c.id = 9;
    c.members = {"tail"};
    c.epochs = {1};
    c.recorded = c.members;
    c.recorded_zxid = 2;
    ChainOutput after;
    m.OnConfig(c, 10050, &after);
    CHECK_FALSE(after.register_now);
    REQUIRE(after.sends.size() == 1);
    CHECK(after.sends[0].to == "tail");
    CHECK(after.sends[0].msg.kind == ChainMessage::Kind::kSyncRequest);
  }
}

TEST_CASE("a read parked at a tail with a joiner is served only while the tail holds its lease") {
  // The tail of a sync chain with a joiner commits only what the joiner
  // applied, so a read of a key with a newer write waits (parked). If the
  // tail loses its lease meanwhile (ZooKeeper may have re-formed the chain
  // without it), the joiner's ack must not release that read: a new chain
  // may already hold newer writes of the key.
  Net net;
  net.Start({"a", "t"}, 7);
  net.Add("j");
  ChainOutput out;
  net.members["j"]->OnConfig(Make(1, 7, {"a", "t"}, {1, 2}), 0, &out);
  net.members["j"]->StartJoin(0, &out);
  net.Take("j", out);
  net.Deliver();
  REQUIRE(net.members["j"]->wants_registration());

  net.Write("a", 10, 5);
  std::vector<std::pair<std::string, ChainOutput::Send>> held;  // to the joiner
  auto deliver = [&](std::vector<uint64_t>* reads) {
    while (!net.wire.empty()) {
      auto [from, send] = net.wire.front();
      net.wire.erase(net.wire.begin());
      if (send.to == "j" && reads == nullptr) {
        held.emplace_back(from, send);
        continue;
      }
      ChainOutput o;
      net.members.at(send.to)->OnMessage(from, send.msg, net.now, &o);
      if (reads != nullptr) reads->insert(reads->end(), o.reads.begin(), o.reads.end());
      net.Take(send.to, o);
    }
  };
  deliver(nullptr);
  REQUIRE(net.applied["t"] == std::vector<uint64_t>({1}));
  CHECK(net.replies.count(10) == 0);  // the joiner has not applied it
  ChainOutput read_out;
  REQUIRE(net.members["t"]->OnRead(20, 5, net.now, &read_out) == ChainMember::Read::kWait);

  // The tail's lease ends while the read waits: the read is refused then
  // (not served later from a chain ZooKeeper may have replaced).
  net.now = kSessionMs / 2;
  net.Tick("t");
  REQUIRE(net.replies.count(20) == 1);
  CHECK_FALSE(net.replies[20]);
  for (auto& h : held) net.wire.push_back(h);
  std::vector<uint64_t> reads;
  deliver(&reads);
  CHECK(net.applied["j"] == std::vector<uint64_t>({1}));
  CHECK(reads.empty());  // committed now, but the read was refused

  ChainOutput renewed;
  net.members["t"]->OnSessionAnswer(net.now, kSessionMs, net.now, &renewed);
  CHECK(renewed.reads.empty());
}

namespace {

ChainMessage Replicate(uint64_t chain, std::vector<ChainPosition> writes, uint64_t applied) {
  ChainMessage m;
  m.kind = ChainMessage::Kind::kReplicate;
  m.chain = chain;
  for (const ChainPosition& p : writes) {
    flatkv::partition::ChainEntry e;
    e.seq = p.seq;
    e.epoch = p.epoch;
    e.keys = {p.seq};
    e.op.assign(1, 'w');
    m.entries.push_back(e);
  }
  m.applied = applied;
  m.committed = applied;
  m.floor = applied;
  return m;
}

const ChainMessage* SyncRequestIn(const ChainOutput& out) {
  for (const auto& s : out.sends) {
    if (s.msg.kind == ChainMessage::Kind::kSyncRequest) return &s.msg;
  }
  return nullptr;
}

}  // namespace

TEST_CASE("a joiner whose copy holds a write of a discarded branch starts over from nothing") {
  // The tail "b" copied its store at (1, 5) while it went on applying
  // writes 6 and 7 of head term 1; that term ended before they committed
  // and the next head wrote other writes 6 and 7 (term 2). A key only the
  // discarded writes touched would keep their value on the joiner.
  for (int64_t term_of_7 : {1, 2}) {
    ChainMember j("j", ChainOptions{}, ChainPosition{});
    ChainOutput out;
    j.OnConfig(Make(3, 9, {"b"}, {1}), 0, &out);
    j.StartJoin(0, &out);
    uint64_t token = j.OnSnapshotBegin("b", {1, 5}, 0, &out);
    REQUIRE(token != 0);
    j.OnSnapshotLoaded(token, /*end=*/{1, 7}, 0, &out);
    ChainOutput o;
    j.OnMessage("b", Replicate(9, {{1, 6}, {term_of_7, 7}}, 7), 1, &o);
    if (term_of_7 == 1) {
      // The same history up to the copy's end: it catches up and registers.
      CHECK_FALSE(o.wipe);
      CHECK(o.register_now);
      CHECK(j.applied().seq == 7);
    } else {
      CHECK(o.wipe);
      CHECK_FALSE(o.register_now);
      CHECK(j.applied().seq == 0);
      const ChainMessage* again = SyncRequestIn(o);
      REQUIRE(again != nullptr);
      CHECK(again->position.seq == 0);
    }
  }
}

TEST_CASE("a joiner does not register while the tail is behind the copy it loaded") {
  ChainMember j("j", ChainOptions{}, ChainPosition{});
  ChainOutput out;
  j.OnConfig(Make(3, 9, {"b"}, {1}), 0, &out);
  j.StartJoin(0, &out);
  uint64_t token = j.OnSnapshotBegin("b", {1, 5}, 0, &out);
  j.OnSnapshotLoaded(token, /*end=*/{1, 8}, 0, &out);
  // The tail that answers holds only up to 6: writes 7 and 8 of the copy
  // are not in this chain's history (yet, or ever).
  ChainOutput o;
  j.OnMessage("b", Replicate(9, {{1, 6}}, 6), 1, &o);
  CHECK_FALSE(o.register_now);
  CHECK(o.wipe);
}

TEST_CASE("a member restarted while catching up from a copy empties its store first") {
  // Not intact at a position: the shell's log says it was loading a copy.
  ChainMember j("j", ChainOptions{}, ChainPosition{1, 40}, /*intact=*/false);
  ChainOutput out;
  j.OnConfig(Make(3, 9, {"b"}, {1}), 0, &out);
  j.StartJoin(0, &out);
  CHECK(out.wipe);
  const ChainMessage* ask = SyncRequestIn(out);
  REQUIRE(ask != nullptr);
  CHECK(ask->position.seq == 0);
  // An intact member at a position keeps its store and asks from there.
  ChainMember k("k", ChainOptions{}, ChainPosition{1, 40}, /*intact=*/true);
  ChainOutput ko;
  k.OnConfig(Make(3, 9, {"b"}, {1}), 0, &ko);
  k.StartJoin(0, &ko);
  CHECK_FALSE(ko.wipe);
  REQUIRE(SyncRequestIn(ko) != nullptr);
  CHECK(SyncRequestIn(ko)->position.seq == 40);
}

TEST_CASE("a late ack from a joiner below the tail's log is not taken for a restart") {
  // Acks overtake each other. A tail that read an old one as "the joiner
  // started over" dropped a joiner that had registered and committed past
  // it alone, so the joiner became a successor the log could not serve.
  Net net;
  ChainOptions small;
  small.backlog_bytes = 1;  // keep nothing committed
  net.members["a"] = std::make_unique<ChainMember>("a", small, ChainPosition{});
  net.Answered("a");  // with a joiner it answers writes only under its lease
  Register(net, {"a"}, {1});
  net.Config(Make(1, 7, {"a"}, {1}));
  for (uint64_t r = 1; r <= 5; ++r) net.Write("a", r, r);
  ChainMember& a = *net.members["a"];
  ChainOutput o;
  ChainMessage ask;
  ask.kind = ChainMessage::Kind::kSyncRequest;
  ask.chain = 7;
  ask.position = a.applied();
  a.OnMessage("j", ask, 0, &o);
  REQUIRE(a.downstream() == "j");
  for (uint64_t r = 6; r <= 7; ++r) net.Write("a", r, r);
  ChainMessage ack;
  ack.kind = ChainMessage::Kind::kAck;
  ack.chain = 7;
  ack.applied = 7;
  ack.committed = 7;  // the joiner is the end: what it applied commits
  ChainOutput o2;
  a.OnMessage("j", ack, 0, &o2);
  CHECK(a.committed() == 7);
  ack.applied = 5;  // sent before the one above
  ack.committed = 5;
  ChainOutput o3;
  a.OnMessage("j", ack, 0, &o3);
  CHECK(o3.snapshots.empty());
  CHECK(a.downstream() == "j");
  CHECK(a.downstream_applied() == 7);
}

TEST_CASE("a head answers writes only by a record of its chain made under this chain") {
  // The same members were recorded under an older ring; since then another
  // chain was asked for (its record may still land). The head records
  // again and answers once that record is read back.
  Net net;
  net.Add("a");
  Register(net, {"a"}, {1});
  ChainConfig c = Make(5, 7, {"a"}, {1});
  c.recorded_version = 3;
  net.Config(c);
  net.Write("a", 1, 1);
  CHECK(net.replies.count(1) == 0);
  CHECK(net.record == std::vector<std::string>{"a"});
  c.version = 6;
  c.recorded_version = 5;  // the head's own record, under version 5
  net.Config(c);
  CHECK(net.replies.count(1) == 1);
  CHECK(net.replies[1]);
}

TEST_CASE("a record made before a member registered again does not count for its chain") {
  // b registered again (zxid 5) after the record of [a, b] was written
  // (zxid 3): that record vouches for b's earlier life, whose store held
  // what was acknowledged then, not for what this registration holds.
  Net net;
  net.Add("a");
  net.Add("b");
  Register(net, {"a", "b"}, {1, 5});
  ChainConfig c = Make(2, 7, {"a", "b"}, {1, 5});
  c.recorded_zxid = 3;
  net.Config(c);
  net.Deliver();
  net.Write("a", 1, 1);
  net.Deliver();
  CHECK(net.replies.count(1) == 0);                        // not answered...
  CHECK(net.record == std::vector<std::string>{"a", "b"});  // ...but recorded again
  ChainOutput out;
  CHECK(net.members["b"]->OnRead(2, 1, net.now, &out) == ChainMember::Read::kRefuse);
  c.version = 3;
  c.recorded_zxid = 6;  // the new record, after both registrations
  net.Config(c);
  net.Deliver();
  CHECK(net.replies[1]);
  CHECK(net.members["b"]->OnRead(3, 1, net.now, &out) == ChainMember::Read::kServe);
}

namespace {

// A chain of one, "a" (epoch 1), with three writes, and a joiner "name"
// that caught up from it and registered (epoch 9); not yet in a ring.
ChainMember& CaughtUpFromA(Net& net, const std::string& name) {
  net.Add("a");
  Register(net, {"a"}, {1});
  net.Config(Make(1, 7, {"a"}, {1}));
  for (uint64_t r = 1; r <= 3; ++r) net.Write("a", r, r);
  net.Add(name);
  ChainOutput out;
  ChainMember& j = *net.members[name];
  j.OnConfig(Make(1, 7, {"a"}, {1}), 0, &out);
  j.StartJoin(0, &out);
  net.Take(name, out);
  net.Deliver();
  REQUIRE(j.wants_registration());
  j.OnRegistered(9, 0, 0);
  return j;
}

}  // namespace

TEST_CASE("a joiner that lands behind another predecessor than its source rejoins from it") {
  // j caught up from a (the tail it saw) and registered; meanwhile a was
  // replaced, and the chain j landed in is [b, j]. What j holds was vouched
  // for by a's history, not b's: it withdraws and asks b.
  Net net;
  ChainMember& j = CaughtUpFromA(net, "j");
  ChainOutput landed;
  j.OnConfig(Make(2, 8, {"b", "j"}, {5, 9}), 0, &landed);
  CHECK(landed.deregister);
  CHECK(std::string(j.role()) == "syncing");
  // Once the ring shows its node gone, it asks b.
  ChainOutput gone;
  j.OnConfig(Make(3, 10, {"b"}, {5}), 0, &gone);
  const ChainMessage* ask = nullptr;
  for (const auto& s : gone.sends) {
    if (s.to == "b" && s.msg.kind == ChainMessage::Kind::kSyncRequest) ask = &s.msg;
  }
  CHECK(ask != nullptr);
  // Landing behind the tail it caught up from is the normal case: it stays.
  Net ok;
  ChainMember& k = CaughtUpFromA(ok, "k");
  ChainOutput in;
  k.OnConfig(Make(2, 8, {"a", "k"}, {1, 9}), 0, &in);
  CHECK_FALSE(in.deregister);
  CHECK(std::string(k.role()) == "tail");
}

TEST_CASE("a member that registered alone on a stale view leaves when the ring names another record") {
  // m was of the recorded chain [m, x] when it saw the mark empty, so it
  // registered to start it alone; but by the time its node landed the ring
  // had recorded [x] (x served and acknowledged writes m lacks).
  ChainMember m("m", ChainOptions{}, ChainPosition{1, 10}, /*intact=*/true);
  ChainOutput out;
  ChainConfig empty = Make(1, 7, {}, {});
  empty.recorded = {"m", "x"};
  m.OnConfig(empty, 0, &out);
  m.StartJoin(0, &out);
  REQUIRE(out.register_now);
  m.OnRegistered(20, 0, 0);
  ChainConfig now = Make(3, 9, {"m"}, {20});
  now.recorded = {"x"};
  now.recorded_zxid = 15;
  ChainOutput after;
  m.OnConfig(now, 0, &after);
  CHECK(after.deregister);
  CHECK(std::string(m.role()) == "syncing");
}

TEST_CASE("a new mark's importer starts its chain whatever an earlier life of the mark recorded") {
  // A removed mark added again: its chain record of before names members
  // long gone, but the ring change made the importer's store the whole of
  // the mark's data.
  ChainMember m("m", ChainOptions{}, ChainPosition{}, /*intact=*/true);
  ChainOutput out;
  m.OnConfig(Make(1, 7, {}, {}), 0, &out);  // the ring has no such mark yet
  m.StartJoin(0, &out);
  REQUIRE(out.register_now);
  REQUIRE(m.Rebase({42, 0}));
  m.OnRegistered(50, 0, 0);
  ChainConfig c = Make(2, 9, {"m"}, {50});
  c.recorded = {"old1", "old2"};
  c.recorded_zxid = 10;
  ChainOutput landed;
  m.OnConfig(c, 0, &landed);
  CHECK_FALSE(landed.deregister);
  CHECK(std::string(m.role()) == "single");
  CHECK(landed.record == std::vector<std::string>{"m"});  // and records itself
}

TEST_CASE("while a ring change adds a mark, only its importer starts the mark's chain") {
  // Members of an earlier life of the mark, restarted with their stores,
  // wait for the importer: leading, one would make the importer catch up
  // from it and lose the import.
  ChainConfig c;
  c.version = 5;
  c.id = 1;
  c.recorded = {"old", "imp"};
  c.importer = "imp";
  for (const char* name : {"old", "other"}) {
    ChainMember m(name, ChainOptions{}, ChainPosition{3, 10}, /*intact=*/true);
    ChainOutput out;
    m.OnConfig(c, 0, &out);
    m.StartJoin(0, &out);
    for (int64_t now = 50; now <= 10000; now += 50) m.OnTick(now, &out);
    CHECK_FALSE(out.register_now);
    CHECK(out.sends.empty());
  }
  // The importer asks at start; its registration is made only at the flip
  // (the mark node appears then), long after: the ring has the joiner
  // timeout from then on to show it, and it starts the chain.
  ChainMember imp("imp", ChainOptions{}, ChainPosition{3, 10}, /*intact=*/true);
  ChainOutput out;
  imp.OnConfig(c, 0, &out);
  imp.StartJoin(0, &out);
  REQUIRE(out.register_now);
  REQUIRE(imp.Rebase({42, 0}));
  for (int64_t now = 50; now < 5000; now += 50) imp.OnTick(now, &out);
  imp.OnRegistered(50, 0, 5000);
  for (int64_t now = 5050; now <= 6500; now += 50) imp.OnTick(now, &out);
  ChainConfig listed = c;
  listed.version = 6;
  listed.id = 2;
  listed.members = {"imp"};
  listed.epochs = {50};
  imp.OnConfig(listed, 6500, &out);
  CHECK_FALSE(out.deregister);
  CHECK(std::string(imp.role()) == "single");
  CHECK(out.record == std::vector<std::string>{"imp"});
}

TEST_CASE("a refused connection to a chain member asks once to evict that registration") {
  Net net;
  net.Start({"a", "b", "c"}, 7);
  ChainMember& b = *net.members["b"];
  ChainOutput out;
  b.OnPeerRefused("a", net.now, &out);
  REQUIRE(out.evict.size() == 1);
  CHECK(out.evict[0].member == "a");
  CHECK(out.evict[0].epoch == 1);  // the registration the chain shows
  // The refusals that follow (every resend) ask nothing more.
  ChainOutput again;
  b.OnPeerRefused("a", net.now + 50, &again);
  CHECK(again.evict.empty());
  // An address outside the chain (a joiner, another mark's member) is
  // not this member's to evict, nor is its own.
  ChainOutput other;
  b.OnPeerRefused("x", net.now, &other);
  b.OnPeerRefused("b", net.now, &other);
  CHECK(other.evict.empty());
  // The same address registered again (a restarted process) is a new
  // registration: refused once more, it may be evicted once more.
  net.members["a"] = std::make_unique<ChainMember>("a", net.options, ChainPosition{});
  net.Config(Make(2, 8, {"b", "c", "a"}, {2, 3, 9}));
  ChainOutput later;
  b.OnPeerRefused("a", net.now, &later);
  REQUIRE(later.evict.size() == 1);
  CHECK(later.evict[0].epoch == 9);
}

TEST_CASE("a member outside the chain or fenced evicts nobody") {
  Net net;
  net.Start({"a", "b"}, 7);
  ChainMember& joiner = net.Add("j");
  net.Config(Make(1, 7, {"a", "b"}, {1, 2}));  // the joiner reads the ring too
  ChainOutput out;
  joiner.OnPeerRefused("a", net.now, &out);
  CHECK(out.evict.empty());
  ChainMember& b = *net.members["b"];
  ChainOutput fenced;
  b.SetFenced(true, &fenced);
  b.OnPeerRefused("a", net.now, &fenced);
  CHECK(fenced.evict.empty());
}

TEST_CASE("an answer from a new ZooKeeper session fences a member registered by the old one") {
  Net net;
  net.Start({"a", "b"}, 7);  // registered by session 0 (Register above)
  ChainMember& b = *net.members["b"];
  ChainOutput out;
  CHECK(b.OnRead(1, 5, net.now, &out) == ChainMember::Read::kServe);
  // The session expired and the registry made a new one, which answers
  // before the ring read that shows b removed: b's view still has it as
  // the tail, but its registration is gone with the old session.
  net.now += 10;
  ChainOutput fenced;
  b.OnSessionAnswer(net.now, kSessionMs, net.now, &fenced, /*session=*/1);
  CHECK(b.leased(net.now));  // the new session's answer is a lease...
  CHECK(std::string(b.role()) == "fenced");  // ...for a member out of its chain
  CHECK(b.OnRead(2, 5, net.now, &fenced) == ChainMember::Read::kRefuse);
  // It catches up again as a joiner (the shell's tick).
  b.StartJoin(net.now, &fenced);
  CHECK(std::string(b.role()) == "syncing");
}

TEST_CASE("a joiner's registration is gone with the session that made it") {
  // Registered by session 1; the ring then shows it in the chain. If a
  // session 2 answered in between, the node the ring shows belonged to an
  // expired session: it does not count as this member being in the chain.
  for (const uint64_t answering : {uint64_t{1}, uint64_t{2}}) {
    Net net;
    net.Start({"a"}, 7);
    ChainMember& j = net.Add("j");
    net.Config(Make(1, 7, {"a"}, {1}));
    ChainOutput out;
    j.StartJoin(net.now, &out);
    j.OnRegistered(30, /*session=*/1, net.now);
    j.OnSessionAnswer(net.now, kSessionMs, net.now, &out, answering);
    ChainOutput later;
    j.OnConfig(Make(2, 8, {"a", "j"}, {1, 30}), net.now, &later);
    INFO("answering session " << answering);
    CHECK(std::string(j.role()) == (answering == 1 ? "tail" : "syncing"));
  }
}
