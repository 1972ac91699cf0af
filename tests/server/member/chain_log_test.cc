// The chain log (server/member/chain_log.h) on real files: what a restart reads
// back, checkpoints, a torn or damaged tail; and the replicator replaying it
// into a real store.
#include "server/member/chain_log.h"

#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include "engine/cache/write_back.h"
#include "engine/store.h"
#include "server/member/replicator.h"
#include "tests/engine/test_util.h"

using flatkv::Status;
using flatkv::partition::ChainEntry;
using flatkv::server::ChainLog;
using flatkv::test::TempDir;

namespace {

ChainEntry Entry(int64_t epoch, uint64_t seq, const std::string& op) {
  ChainEntry e;
  e.epoch = epoch;
  e.seq = seq;
  e.keys = {seq * 3, seq * 3 + 1};
  e.op = op;
  return e;
}

struct Opened {
  ChainLog::State state;
  std::vector<ChainEntry> entries;
  std::unique_ptr<ChainLog> log;
};

Opened Open(const std::string& path) {
  Opened o;
  Status st = ChainLog::Open(path, &o.state, &o.entries, &o.log);
  INFO(st.ToString());
  REQUIRE(st.ok());
  return o;
}

void RequireSame(const std::vector<ChainEntry>& got, const std::vector<ChainEntry>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    CHECK(got[i].epoch == want[i].epoch);
    CHECK(got[i].seq == want[i].seq);
    CHECK(got[i].keys == want[i].keys);
    CHECK(got[i].op == want[i].op);
  }
}

off_t SizeOf(const std::string& path) {
  struct stat st;
  REQUIRE(::stat(path.c_str(), &st) == 0);
  return st.st_size;
}

}  // namespace

TEST_CASE("chain log: a new log claims nothing, and appended entries come back after a restart") {
  TempDir dir;
  const std::string path = dir / "CHAINLOG";
  std::vector<ChainEntry> written = {Entry(7, 1, "a"), Entry(7, 2, std::string(5000, 'b')),
                                     Entry(9, 3, std::string("\0\1\2", 3))};
  {
    Opened o = Open(path);
    CHECK(o.state.position == flatkv::partition::ChainPosition{});
    CHECK_FALSE(o.state.intact);
    CHECK(o.entries.empty());
    REQUIRE(o.log->Append({written[0], written[1]}).ok());
    REQUIRE(o.log->Append({written[2]}).ok());
    CHECK(o.log->dirty());
    REQUIRE(o.log->Sync().ok());
    CHECK_FALSE(o.log->dirty());
  }
  Opened o = Open(path);
  CHECK_FALSE(o.state.intact);
  RequireSame(o.entries, written);
  // The file runs ahead of the records with zeros (preallocated), which a
  // restart keeps and reads as the end of the log.
  const std::string bytes = flatkv::test::ReadFile(path);
  CHECK(bytes.size() == ChainLog::kPreallocBytes);
  REQUIRE(o.log->bytes() < bytes.size());
  CHECK(bytes.find_first_not_of('\0', o.log->bytes()) == std::string::npos);
}

TEST_CASE("chain log: appends past the preallocated zeros, over several restarts, all come back") {
  TempDir dir;
  const std::string path = dir / "CHAINLOG";
  std::vector<ChainEntry> written;
  uint64_t seq = 0;
  for (int life = 0; life < 3; ++life) {
    Opened o = Open(path);
    RequireSame(o.entries, written);
    // About 1.2 MiB per life in batches of uneven sizes: each life crosses
    // at least one end of the zeros.
    for (int batch = 0; batch < 40; ++batch) {
      std::vector<ChainEntry> entries;
      for (int i = 0; i <= batch % 5; ++i) {
        ++seq;
        entries.push_back(Entry(5, seq, std::string(1000 + (seq * 7919) % 20000, 'a' + seq % 26)));
      }
      REQUIRE(o.log->Append(entries).ok());
      written.insert(written.end(), entries.begin(), entries.end());
      if (batch % 3 == 0) REQUIRE(o.log->Sync().ok());
    }
    const off_t size = SizeOf(path);
    CHECK(static_cast<uint64_t>(size) > o.log->bytes());
    CHECK(static_cast<uint64_t>(size) % ChainLog::kPreallocBytes == 0);
  }
  Opened o = Open(path);
  RequireSame(o.entries, written);
}

TEST_CASE("chain log: Reset keeps only its state record, and later entries follow it") {
  TempDir dir;
  const std::string path = dir / "CHAINLOG";
  {
    Opened o = Open(path);
    REQUIRE(o.log->Append({Entry(1, 1, "x"), Entry(1, 2, "y")}).ok());
    REQUIRE(o.log->Reset({{4, 10}, true}).ok());
    REQUIRE(o.log->Append({Entry(4, 11, "z")}).ok());
  }
  Opened o = Open(path);
  CHECK(o.state.position == flatkv::partition::ChainPosition{4, 10});
  CHECK(o.state.intact);
  RequireSame(o.entries, {Entry(4, 11, "z")});
  CHECK_FALSE(::access((path + ".new").c_str(), F_OK) == 0);
}

