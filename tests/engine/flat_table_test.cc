// Tests of engine/flat_table.{h,cc} through FlatTable directly: the value
// semantics of put/get/remove/append, the O(appended bytes) append promise,
// corruption on disk, index rebuilds, and crash recovery (a forked child that
// exits without closing the table).
#include <catch2/catch.hpp>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/flat_index.h"
#include "engine/flat_table.h"
#include "tests/engine/test_util.h"

using flatkv::Status;
using flatkv::engine::EngineCounters;
using flatkv::engine::FlatIndex;
using flatkv::engine::FlatTable;
using flatkv::engine::SyncMode;
using flatkv::engine::TableParams;
using flatkv::test::ReadFile;
using flatkv::test::TempDir;
using flatkv::test::WriteFile;

namespace {

constexpr int64_t kMin = -100;
constexpr uint64_t kSlots = 1000;
constexpr int kFiles = 4;

// As Store::OpenTable builds them, for a table of keys [-100, 900).
TableParams Params(const std::string& dir, int item_bytes = 6) {
  TableParams p;
  p.dir = dir;
  p.index.kmin = kMin;
  p.index.slots = kSlots;
  p.index.item_bytes = item_bytes;
  p.index.data_files = kFiles;
  return p;
}

std::unique_ptr<FlatTable> Open(const TableParams& p, EngineCounters* c, bool create = true) {
  std::unique_ptr<FlatTable> t;
  Status st = FlatTable::Open(p, create, c, &t);
  INFO(st.ToString());
  REQUIRE(st.ok());
  return t;
}

std::string DataPath(const TableParams& p, int64_t key) {
  char name[32];
  std::snprintf(name, sizeof(name), "/data-%03d.log",
                static_cast<int>((key - p.index.kmin) % p.index.data_files));
  return p.dir + name;
}

// Letters only; distinct per key so a mixed-up record shows.
std::string Value(int64_t key, size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>('a' + (key * 7 + i * 13 + i / 26) % 26);
  return s;
}

std::string MustGet(const FlatTable& t, int64_t key) {
  std::string v;
  Status st = t.Get(key, &v);
  INFO("key " << key << ": " << st.ToString());
  REQUIRE(st.ok());
  return v;
}

void CheckModel(const FlatTable& t, const std::map<int64_t, std::string>& model) {
  for (int64_t k = kMin; k < kMin + static_cast<int64_t>(kSlots); ++k) {
    INFO("key " << k);
    auto it = model.find(k);
    std::string v = "unchanged";
    Status st = t.Get(k, &v);
    if (it == model.end()) {
      REQUIRE(st.IsNotFound());
      REQUIRE(v == "unchanged");
      REQUIRE_FALSE(t.Contains(k));
    } else {
      REQUIRE(st.ok());
      REQUIRE(v == it->second);
      REQUIRE(t.Contains(k));
    }
  }
}

// Flips one byte in the middle of the only copy of "needle" in "path".
void FlipInside(const std::string& path, const std::string& needle) {
  std::string data = ReadFile(path);
  const size_t at = data.find(needle);
  REQUIRE(at != std::string::npos);
  REQUIRE(data.find(needle, at + 1) == std::string::npos);
  data[at + needle.size() / 2] ^= 0x01;
  WriteFile(path, data);
}

// Runs "child" in a forked process and returns its wait status. The child
// leaves through _exit(): no destructor, no Close(), as if it were killed.
int RunChild(const std::function<int()>& child) {
  std::fflush(nullptr);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) _exit(child());
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  return status;
}

bool ExitedOk(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }

