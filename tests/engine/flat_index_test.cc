// Tests of engine/flat_index.{h,cc}: slot widths 4..8 (including slots that
// straddle a page), persistence of slots and header, every way Open refuses a
// damaged or mismatched file, and that the slot area stays sparse.
#include <catch2/catch.hpp>

#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/flat_index.h"
#include "tests/engine/test_util.h"

using flatkv::Status;
using flatkv::engine::FlatIndex;
using flatkv::engine::IndexParams;
using flatkv::test::FileSize;
using flatkv::test::ReadFile;
using flatkv::test::TempDir;
using flatkv::test::WriteFile;

namespace {

constexpr uint64_t kPage = 4096;

IndexParams Params(int item_bytes, uint64_t slots = 5000, int64_t kmin = -1000,
                   int data_files = 7) {
  IndexParams p;
  p.kmin = kmin;
  p.slots = slots;
  p.item_bytes = item_bytes;
  p.data_files = data_files;
  return p;
}

std::unique_ptr<FlatIndex> MustOpen(const std::string& path, const IndexParams& p,
                                    bool create = true) {
  std::unique_ptr<FlatIndex> index;
  Status st = FlatIndex::Open(path, p, create, &index);
  INFO(st.ToString());
  REQUIRE(st.ok());
  REQUIRE(index != nullptr);
  return index;
}

Status TryOpen(const std::string& path, const IndexParams& p, bool create = false) {
  std::unique_ptr<FlatIndex> index;
  return FlatIndex::Open(path, p, create, &index);
}

uint64_t MaxValue(int w) { return w == 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * w)) - 1; }

// The first slot at or after byte "page_end" of the slot area that crosses it.
uint64_t StraddlingSlot(int w, uint64_t page_end) {
  for (uint64_t s = (page_end - w) / w;; ++s) {
    if (s * w < page_end && (s + 1) * w > page_end) return s;
    if (s * w >= page_end) return UINT64_MAX;  // w divides the page: none
  }
}