TEST_CASE("chain log: a torn last record is cut off and the log goes on after it") {
  TempDir dir;
  const std::string path = dir / "CHAINLOG";
  uint64_t two = 0;
  uint64_t end = 0;
  {
    Opened o = Open(path);
    REQUIRE(o.log->Append({Entry(2, 1, "one"), Entry(2, 2, "two")}).ok());
    two = o.log->bytes();
    REQUIRE(o.log->Append({Entry(2, 3, "three")}).ok());
    end = o.log->bytes();
  }
  // A crash mid-append: the last record's final bytes never reached the
  // disk (the preallocated zeros are still there).
  std::string bytes = flatkv::test::ReadFile(path);
  for (uint64_t i = end - 3; i < end; ++i) bytes[i] = '\0';
  flatkv::test::WriteFile(path, bytes);
  {
    Opened o = Open(path);
    RequireSame(o.entries, {Entry(2, 1, "one"), Entry(2, 2, "two")});
    CHECK(SizeOf(path) == static_cast<off_t>(two));  // the torn record is gone from the file
    REQUIRE(o.log->Append({Entry(2, 3, "three again")}).ok());
  }
  Opened o = Open(path);
  RequireSame(o.entries, {Entry(2, 1, "one"), Entry(2, 2, "two"), Entry(2, 3, "three again")});
}

TEST_CASE("chain log: a damaged record ends the log there") {
  TempDir dir;
  const std::string path = dir / "CHAINLOG";
  off_t second = 0;
  {
    Opened o = Open(path);
    REQUIRE(o.log->Append({Entry(3, 1, "first")}).ok());
    second = static_cast<off_t>(o.log->bytes());
    REQUIRE(o.log->Append({Entry(3, 2, "second"), Entry(3, 3, "third")}).ok());
  }
  std::string bytes = flatkv::test::ReadFile(path);
  bytes[static_cast<size_t>(second) + 12] ^= 0x40;  // inside the second record's body
  flatkv::test::WriteFile(path, bytes);
  Opened o = Open(path);
  RequireSame(o.entries, {Entry(3, 1, "first")});
  CHECK(SizeOf(path) == second);
}

namespace {

// The replicator asks ZooKeeper for nothing before it gets a ring: replay
// happens in Start().
class NoCoordinator final : public flatkv::server::ChainCoordinator {
 public:
  void Register() override {}
  void Deregister() override {}
  Status RecordChain(const std::vector<std::string>&, int64_t) override { return Status::OK(); }
  flatkv::partition::SessionLease lease() const override { return {}; }
  void Evict(const std::string&, int64_t) override {}
};

std::string Op(flatkv::rpc::ChainOpKind::type kind, int64_t key, const std::string& skey,
               const std::string& value) {
  flatkv::rpc::ChainOp op;
  op.kind = kind;
  if (skey.empty()) {
    op.__set_key(key);
  } else {
    op.__set_skey(skey);
  }
  if (!value.empty()) op.__set_value(value);
  return flatkv::server::EncodeChainOps({op});
}

}  // namespace

TEST_CASE("replicator: a restart replays the logged writes into the store, in order") {
  using flatkv::rpc::ChainOpKind;
  TempDir dir;
  flatkv::engine::EngineOptions eo;
  eo.path = dir.path();
  eo.key_max = 1 << 20;
  std::unique_ptr<flatkv::engine::Store> store;
  REQUIRE(flatkv::engine::Store::Open(eo, &store).ok());
  std::unique_ptr<flatkv::engine::cache::WriteBackCache> cache;
  REQUIRE(flatkv::engine::cache::WriteBackCache::Open(store.get(), {}, &cache).ok());
  // The store holds an old value of 5 and key 8; the log (a crash after
  // logging, before the store had them) says 5 was overwritten twice, 8
  // removed and "s" set.
  REQUIRE(store->Put(5, "old").ok());
  REQUIRE(store->Put(8, "gone").ok());
  {
    Opened o = Open(dir / "CHAINLOG");
    REQUIRE(o.log->Reset({{6, 40}, true}).ok());
    REQUIRE(o.log
                ->Append({Entry(6, 41, Op(ChainOpKind::PUT, 5, "", "v41")),
                          Entry(6, 42, Op(ChainOpKind::REMOVE, 8, "", "")),
                          Entry(6, 43, Op(ChainOpKind::SPUT, 0, "s", "sv")),
                          Entry(6, 44, Op(ChainOpKind::PUT, 5, "", "v44"))})
                .ok());
  }
  flatkv::server::ReplicatorOptions ro;
  ro.self = "127.0.0.1:1";
  ro.mark = 0;
  ro.data_dir = dir.path();
  NoCoordinator coordinator;
  std::unique_ptr<flatkv::server::Replicator> r;
  REQUIRE(flatkv::server::Replicator::Start(ro, store.get(), cache.get(), &coordinator, &r).ok());
  CHECK(r->applied() == flatkv::partition::ChainPosition{6, 44});
  std::string v;
  REQUIRE(cache->Get(5, &v).ok());
  CHECK(v == "v44");
  CHECK(cache->Get(8, &v).IsNotFound());
  REQUIRE(cache->SGet("s", &v).ok());
  CHECK(v == "sv");
  r->Stop();
  r.reset();
  // A clean stop checkpoints: nothing left to replay, the position kept.
  Opened o = Open(dir / "CHAINLOG");
  CHECK(o.entries.empty());
  CHECK(o.state.position == flatkv::partition::ChainPosition{6, 44});
  CHECK(o.state.intact);
}