// The writes of the crash tests: puts (some large), removes and appends.
void CrashOps(FlatTable* t, std::map<int64_t, std::string>* model, int n, bool* ok) {
  for (int i = 0; i < n; ++i) {
    const int64_t k = kMin + (i * 37) % static_cast<int64_t>(kSlots);
    std::string v = Value(k + i, i % 50 == 7 ? 70000 : static_cast<size_t>(i % 300));
    Status st;
    if (i % 10 == 3) {
      bool existed;
      if (t != nullptr) st = t->Remove(k, &existed);
      model->erase(k);
    } else if (i % 10 == 5) {
      if (t != nullptr) st = t->Append(k, v.substr(0, 20));
      (*model)[k] += v.substr(0, 20);
    } else {
      if (t != nullptr) st = t->Put(k, v);
      (*model)[k] = v;
    }
    if (!st.ok()) *ok = false;
  }
}

// The child of a crash test: opens the table, writes, exits without closing.
int CrashChild(const TableParams& p, int n) {
  EngineCounters c;
  std::unique_ptr<FlatTable> t;
  if (!FlatTable::Open(p, true, &c, &t).ok()) return 2;
  std::map<int64_t, std::string> ignored;
  bool ok = true;
  CrashOps(t.get(), &ignored, n, &ok);
  (void)t.release();  // never closed
  return ok ? 0 : 3;
}

// Writes CrashOps(n) into a new table, closes it and returns the model.
std::map<int64_t, std::string> Populate(const TableParams& p, int n) {
  std::map<int64_t, std::string> model;
  EngineCounters c;
  auto t = Open(p, &c);
  bool ok = true;
  CrashOps(t.get(), &model, n, &ok);
  REQUIRE(ok);
  REQUIRE(t->Close().ok());
  return model;
}

// A compaction's copy of every data file (up to "ends"), then its switch.
void CopyAllAndSwitch(FlatTable* t, const std::vector<uint64_t>& ends) {
  for (int f = 0; f < kFiles; ++f) {
    REQUIRE(t->CopyLive(f, ends[f], [](uint64_t) { return true; }).ok());
  }
  t->FinishCompaction();
}

}  // namespace

TEST_CASE("FlatTable puts and gets and removes and appends values", "[engine][table]") {
  TempDir dir;
  const int w = GENERATE(4, 6, 8);
  const SyncMode sync = GENERATE(SyncMode::kNone, SyncMode::kAlways);
  TableParams p = Params(dir / "t", w);
  p.sync = sync;
  EngineCounters c;
  auto t = Open(p, &c);
  const int64_t last = kMin + static_cast<int64_t>(kSlots) - 1;
  for (int64_t k : {kMin, int64_t{0}, int64_t{1}, last}) {
    REQUIRE(t->Put(k, Value(k, 10)).ok());
  }
  REQUIRE(t->Put(7, Value(7, 5000)).ok());    // larger than a 4 KiB first read
  REQUIRE(t->Put(8, Value(8, 70000)).ok());   // written with pwritev
  REQUIRE(MustGet(*t, 7) == Value(7, 5000));
  REQUIRE(MustGet(*t, 8) == Value(8, 70000));

  REQUIRE(t->Put(0, "replaced").ok());
  REQUIRE(MustGet(*t, 0) == "replaced");
  REQUIRE(MustGet(*t, 1) == Value(1, 10));  // neighbours untouched

  bool existed = false;
  REQUIRE(t->Remove(1, &existed).ok());
  REQUIRE(existed);
  REQUIRE(t->Remove(1, &existed).ok());
  REQUIRE_FALSE(existed);
  REQUIRE(t->Remove(2, nullptr).ok());

  REQUIRE(t->Append(0, "+more").ok());
  REQUIRE(MustGet(*t, 0) == "replaced+more");
  REQUIRE(t->Append(8, "!").ok());
  REQUIRE(MustGet(*t, 8) == Value(8, 70000) + "!");

  const std::map<int64_t, std::string> model = {
      {kMin, Value(kMin, 10)}, {0, "replaced+more"}, {last, Value(last, 10)},
      {7, Value(7, 5000)}, {8, Value(8, 70000) + "!"}};
  CheckModel(*t, model);
  REQUIRE(t->Close().ok());
  t = Open(p, &c, false);
  CheckModel(*t, model);
}