// Slots worth checking for width w: ends, page straddlers and their neighbours.
std::vector<uint64_t> InterestingSlots(int w, uint64_t slots) {
  std::vector<uint64_t> out = {0, 1, 2, slots / 2, slots - 2, slots - 1};
  for (uint64_t page = 1; page <= 3; ++page) {
    const uint64_t s = StraddlingSlot(w, page * kPage);
    if (s != UINT64_MAX) out.push_back(s);
    out.push_back((page * kPage + w - 1) / w);  // the first slot after the boundary
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// A slot in page 5 (straddling it when the width allows) for neighbour checks.
uint64_t Neighbourhood(int w) {
  const uint64_t s = StraddlingSlot(w, 5 * kPage);
  return s != UINT64_MAX ? s : 5 * kPage / w + 10;
}

}  // namespace

TEST_CASE("FlatIndex creates an index with every slot absent and a clean header",
          "[engine][index]") {
  TempDir dir;
  const int w = GENERATE(4, 5, 6, 7, 8);
  const IndexParams p = Params(w);
  auto index = MustOpen(dir / "index", p);
  REQUIRE(FileSize(dir / "index") == FlatIndex::kHeaderBytes + p.slots * w);
  REQUIRE(access((dir / "index.tmp").c_str(), F_OK) != 0);
  REQUIRE(index->clean());
  REQUIRE(index->checkpoints() == std::vector<uint64_t>(p.data_files, 0));
  for (uint64_t s = 0; s < p.slots; ++s) REQUIRE(index->Load(s) == 0);
  REQUIRE(index->params().kmin == p.kmin);
  REQUIRE(index->params().slots == p.slots);
}

TEST_CASE("FlatIndex stores and loads every slot width including page straddlers",
          "[engine][index]") {
  TempDir dir;
  const int w = GENERATE(4, 5, 6, 7, 8);
  INFO("item_bytes " << w);
  const IndexParams p = Params(w, 20000);
  if (w % 4 != 0) REQUIRE(StraddlingSlot(w, kPage) != UINT64_MAX);
  const std::vector<uint64_t> slots = InterestingSlots(w, p.slots);
  const uint64_t max = MaxValue(w);
  // Distinct bytes in every position, so a byte-order or width slip shows.
  auto value_for = [&](size_t i) -> uint64_t {
    if (i % 3 == 0) return max;
    return (0x0807060504030201ull * (i + 1)) & max;
  };
  {
    auto index = MustOpen(dir / "index", p);
    for (size_t i = 0; i < slots.size(); ++i) {
      REQUIRE(index->Store(slots[i], value_for(i)).ok());
      REQUIRE(index->Load(slots[i]) == value_for(i));
    }
    // Neighbours of a maximal slot stay untouched: no byte spills over.
    const uint64_t s = Neighbourhood(w);
    REQUIRE(index->Store(s, max).ok());
    REQUIRE(index->Load(s - 1) == 0);
    REQUIRE(index->Load(s + 1) == 0);
    REQUIRE(index->Store(s - 1, max).ok());
    REQUIRE(index->Store(s + 1, max).ok());
    REQUIRE(index->Store(s, 0).ok());
    REQUIRE(index->Load(s) == 0);
    REQUIRE(index->Load(s - 1) == max);
    REQUIRE(index->Load(s + 1) == max);
  }
  // Values survive closing and reopening.
  auto index = MustOpen(dir / "index", p, false);
  for (size_t i = 0; i < slots.size(); ++i) {
    INFO("slot " << slots[i]);
    REQUIRE(index->Load(slots[i]) == value_for(i));
  }
  const uint64_t s = Neighbourhood(w);
  REQUIRE(index->Load(s - 1) == max);
  REQUIRE(index->Load(s) == 0);
  REQUIRE(index->Load(s + 1) == max);
  REQUIRE(index->Load(3) == 0);
}

TEST_CASE("FlatIndex::WriteHeader persists the clean flag and checkpoints",
          "[engine][index]") {
  TempDir dir;
  const IndexParams p = Params(6, 100, 5, 4);
  const std::vector<uint64_t> cps = {1, uint64_t{1} << 40, 0, ~uint64_t{0}};
  {
    auto index = MustOpen(dir / "index", p);
    REQUIRE(index->Store(7, 77).ok());
    REQUIRE(index->WriteHeader(false, cps).ok());
    REQUIRE_FALSE(index->clean());
    REQUIRE(index->checkpoints() == cps);
  }
  {
    auto index = MustOpen(dir / "index", p, false);
    REQUIRE_FALSE(index->clean());
    REQUIRE(index->checkpoints() == cps);
    REQUIRE(index->Load(7) == 77);  // the header write left the slots alone
    REQUIRE(index->WriteHeader(true, {4, 3, 2, 1}).ok());
  }
  auto index = MustOpen(dir / "index", p, false);
  REQUIRE(index->clean());
  REQUIRE(index->checkpoints() == std::vector<uint64_t>{4, 3, 2, 1});
}

TEST_CASE("FlatIndex::Open returns NotFound for a missing file without create",
          "[engine][index]") {
  TempDir dir;
  Status st = TryOpen(dir / "index", Params(6), false);
  REQUIRE(st.IsNotFound());
  REQUIRE(access((dir / "index").c_str(), F_OK) != 0);
}

TEST_CASE("FlatIndex::Open refuses bad parameters", "[engine][index]") {
  TempDir dir;
  REQUIRE(TryOpen(dir / "index", Params(3), true).IsInvalidArgument());
  REQUIRE(TryOpen(dir / "index", Params(9), true).IsInvalidArgument());
  REQUIRE(TryOpen(dir / "index", Params(6, 0), true).IsInvalidArgument());
  REQUIRE(TryOpen(dir / "index", Params(6, 10, 0, 0), true).IsInvalidArgument());
  REQUIRE(TryOpen(dir / "index", Params(6, 10, 0, FlatIndex::kMaxDataFiles + 1), true)
              .IsInvalidArgument());
  REQUIRE(access((dir / "index").c_str(), F_OK) != 0);
  // The largest file count still fits the header.
  auto index = MustOpen(dir / "index", Params(6, 10, 0, FlatIndex::kMaxDataFiles));
  std::vector<uint64_t> cps(FlatIndex::kMaxDataFiles);
  for (size_t i = 0; i < cps.size(); ++i) cps[i] = i * 1000 + 1;
  REQUIRE(index->WriteHeader(true, cps).ok());
  index.reset();
  index = MustOpen(dir / "index", Params(6, 10, 0, FlatIndex::kMaxDataFiles), false);
  REQUIRE(index->checkpoints() == cps);
}

TEST_CASE("FlatIndex::Open returns Corruption for a damaged header", "[engine][index]") {
  TempDir dir;
  const std::string path = dir / "index";
  const IndexParams p = Params(6, 1000, -3, 5);
  {
    auto index = MustOpen(path, p);
    REQUIRE(index->Store(10, 1234).ok());
    REQUIRE(index->WriteHeader(false, {1, 2, 3, 4, 5}).ok());
  }
  const std::string good = ReadFile(path);
  const bool create = GENERATE(false, true);  // create must not paper over damage
  // Magic, version, width, kmin, slots, N, clean, crc, pad, a checkpoint, the
  // zeros after the checkpoints, the last header byte.
  for (size_t off : {0, 7, 8, 12, 16, 24, 32, 36, 40, 44, 48, 80, 1000, 4095}) {
    INFO("flipped header byte " << off << " create " << create);
    std::string bad = good;
    bad[off] = static_cast<char>(bad[off] ^ 0x01);
    WriteFile(path, bad);
    Status st = TryOpen(path, p, create);
    REQUIRE(st.IsCorruption());
  }
  WriteFile(path, good);
  auto index = MustOpen(path, p, false);
  REQUIRE(index->Load(10) == 1234);
}

TEST_CASE("FlatIndex::Open returns Corruption for a file of the wrong size", "[engine][index]") {
  TempDir dir;
  const std::string path = dir / "index";
  const IndexParams p = Params(5, 1000);
  MustOpen(path, p).reset();
  const std::string good = ReadFile(path);
  const uint64_t size = good.size();
  const bool create = GENERATE(false, true);
  for (uint64_t bad_size : {uint64_t{0}, uint64_t{100}, uint64_t{4096}, size - 1, size + 1,
                            size + 5, size + 4096}) {
    INFO("size " << bad_size << " create " << create);
    REQUIRE(truncate(path.c_str(), static_cast<off_t>(bad_size)) == 0);
    REQUIRE(TryOpen(path, p, create).IsCorruption());
  }
  WriteFile(path, good);
  MustOpen(path, p, false);
}

TEST_CASE("FlatIndex::Open returns Corruption when the parameters differ", "[engine][index]") {
  TempDir dir;
  const std::string path = dir / "index";
  const IndexParams p = Params(6, 1000, 100, 4);
  MustOpen(path, p).reset();
  IndexParams q = p;
  SECTION("item_bytes") { q.item_bytes = GENERATE(4, 5, 7, 8); }
  SECTION("kmin") { q.kmin = GENERATE(99, 101, -100); }
  SECTION("slots") { q.slots = GENERATE(999, 1001, 2000); }
  SECTION("data_files") { q.data_files = GENERATE(1, 3, 5, 16); }
  REQUIRE(TryOpen(path, q, false).IsCorruption());
  REQUIRE(TryOpen(path, q, true).IsCorruption());
  MustOpen(path, p, false);  // the file was left alone
}

TEST_CASE("FlatIndex keeps a sparse index sparse on disk", "[engine][index]") {
  TempDir dir;
  const std::string path = dir / "index";
  const IndexParams p = Params(6, uint64_t{1} << 24, 0, 16);
  const uint64_t far[] = {0, (uint64_t{1} << 23) + 12345, (uint64_t{1} << 24) - 1};
  {
    auto index = MustOpen(path, p);
    for (uint64_t s : far) REQUIRE(index->Store(s, s + 1).ok());
    REQUIRE(index->Sync().ok());
    REQUIRE(index->WriteHeader(false, std::vector<uint64_t>(16, 9)).ok());
  }
  struct stat st;
  REQUIRE(stat(path.c_str(), &st) == 0);
  REQUIRE(static_cast<uint64_t>(st.st_size) == FlatIndex::kHeaderBytes + (uint64_t{6} << 24));
  INFO("allocated bytes " << st.st_blocks * 512);
  REQUIRE(static_cast<uint64_t>(st.st_blocks) * 512 < (uint64_t{1} << 20));
  auto index = MustOpen(path, p, false);
  for (uint64_t s : far) REQUIRE(index->Load(s) == s + 1);
  REQUIRE(index->Load(1) == 0);
  REQUIRE(index->Load(uint64_t{1} << 23) == 0);
}

TEST_CASE("FlatIndex reopened keeps the slots of a page it reserves again", "[engine][index]") {
  // A reopened index has reserved nothing yet: the first store into a page
  // that already holds slots reserves it again, and must leave those slots
  // as they are, whether the page reached the disk (synced) or is still
  // only in the page cache.
  const bool synced = GENERATE(false, true);
  TempDir dir;
  const std::string path = dir / "index";
  const IndexParams p = Params(6, 20000, 0, 4);
  const uint64_t per_page = kPage / 6;
  {
    auto index = MustOpen(path, p);
    for (uint64_t s = 0; s < p.slots; s += 2) REQUIRE(index->Store(s, s + 1).ok());
    if (synced) REQUIRE(index->Sync().ok());
  }
  {
    auto index = MustOpen(path, p, false);
    // One store into each page, in an order that is not the file's.
    for (uint64_t page = 0; page * per_page < p.slots; ++page) {
      const uint64_t s = ((page * 7) % ((p.slots + per_page - 1) / per_page)) * per_page + 1;
      if (s < p.slots) REQUIRE(index->Store(s, s + 1).ok());
    }
  }
  auto index = MustOpen(path, p, false);
  for (uint64_t s = 0; s < p.slots; ++s) {
    const bool stored = s % 2 == 0 || s % per_page == 1;
    INFO("slot " << s);
    REQUIRE(index->Load(s) == (stored ? s + 1 : 0));
  }
}

TEST_CASE("FlatIndex: writers storing into the same new pages at once lose no slot",
          "[engine][index]") {
  // Writers of different data files store into neighbouring slots, so they
  // reserve the same pages at the same moment: the first reservation of a
  // page (which fills a hole with zeros) must not land after another
  // writer's store there.
  TempDir dir;
  const int kWriters = 4;
  const IndexParams p = Params(6, 400000, 0, kWriters);
  auto index = MustOpen(dir / "index", p);
  std::vector<std::thread> writers;
  for (int w = 0; w < kWriters; ++w) {
    writers.emplace_back([&, w] {
      for (uint64_t s = static_cast<uint64_t>(w); s < p.slots; s += kWriters) {
        if (!index->Store(s, s + 1).ok()) return;
      }
    });
  }
  for (auto& t : writers) t.join();
  uint64_t lost = 0;
  for (uint64_t s = 0; s < p.slots; ++s) lost += index->Load(s) != s + 1;
  REQUIRE(lost == 0);
}

TEST_CASE("FlatIndex on a full disk refuses a store into a new page, with NoSpace",
          "[engine][index]") {
  // A store into a page not yet reserved must fail as NoSpace when the file
  // system has no block for it, never write through the mapping into a
  // hole (a SIGBUS that kills the process); stores into pages reserved
  // before keep working. The disk is a 64 KiB tmpfs mounted here.
  TempDir dir;
  const std::string mnt = dir / "fs";
  REQUIRE(mkdir(mnt.c_str(), 0755) == 0);
  if (mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=64k") != 0) {
    WARN("not run: mounting a small tmpfs needs root (" << std::strerror(errno) << ")");
    return;
  }
  struct Unmount {
    std::string path;
    ~Unmount() { umount2(path.c_str(), MNT_DETACH); }
  } unmount{mnt};
  const IndexParams p = Params(8, uint64_t{1} << 20, 0, 4);  // 8 MiB of slots
  const uint64_t per_page = kPage / 8;
  std::vector<uint64_t> stored;
  Status st;
  {
    auto index = MustOpen(mnt + "/index", p);
    for (uint64_t page = 0; page < 64 && st.ok(); ++page) {
      const uint64_t s = page * 97 % 2048 * per_page;  // pages out of file order
      st = index->Store(s, s + 1);
      if (st.ok()) stored.push_back(s);
    }
    INFO(st.ToString());
    REQUIRE(st.IsNoSpace());
    CHECK(st.message().find(mnt + "/index") != std::string::npos);
    REQUIRE(!stored.empty());
    // A reserved page still takes stores.
    REQUIRE(index->Store(stored[0] + 1, 7).ok());
    for (uint64_t s : stored) REQUIRE(index->Load(s) == s + 1);
    REQUIRE(index->Sync().ok());
  }
  auto index = MustOpen(mnt + "/index", p, false);
  for (uint64_t s : stored) REQUIRE(index->Load(s) == s + 1);
  REQUIRE(index->Load(stored[0] + 1) == 7);
}

TEST_CASE("FlatIndex::Clear makes every slot absent", "[engine][index]") {
  TempDir dir;
  const std::string path = dir / "index";
  const int w = GENERATE(4, 6, 8);
  const IndexParams p = Params(w, 20000);
  {
    auto index = MustOpen(path, p);
    for (uint64_t s = 0; s < p.slots; s += 97) REQUIRE(index->Store(s, s + 1).ok());
    REQUIRE(index->Clear().ok());
    for (uint64_t s = 0; s < p.slots; ++s) REQUIRE(index->Load(s) == 0);
    // Slots work again after a clear, including in pages it released.
    REQUIRE(index->Store(97, 5).ok());
    REQUIRE(index->Store(p.slots - 1, 6).ok());
    REQUIRE(index->Load(97) == 5);
  }
  auto index = MustOpen(path, p, false);
  for (uint64_t s = 0; s < p.slots; ++s) {
    const uint64_t want = s == 97 ? 5 : s == p.slots - 1 ? 6 : 0;
    REQUIRE(index->Load(s) == want);
  }
}

TEST_CASE("FlatIndex::EmptySpan reports the empty group, chunk or index around a slot",
          "[engine][index][scan]") {
  TempDir dir;
  const uint64_t g = FlatIndex::kGroupSlots;
  const uint64_t c = FlatIndex::kChunkSlots;
  const IndexParams p = Params(6, 3 * c, 0, 16);
  auto index = MustOpen(dir / "index", p);
  REQUIRE(index->LiveSlots() == 0);
  REQUIRE(index->EmptySpan(0) == p.slots);  // an empty index is one empty run
  REQUIRE(index->EmptySpan(p.slots - 1) == p.slots);
  const uint64_t key = c + 5 * g + 7;  // chunk 1, group 5 of it
  REQUIRE(index->Store(key, 42).ok());
  REQUIRE(index->LiveSlots() == 1);
  REQUIRE(index->EmptySpan(0) == c);                // chunk 0
  REQUIRE(index->EmptySpan(2 * c + 3) == c);        // chunk 2
  REQUIRE(index->EmptySpan(c) == g);                // chunk 1, group 0
  REQUIRE(index->EmptySpan(c + 6 * g) == g);        // the group after the key's
  REQUIRE(index->EmptySpan(key) == 0);
  REQUIRE(index->EmptySpan(c + 5 * g) == 0);        // same group, another slot
  // Overwriting keeps one live slot; removing empties everything again.
  REQUIRE(index->Store(key, 43).ok());
  REQUIRE(index->LiveSlots() == 1);
  REQUIRE(index->Store(key, 0).ok());
  REQUIRE(index->LiveSlots() == 0);
  REQUIRE(index->EmptySpan(key) == p.slots);
  // Storing zero over zero changes nothing.
  REQUIRE(index->Store(key + 1, 0).ok());
  REQUIRE(index->LiveSlots() == 0);
}

TEST_CASE("FlatIndex rebuilds its live-slot counts at open, removed pages counting zero",
          "[engine][index][scan]") {
  TempDir dir;
  const std::string path = dir / "index";
  const int w = GENERATE(4, 5, 6, 7, 8);
  const uint64_t g = FlatIndex::kGroupSlots;
  const IndexParams p = Params(w, 40 * g, 0, 16);
  // Live: a page straddler (counted once), slots in group 3; removed: all of
  // group 20 (its pages stay allocated on disk but hold only zeros).
  std::vector<uint64_t> live = {3 * g, 3 * g + 1, 4 * g - 1, p.slots - 1};
  const uint64_t straddler = StraddlingSlot(w, kPage);
  if (straddler != UINT64_MAX) live.push_back(straddler);
  {
    auto index = MustOpen(path, p);
    for (uint64_t s : live) REQUIRE(index->Store(s, 7).ok());
    for (uint64_t s = 20 * g; s < 21 * g; ++s) REQUIRE(index->Store(s, 9).ok());
    REQUIRE(index->LiveSlots() == live.size() + g);
    for (uint64_t s = 20 * g; s < 21 * g; ++s) REQUIRE(index->Store(s, 0).ok());
    REQUIRE(index->LiveSlots() == live.size());
    REQUIRE(index->Sync().ok());
  }
  auto index = MustOpen(path, p, false);
  REQUIRE(index->LiveSlots() == live.size());
  REQUIRE(index->EmptySpan(20 * g) == FlatIndex::kGroupSlots);
  REQUIRE(index->EmptySpan(21 * g - 1) == FlatIndex::kGroupSlots);
  REQUIRE(index->EmptySpan(3 * g + 100) == 0);
  for (uint64_t s : live) REQUIRE(index->EmptySpan(s) == 0);
  REQUIRE(index->Clear().ok());
  REQUIRE(index->LiveSlots() == 0);
  REQUIRE(index->EmptySpan(3 * g) == p.slots);
}