TEST_CASE("FlatTable::Get of an absent key returns NotFound and leaves the value unchanged",
          "[engine][table]") {
  TempDir dir;
  EngineCounters c;
  auto t = Open(Params(dir / "t"), &c);
  std::string v = "unchanged";
  REQUIRE(t->Get(5, &v).IsNotFound());  // its data file does not even exist
  REQUIRE(v == "unchanged");
  REQUIRE(t->Put(5, "x").ok());
  REQUIRE(t->Get(9, &v).IsNotFound());  // same data file, never written
  REQUIRE(v == "unchanged");
  bool existed;
  REQUIRE(t->Remove(5, &existed).ok());
  REQUIRE(t->Get(5, &v).IsNotFound());
  REQUIRE(v == "unchanged");
}

TEST_CASE("FlatTable keeps an empty value distinct from a removed key", "[engine][table]") {
  TempDir dir;
  const TableParams p = Params(dir / "t");
  EngineCounters c;
  auto t = Open(p, &c);
  REQUIRE(t->Put(3, "").ok());
  REQUIRE(t->Put(4, "").ok());
  REQUIRE(t->Put(5, "will go").ok());
  bool existed = false;
  REQUIRE(t->Remove(4, &existed).ok());
  REQUIRE(existed);
  REQUIRE(t->Remove(5, &existed).ok());
  for (int reopen = 0; reopen < 2; ++reopen) {
    std::string v = "unchanged";
    REQUIRE(t->Get(3, &v).ok());
    REQUIRE(v.empty());
    REQUIRE(t->Contains(3));
    v = "unchanged";
    REQUIRE(t->Get(4, &v).IsNotFound());
    REQUIRE(v == "unchanged");
    REQUIRE_FALSE(t->Contains(4));
    REQUIRE_FALSE(t->Contains(5));
    REQUIRE(t->Close().ok());
    t = Open(p, &c, false);
  }
  bool again = true;
  REQUIRE(t->Remove(3, &again).ok());  // an empty value exists and can be removed
  REQUIRE(again);
  REQUIRE(t->Remove(4, &again).ok());
  REQUIRE_FALSE(again);
}

TEST_CASE("FlatTable::Append to an absent or removed key creates it", "[engine][table]") {
  TempDir dir;
  EngineCounters c;
  auto t = Open(Params(dir / "t"), &c);
  REQUIRE(t->Append(11, "first").ok());
  REQUIRE(MustGet(*t, 11) == "first");
  REQUIRE(t->Remove(11, nullptr).ok());
  REQUIRE(t->Append(11, "again").ok());
  REQUIRE(MustGet(*t, 11) == "again");
  REQUIRE(t->Append(12, "").ok());  // appending nothing still creates the key
  REQUIRE(t->Contains(12));
  REQUIRE(MustGet(*t, 12).empty());
  REQUIRE(t->Append(12, "").ok());
  REQUIRE(t->Append(12, "x").ok());
  REQUIRE(MustGet(*t, 12) == "x");
}

TEST_CASE("FlatTable reassembles 200 small appends exactly before and after a reopen",
          "[engine][table]") {
  TempDir dir;
  const int w = GENERATE(4, 6);
  const TableParams p = Params(dir / "t", w);
  EngineCounters c;
  auto t = Open(p, &c);
  std::string model;
  const bool start_with_put = GENERATE(false, true);
  if (start_with_put) {
    model = Value(1, 3000);
    REQUIRE(t->Put(42, model).ok());
  }
  for (int i = 0; i < 200; ++i) {
    const std::string piece = Value(i, 1 + (i * 7) % 30);
    REQUIRE(t->Append(42, piece).ok());
    REQUIRE(t->Put(46, Value(i, 5)).ok());  // another key of the same data file
    model += piece;
    if (i % 17 == 0) REQUIRE(MustGet(*t, 42) == model);
  }
  REQUIRE(MustGet(*t, 42) == model);
  REQUIRE(t->Close().ok());
  t = Open(p, &c, false);
  REQUIRE(MustGet(*t, 42) == model);
  REQUIRE(t->Append(42, "end").ok());
  REQUIRE(MustGet(*t, 42) == model + "end");
}

TEST_CASE("FlatTable appends to a 1 MiB value in O(appended bytes)", "[engine][table]") {
  TempDir dir;
  const TableParams p = Params(dir / "t");
  EngineCounters c;
  auto t = Open(p, &c);
  std::string model = Value(9, 1 << 20);
  REQUIRE(t->Put(9, model).ok());
  const uint64_t before = c.bytes_appended.load();
  for (int i = 0; i < 100; ++i) {
    const std::string piece = Value(i, 10);
    REQUIRE(t->Append(9, piece).ok());
    model += piece;
  }
  const uint64_t written = c.bytes_appended.load() - before;
  INFO("bytes written for 1000 appended bytes: " << written);
  // 100 rewrites of the value would be 100 MiB; not one may happen.
  REQUIRE(written < (1u << 20));
  REQUIRE(MustGet(*t, 9) == model);
  REQUIRE(t->Close().ok());
  t = Open(p, &c, false);
  REQUIRE(MustGet(*t, 9) == model);
}

TEST_CASE("FlatTable::Get returns Corruption for a record with a flipped byte on disk",
          "[engine][table]") {
  TempDir dir;
  const int w = GENERATE(4, 6);
  const TableParams p = Params(dir / "t", w);
  EngineCounters c;
  const size_t size = GENERATE(100, 5000, 70000);
  const std::string victim = Value(20, size);
  {
    auto t = Open(p, &c);
    REQUIRE(t->Put(20, victim).ok());
    REQUIRE(t->Put(24, Value(24, size)).ok());  // same data file, after it
    REQUIRE(t->Put(30, Value(30, 1000)).ok());
    REQUIRE(t->Append(30, "tail").ok());  // a fragment pointing at the record above
  }
  FlipInside(DataPath(p, 20), victim);
  FlipInside(DataPath(p, 30), Value(30, 1000));  // an older part of an appended value
  auto t = Open(p, &c, false);
  const uint64_t corrupt = c.corrupt_records.load();
  std::string v = "unchanged";
  REQUIRE(t->Get(20, &v).IsCorruption());
  REQUIRE(v == "unchanged");
  REQUIRE(c.corrupt_records.load() == corrupt + 1);
  REQUIRE(t->Get(30, &v).IsCorruption());
  REQUIRE(v == "unchanged");
  REQUIRE(c.corrupt_records.load() == corrupt + 2);
  REQUIRE(MustGet(*t, 24) == Value(24, size));
}

TEST_CASE("FlatTable rebuilds a deleted index from the data files", "[engine][table]") {
  TempDir dir;
  const TableParams p = Params(dir / "t");
  const std::map<int64_t, std::string> model = Populate(p, 400);
  REQUIRE(unlink((p.dir + "/index").c_str()) == 0);
  EngineCounters c;
  auto t = Open(p, &c, false);
  CheckModel(*t, model);
  REQUIRE(c.recovery_bytes_scanned.load() > 0);
  REQUIRE(t->Close().ok());
  EngineCounters c2;
  t = Open(p, &c2, false);  // the rebuilt index was closed cleanly
  REQUIRE(c2.recovery_bytes_scanned.load() == 0);
  CheckModel(*t, model);
}

TEST_CASE("FlatTable counts the rebuild of a deleted index", "[engine][table]") {
  // A deleted index is rebuilt from the logs and counted as a rebuild.
  TempDir dir;
  const TableParams p = Params(dir / "t");
  const std::map<int64_t, std::string> model = Populate(p, 50);
  REQUIRE(unlink((p.dir + "/index").c_str()) == 0);
  EngineCounters c;
  auto t = Open(p, &c, false);
  CheckModel(*t, model);
  REQUIRE(c.index_rebuilds.load() == 1);
}

TEST_CASE("FlatTable rebuilds an index whose header is damaged", "[engine][table]") {
  TempDir dir;
  const TableParams p = Params(dir / "t");
  const std::map<int64_t, std::string> model = Populate(p, 400);
  const size_t off = GENERATE(0, 16, 40, 48, 2000);  // magic, kmin, crc, checkpoint, padding
  std::string index = ReadFile(p.dir + "/index");
  index[off] ^= 0x04;
  WriteFile(p.dir + "/index", index);
  EngineCounters c;
  auto t = Open(p, &c, false);
  REQUIRE(c.index_rebuilds.load() == 1);
  REQUIRE(c.recovery_bytes_scanned.load() > 0);
  CheckModel(*t, model);
}

TEST_CASE("A new table whose index reached the disk without its records opens without them",
          "[engine][table]") {
  // Creating a table syncs nothing and its first write does not mark the
  // index dirty: the new index says clean with every checkpoint 0. An OS
  // crash can keep index pages whose records never reached the disk; here
  // the index as it was after the writes, and no data file.
  TempDir dir;
  const TableParams p = Params(dir / "t");
  std::string index;
  {
    EngineCounters c;
    auto t = Open(p, &c);
    for (int64_t k = 0; k < 40; ++k) REQUIRE(t->Put(k, Value(k, 20)).ok());
    index = ReadFile(p.dir + "/index");
  }
  WriteFile(p.dir + "/index", index);
  for (int f = 0; f < kFiles; ++f) REQUIRE(unlink(DataPath(p, kMin + f).c_str()) == 0);
  EngineCounters c;
  auto t = Open(p, &c, false);
  for (int64_t k = 0; k < 40; ++k) {
    std::string v = "unchanged";
    INFO("key " << k);
    REQUIRE(t->Get(k, &v).IsNotFound());
    REQUIRE(v == "unchanged");
  }
  REQUIRE(t->LiveKeys() == 0);
  REQUIRE(t->Put(7, "after").ok());
  REQUIRE(MustGet(*t, 7) == "after");
}

TEST_CASE("A table whose META is empty, as an OS crash right after its creation leaves it, "
          "is created again",
          "[engine][table]") {
  TempDir dir;
  const TableParams p = Params(dir / "t");
  {
    EngineCounters c;
    auto t = Open(p, &c);
  }
  WriteFile(p.dir + "/META", "");
  EngineCounters c;
  auto t = Open(p, &c);
  REQUIRE(t->Put(3, "three").ok());
  REQUIRE(t->Close().ok());
  t = Open(p, &c, false);
  REQUIRE(MustGet(*t, 3) == "three");
  // Without "create", an empty META is a table that does not exist.
  WriteFile(p.dir + "/META", "");
  std::unique_ptr<FlatTable> none;
  REQUIRE(FlatTable::Open(p, false, &c, &none).IsNotFound());
}

TEST_CASE("FlatTable recovers every write of a process that exits without closing",
          "[engine][table]") {
  TempDir dir;
  const TableParams p = Params(dir / "t");
  const bool reopened = GENERATE(false, true);
  std::map<int64_t, std::string> model;
  if (reopened) {  // the crash hits a table with a checkpoint from a clean close
    EngineCounters c;
    auto t = Open(p, &c);
    REQUIRE(t->Put(500, "from before").ok());
    model[500] = "from before";
  }
  const int n = 600;
  REQUIRE(ExitedOk(RunChild([&] { return CrashChild(p, n); })));
  bool ok = true;
  CrashOps(nullptr, &model, n, &ok);

  EngineCounters c;
  auto t = Open(p, &c, false);
  REQUIRE(c.recovery_bytes_scanned.load() > 0);
  REQUIRE(c.corrupt_records.load() == 0);  // reserved zeros are not corruption
  CheckModel(*t, model);
  REQUIRE(t->Close().ok());
  EngineCounters c2;
  t = Open(p, &c2, false);
  REQUIRE(c2.recovery_bytes_scanned.load() == 0);
  CheckModel(*t, model);
}

TEST_CASE("FlatTable reopens after a clean close without reading the logs",
          "[engine][table]") {
  TempDir dir;
  const TableParams p = Params(dir / "t");
  const std::map<int64_t, std::string> model = Populate(p, 300);
  for (int i = 0; i < 2; ++i) {  // also after an open with no writes
    EngineCounters c;
    auto t = Open(p, &c, false);
    REQUIRE(c.recovery_bytes_scanned.load() == 0);
    REQUIRE(c.index_rebuilds.load() == 0);
    CheckModel(*t, model);
  }
}

TEST_CASE("FlatTable recovery skips a corrupt record and keeps the records after it",
          "[engine][table]") {
  // A corrupt record in the replayed tail is skipped; the valid records after
  // it survive recovery (the file is not cut at the bad record).
  TempDir dir;
  const TableParams p = Params(dir / "t");
  REQUIRE(ExitedOk(RunChild([&] {
    EngineCounters c;
    std::unique_ptr<FlatTable> t;
    if (!FlatTable::Open(p, true, &c, &t).ok()) return 2;
    for (int64_t k = 0; k < 40; k += kFiles) {  // all in one data file
      if (!t->Put(k, Value(k, 200)).ok()) return 3;
    }
    (void)t.release();
    return 0;
  })));
  FlipInside(DataPath(p, 8), Value(8, 200));
  EngineCounters c;
  auto t = Open(p, &c, false);
  CHECK(c.corrupt_records.load() >= 1);
  std::string v;
  CHECK_FALSE(t->Get(8, &v).ok());
  for (int64_t k = 0; k < 40; k += kFiles) {
    if (k == 8) continue;
    INFO("key " << k);
    CHECK(t->Get(k, &v).ok());
    CHECK(v == Value(k, 200));
  }
}

TEST_CASE("FlatTable::Get returns an error instead of crashing on a damaged index slot",
          "[engine][table]") {
  // Index slots carry no checksum. A damaged slot may still lead to the right
  // record (then the value is right), otherwise Get must return Corruption:
  // never another key's value, a huge allocation or a crash. Run in a child.
  TempDir dir;
  const TableParams p = Params(dir / "t");
  {
    EngineCounters c;
    auto t = Open(p, &c);
    REQUIRE(t->Put(0, "zero").ok());  // data file 0 only
    REQUIRE(t->Put(4, "four").ok());
  }
  std::unique_ptr<FlatIndex> index;
  REQUIRE(FlatIndex::Open(p.dir + "/index", p.index, false, &index).ok());
  const uint64_t zero_slot = index->Load(0 - kMin);  // key 0's record
  REQUIRE(((zero_slot - 1) >> 6) == 0);                // is at offset 0
  int64_t key = 0;
  uint64_t value = 0;
  std::string right;  // the one acceptable value, if any
  SECTION("a size hint of the largest class (96 GiB)") {
    value = 64;  // ((0 << 6) | 63) + 1
    right = "zero";
  }
  SECTION("a key whose data file was never created") {
    key = 1;
    value = 1;
  }
  SECTION("an offset past the end of the data file") {
    value = ((uint64_t{1} << 30) << 6) + 1;
  }
  SECTION("another key's record") {
    key = 4;
    value = zero_slot;
  }
  REQUIRE(index->Store(static_cast<uint64_t>(key - kMin), value).ok());
  index.reset();
  const int status = RunChild([&] {
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
    // (Both sanitizers reserve terabytes of shadow address space up front.)
    const rlimit lim = {rlim_t{8} << 30, rlim_t{8} << 30};  // never really allocate
    setrlimit(RLIMIT_AS, &lim);
#endif
    EngineCounters c;
    std::unique_ptr<FlatTable> t;
    if (!FlatTable::Open(p, false, &c, &t).ok()) return 2;
    std::string v;
    try {
      Status st = t->Get(key, &v);
      std::fprintf(stderr, "child: %s\n", st.ToString().c_str());
      return st.IsCorruption() || (st.ok() && !right.empty() && v == right) ? 0 : 4;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child: Get threw %s\n", e.what());
      return 5;
    }
  });
  INFO("child wait status " << status);
  REQUIRE(ExitedOk(status));
}

TEST_CASE("FlatTable::ReadIfSmall reads appended values whole and reads through a compaction",
          "[engine][table]") {
  // Store::SPut rewrites a small string bucket whole only when ReadIfSmall
  // says it is small: an appended bucket, or one read while its table
  // compacts, must count too, or every later put appends to it for good.
  TempDir dir;
  EngineCounters c;
  auto t = Open(Params(dir / "t"), &c);
  REQUIRE(t->Put(5, "base").ok());
  REQUIRE(t->Append(5, "+one").ok());
  REQUIRE(t->Append(5, "+two").ok());
  std::string v;
  bool small = false;
  REQUIRE(t->ReadIfSmall(5, 100, &v, &small).ok());
  REQUIRE(small);
  CHECK(v == "base+one+two");
  v = "unchanged";
  REQUIRE(t->ReadIfSmall(5, 8, &v, &small).ok());  // 12 bytes > 8
  CHECK_FALSE(small);
  CHECK(v == "unchanged");
  CHECK(t->ReadIfSmall(6, 100, &v, &small).IsNotFound());

  // While compacting into a successor: the value still only here, then one
  // written after the compaction began (it lives only in the successor).
  REQUIRE(t->Put(7, "seven").ok());
  auto next = Open(Params(dir / "next"), &c);
  std::vector<uint64_t> ends;
  t->BeginCompaction(next.get(), &ends);
  REQUIRE(t->ReadIfSmall(7, 100, &v, &small).ok());
  REQUIRE(small);
  CHECK(v == "seven");
  REQUIRE(t->Put(7, "SEVEN").ok());
  REQUIRE(t->ReadIfSmall(7, 100, &v, &small).ok());
  REQUIRE(small);
  CHECK(v == "SEVEN");
  CopyAllAndSwitch(t.get(), ends);
  REQUIRE(t->ReadIfSmall(5, 100, &v, &small).ok());
  REQUIRE(small);
  CHECK(v == "base+one+two");
  CHECK(t->ReadIfSmall(6, 100, &v, &small).IsNotFound());
}

TEST_CASE("A compaction copies values its transform keeps as they are, and rewrites the others",
          "[engine][table]") {
  TempDir dir;
  EngineCounters c;
  auto t = Open(Params(dir / "t"), &c);
  REQUIRE(t->Put(1, "keep me").ok());
  REQUIRE(t->Put(2, "rewrite me").ok());
  REQUIRE(t->Put(3, "drop me").ok());
  auto next = Open(Params(dir / "next"), &c);
  std::vector<uint64_t> ends;
  int rewritten = 0;
  flatkv::engine::CopyTransform transform{
      [&](std::string* v) {
        ++rewritten;
        if (*v == "drop me") return false;
        *v = "rewritten";
        return true;
      },
      [](std::string_view v) { return v.substr(0, 4) == "keep"; }};
  t->BeginCompaction(next.get(), &ends, transform);
  CopyAllAndSwitch(t.get(), ends);
  CHECK(rewritten == 2);  // "keep me" went verbatim
  CHECK(MustGet(*next, 1) == "keep me");
  CHECK(MustGet(*next, 2) == "rewritten");
  std::string v;
  CHECK(next->Get(3, &v).IsNotFound());
}
