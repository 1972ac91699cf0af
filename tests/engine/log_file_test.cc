// Tests of engine/log_file.{h,cc}: LogFile appends (mapped and pwritev paths),
// reads, close and truncation; LogReader in the style of LevelDB's
// log_test.cc: every kind of damage is reported once through the Reporter,
// skipped, and never hides the valid records after it.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cctype>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "engine/log_file.h"
#include "engine/record.h"
#include "tests/engine/test_util.h"

using flatkv::Status;
using flatkv::engine::EncodeRecord;
using flatkv::engine::LogFile;
using flatkv::engine::LogReader;
using flatkv::engine::ParseRecord;
using flatkv::engine::ParseResult;
using flatkv::engine::RecordSize;
using flatkv::engine::RecordType;
using flatkv::engine::RecordView;
using flatkv::test::FileSize;
using flatkv::test::ReadFile;
using flatkv::test::TempDir;
using flatkv::test::WriteFile;

namespace {

// Letters only, so no byte of a value can look like a record header.
std::string Value(size_t n, int seed) {
  std::string s(n, '\0');
  uint32_t x = static_cast<uint32_t>(seed) * 2654435761u + 7;
  for (auto& c : s) {
    x = x * 1103515245u + 12345u;
    c = static_cast<char>('a' + (x >> 16) % 26);
  }
  return s;
}

struct Written {
  int64_t key;
  std::string value;
  uint64_t pos;
  size_t size;
};

struct Report {
  uint64_t offset;
  uint64_t bytes;
  std::string reason;
};

struct ReadResult {
  std::vector<Written> records;
  std::vector<Report> reports;
  uint64_t valid_end = 0;
  Status status;
};

// Reads [start, limit) (limit defaults to the file's logical end).
ReadResult ReadAll(const LogFile& log, uint64_t start = 0, uint64_t limit = UINT64_MAX) {
  ReadResult out;
  LogReader reader(&log, start, limit == UINT64_MAX ? log.end() : limit,
                   [&](uint64_t offset, uint64_t bytes, const char* reason) {
                     out.reports.push_back({offset, bytes, reason});
                   });
  RecordView view;
  uint64_t pos;
  while (reader.Next(&view, &pos)) {
    out.records.push_back({view.key, std::string(view.value), pos, view.size});
  }
  out.valid_end = reader.valid_end();
  out.status = reader.status();
  return out;
}

// Appends one kValue record per size, key = index + 1; returns what was written.
std::vector<Written> AppendAll(LogFile* log, const std::vector<size_t>& sizes, int seed = 0) {
  std::vector<Written> out;
  for (size_t i = 0; i < sizes.size(); ++i) {
    Written w{static_cast<int64_t>(i + 1), Value(sizes[i], seed + static_cast<int>(i)), 0, 0};
    const uint64_t end_before = log->end();
    REQUIRE(log->Append(RecordType::kValue, w.key, 1000 + i, {}, w.value, &w.pos, &w.size).ok());
    REQUIRE(w.pos == end_before);
    REQUIRE(w.size == RecordSize(w.value.size()));
    REQUIRE(log->end() == w.pos + w.size);
    out.push_back(std::move(w));
  }
  return out;
}

void CheckRecords(const std::vector<Written>& got, const std::vector<Written>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("record " << i);
    REQUIRE(got[i].key == want[i].key);
    REQUIRE(got[i].pos == want[i].pos);
    REQUIRE(got[i].size == want[i].size);
    REQUIRE(got[i].value == want[i].value);
  }
}

// Reads the whole log: no error, no damage reported, exactly "want".
ReadResult ReadsBackClean(const LogFile& log, const std::vector<Written>& want) {
  ReadResult r = ReadAll(log);
  REQUIRE(r.status.ok());
  REQUIRE(r.reports.empty());
  CheckRecords(r.records, want);
  return r;
}

std::unique_ptr<LogFile> Open(const std::string& path) {
  std::unique_ptr<LogFile> log;
  REQUIRE(LogFile::Open(path, true, &log).ok());
  return log;
}

// Writes three records (values of the given sizes), closes the file and
// returns them; tests then damage the file and reopen it.
std::vector<Written> WriteThree(const std::string& path, size_t a = 100, size_t b = 200,
                                size_t c = 300) {
  auto log = Open(path);
  auto recs = AppendAll(log.get(), {a, b, c});
  REQUIRE(log->Close().ok());
  return recs;
}

void XorByte(const std::string& path, uint64_t off, char mask) {
  std::string data = ReadFile(path);
  REQUIRE(off < data.size());
  data[off] = static_cast<char>(data[off] ^ mask);
  WriteFile(path, data);
}

void Put32At(const std::string& path, uint64_t off, uint32_t v) {
  std::string data = ReadFile(path);
  std::memcpy(data.data() + off, &v, 4);
  WriteFile(path, data);
}

std::string Encode(int64_t key, const std::string& value) {
  std::string rec(RecordSize(value.size()), '\0');
  EncodeRecord(rec.data(), RecordType::kValue, key, 5, {}, value);
  return rec;
}

const std::vector<size_t> kSizes = {
    0, 1, 100, 4000, 5000,
    LogFile::kDirectWriteBytes - RecordSize(0) - 1,  // largest record of the mapped path
    LogFile::kDirectWriteBytes - RecordSize(0),      // smallest record of the pwritev path
    7, 70000, 3, (1u << 20) + 7, 10, 2u << 20, 0, 33};

}  // namespace

TEST_CASE("LogFile appends records of every size and LogReader returns them in order",
          "[engine][log]") {
  TempDir dir;
  auto log = Open(dir / "data.log");
  const auto recs = AppendAll(log.get(), kSizes);
  uint64_t total = 0;
  for (const auto& w : recs) total += w.size;
  REQUIRE(log->end() == total);
  REQUIRE(log->allocated() >= log->end());
  REQUIRE(FileSize(dir / "data.log") == log->allocated());

  ReadResult r = ReadsBackClean(*log, recs);  // while open: reads see the mapped writes
  REQUIRE(r.valid_end == total);
}

TEST_CASE("LogFile::Read returns each record's bytes at its position", "[engine][log]") {
  TempDir dir;
  auto log = Open(dir / "data.log");
  auto recs = AppendAll(log.get(), kSizes);
  uint64_t pos, size;
  size_t sz;
  REQUIRE(log->Append(RecordType::kAppend, -5, 9, "prefix:", "value", &pos, &sz).ok());
  size = sz;
  for (int pass = 0; pass < 2; ++pass) {
    for (const auto& w : recs) {
      std::string buf(w.size, '\0');
      size_t got = 0;
      REQUIRE(log->Read(w.pos, w.size, buf.data(), &got).ok());
      REQUIRE(got == w.size);
      RecordView view;
      REQUIRE(ParseRecord(buf.data(), got, &view) == ParseResult::kOk);
      REQUIRE(view.key == w.key);
      REQUIRE(view.value == w.value);
    }
    std::string buf(size, '\0');
    size_t got = 0;
    REQUIRE(log->Read(pos, size, buf.data(), &got).ok());
    RecordView view;
    REQUIRE(ParseRecord(buf.data(), got, &view) == ParseResult::kOk);
    REQUIRE(view.type == RecordType::kAppend);
    REQUIRE(view.key == -5);
    REQUIRE(view.value == "prefix:value");
    REQUIRE(log->Close().ok());  // second pass reads a reopened file
    log = Open(dir / "data.log");
  }
  // At the end of the file a read returns only what is there.
  std::string buf(100, 'x');
  size_t got = 99;
  REQUIRE(log->Read(log->end() - 10, 100, buf.data(), &got).ok());
  REQUIRE(got == 10);
  REQUIRE(log->Read(log->end(), 100, buf.data(), &got).ok());
  REQUIRE(got == 0);
}

TEST_CASE("LogFile::Close truncates the file to its end and a reopen continues it",
          "[engine][log]") {
  TempDir dir;
  const std::string path = dir / "data.log";
  auto log = Open(path);
  auto recs = AppendAll(log.get(), {10, 20, 30});
  REQUIRE(FileSize(path) > log->end());  // space reserved ahead while open
  const uint64_t end = log->end();
  REQUIRE(log->Close().ok());
  REQUIRE(log->Close().ok());  // idempotent
  REQUIRE(FileSize(path) == end);
  REQUIRE(end == RecordSize(10) + RecordSize(20) + RecordSize(30));
  uint64_t pos;
  size_t size;
  REQUIRE_FALSE(log->Append(RecordType::kValue, 1, 1, {}, "closed", &pos, &size).ok());

  log = Open(path);
  REQUIRE(log->end() == end);
  auto more = AppendAll(log.get(), {LogFile::kDirectWriteBytes, 5, 0}, 50);
  for (auto& w : more) w.key += 3;  // AppendAll numbers keys from 1 again
  ReadResult r = ReadAll(*log);
  REQUIRE(r.reports.size() == 0);
  REQUIRE(r.records.size() == 6);
  REQUIRE(r.records[3].pos == end);
  REQUIRE(log->Close().ok());
  uint64_t total = end;
  for (const auto& w : more) total += w.size;
  REQUIRE(FileSize(path) == total);

  log = Open(path);
  r = ReadAll(*log);
  REQUIRE(r.reports.empty());
  REQUIRE(r.records.size() == 6);
  for (size_t i = 0; i < 3; ++i) REQUIRE(r.records[i].value == recs[i].value);
  for (size_t i = 0; i < 3; ++i) REQUIRE(r.records[3 + i].value == more[i].value);
}

namespace {

// The records read back in order from the open file, then again, with
// nothing reported, after a clean close and a reopen (*log is the reopened
// file afterwards).
void ReadsBackBeforeAndAfterReopen(const std::string& path, std::unique_ptr<LogFile>* log,
                                   const std::vector<Written>& recs) {
  CheckRecords(ReadAll(**log).records, recs);
  REQUIRE((*log)->Close().ok());
  *log = Open(path);
  ReadResult r = ReadAll(**log);
  REQUIRE(r.reports.empty());
  CheckRecords(r.records, recs);
}

}  // namespace

TEST_CASE("LogFile keeps every byte of a long run of small appends", "[engine][log]") {
  // Several MiB through the mapped window: it is remapped and its written
  // pages dropped from the process several times along the way.
  TempDir dir;
  const std::string path = dir / "data.log";
  auto log = Open(path);
  std::vector<size_t> sizes;
  for (int i = 0; i < 2000; ++i) sizes.push_back(static_cast<size_t>(i * 37 % 4000));
  const auto recs = AppendAll(log.get(), sizes);
  ReadsBackBeforeAndAfterReopen(path, &log, recs);
}

TEST_CASE("LogFile::Open without create fails on a missing file", "[engine][log]") {
  TempDir dir;
  std::unique_ptr<LogFile> log;
  REQUIRE_FALSE(LogFile::Open(dir / "missing.log", false, &log).ok());
  REQUIRE(log == nullptr);
  REQUIRE(access((dir / "missing.log").c_str(), F_OK) != 0);
}

TEST_CASE("LogReader skips a record with a bad checksum and returns the ones after it",
          "[engine][log]") {
  // Regression: the reader must resynchronize on the next record, not take
  // the bad one and everything after it for a torn tail (every record has
  // zero bytes right before its type byte, which a zero-run skip must not
  // step over).
  TempDir dir;
  const std::string path = dir / "data.log";
  // Small records, and big ones that span the reader's 1 MiB buffer.
  const size_t big = GENERATE(size_t{0}, size_t{3} << 20);
  const int bad = GENERATE(0, 1, 2);
  INFO("big " << big << " bad record " << bad);
  const auto recs = WriteThree(path, 100 + big, 200 + big, 300 + big);
  XorByte(path, recs[bad].pos + 24 + recs[bad].value.size() / 2, 0x01);  // in the value
  auto log = Open(path);
  ReadResult r = ReadAll(*log);
  REQUIRE(r.status.ok());
  REQUIRE(r.reports.size() == 1);
  REQUIRE(r.reports[0].offset == recs[bad].pos);
  REQUIRE(r.reports[0].bytes == recs[bad].size);
  REQUIRE_THAT(r.reports[0].reason, Catch::Contains("checksum"));
  std::vector<Written> want = recs;
  want.erase(want.begin() + bad);
  CheckRecords(r.records, want);
  REQUIRE(r.valid_end == (bad == 2 ? recs[2].pos : log->end()));
}

TEST_CASE("LogReader reports a torn trailing record once", "[engine][log]") {
  TempDir dir;
  const std::string path = dir / "data.log";
  const auto recs = WriteThree(path);
  const uint64_t last = recs[2].pos;
  // Cut inside the header, the value and the key of the last record.
  const uint64_t keep = GENERATE(1, 12, 23, 24, 25, 200, 331);
  INFO("kept " << keep << " bytes of the last record");
  REQUIRE(truncate(path.c_str(), static_cast<off_t>(last + keep)) == 0);
  auto log = Open(path);
  ReadResult r = ReadAll(*log);
  REQUIRE(r.status.ok());
  CheckRecords(r.records, {recs[0], recs[1]});
  REQUIRE(r.reports.size() == 1);
  REQUIRE(r.reports[0].offset == last);
  REQUIRE(r.reports[0].bytes == keep);
  REQUIRE(r.valid_end == last);
}

TEST_CASE("LogReader ends quietly at a file cut on a record boundary", "[engine][log]") {
  TempDir dir;
  const std::string path = dir / "data.log";
  const auto recs = WriteThree(path);
  const int keep = GENERATE(0, 1, 2);
  REQUIRE(truncate(path.c_str(), static_cast<off_t>(recs[keep].pos)) == 0);
  auto log = Open(path);
  ReadResult r = ReadAll(*log);
  REQUIRE(r.reports.empty());
  CheckRecords(r.records, std::vector<Written>(recs.begin(), recs.begin() + keep));
  REQUIRE(r.valid_end == recs[keep].pos);
}

TEST_CASE("LogReader cuts a limit past the end of the file to the file",
          "[engine][log]") {
  // Regression: an empty file with a limit past its end reports nothing.
  TempDir dir;
  const std::string path = dir / "data.log";
  const auto recs = WriteThree(path);
  const int keep = GENERATE(0, 1, 3);
  INFO("records kept " << keep);
  const uint64_t size = keep == 3 ? FileSize(path) : recs[keep].pos;
  REQUIRE(truncate(path.c_str(), static_cast<off_t>(size)) == 0);
  auto log = Open(path);
  ReadResult r = ReadAll(*log, 0, size + 1000);
  REQUIRE(r.reports.empty());
  REQUIRE(r.records.size() == static_cast<size_t>(keep));
  REQUIRE(r.valid_end == size);
}

TEST_CASE("LogReader skips a record whose length field is wrong", "[engine][log]") {
  TempDir dir;
  const std::string path = dir / "data.log";
  const auto recs = WriteThree(path);
  // Shorter, longer, past the end of the file, and beyond any valid record.
  const uint32_t len = GENERATE(0u, 199u, 201u, 250u, 100000u, 0x7fffffffu, 0x80000001u);
  INFO("length field " << len);
  Put32At(path, recs[1].pos + 4, len);
  auto log = Open(path);
  ReadResult r = ReadAll(*log);
  REQUIRE(r.status.ok());
  CheckRecords(r.records, {recs[0], recs[2]});
  REQUIRE(r.reports.size() == 1);
  REQUIRE(r.reports[0].offset == recs[1].pos);
  REQUIRE(r.reports[0].bytes == recs[1].size);
  REQUIRE(r.valid_end == log->end());
}

TEST_CASE("LogReader skips garbage bytes around records",
          "[engine][log]") {
  TempDir dir;
  const std::string path = dir / "data.log";
  // Looks like a header (type 1, key length 8) but is not a record.
  std::string fake(40, '\0');
  fake[12] = 1;
  fake[13] = 8;
  fake[4] = 5;
  const std::vector<std::string> garbage = {std::string(37, '\xab'), fake, std::string(5, '\0'),
                                            std::string(3, 'z')};
  const std::vector<std::string> records = {Encode(1, "one"), Encode(2, Value(5000, 2)),
                                            Encode(3, "three")};
  std::string file;
  std::vector<uint64_t> garbage_at, record_at;
  for (size_t i = 0; i < garbage.size(); ++i) {
    garbage_at.push_back(file.size());
    file += garbage[i];
    if (i < records.size()) {
      record_at.push_back(file.size());
      file += records[i];
    }
  }
  WriteFile(path, file);
  auto log = Open(path);
  ReadResult r = ReadAll(*log);
  REQUIRE(r.status.ok());
  REQUIRE(r.records.size() == 3);
  for (size_t i = 0; i < 3; ++i) {
    REQUIRE(r.records[i].key == static_cast<int64_t>(i + 1));
    REQUIRE(r.records[i].pos == record_at[i]);
  }
  REQUIRE(r.records[1].value == Value(5000, 2));
  REQUIRE(r.reports.size() == 4);
  for (size_t i = 0; i < 4; ++i) {
    INFO("garbage " << i);
    REQUIRE(r.reports[i].offset == garbage_at[i]);
    REQUIRE(r.reports[i].bytes == garbage[i].size());
  }
  REQUIRE(r.valid_end == record_at[2] + records[2].size());
}

TEST_CASE("LogReader reports reserved zeros after the last record as one tail",
          "[engine][log]") {
  TempDir dir;
  const std::string path = dir / "data.log";
  const auto recs = WriteThree(path);
  const uint64_t end = recs[2].pos + recs[2].size;
  // As after a crash: the space reserved ahead is still zeros on disk.
  const uint64_t zeros = GENERATE(1, 24, 4096, 3 << 20);
  REQUIRE(truncate(path.c_str(), static_cast<off_t>(end + zeros)) == 0);
  auto log = Open(path);
  REQUIRE(log->end() == end + zeros);
  ReadResult r = ReadAll(*log);
  CheckRecords(r.records, recs);
  REQUIRE(r.reports.size() == 1);
  REQUIRE(r.reports[0].offset == end);
  REQUIRE(r.reports[0].bytes == zeros);
  REQUIRE(r.valid_end == end);

  // Truncate() drops the tail: the file ends at the last record again.
  REQUIRE(log->Truncate(r.valid_end).ok());
  REQUIRE(log->end() == end);
  REQUIRE(FileSize(path) == end);
  auto more = AppendAll(log.get(), {42});
  REQUIRE(more[0].pos == end);
  r = ReadAll(*log);
  REQUIRE(r.reports.empty());
  REQUIRE(r.records.size() == 4);
  REQUIRE(r.records[3].value == more[0].value);
}

TEST_CASE("LogReader reads from a start offset up to a limit", "[engine][log]") {
  TempDir dir;
  const std::string path = dir / "data.log";
  const auto recs = WriteThree(path);
  auto log = Open(path);
  ReadResult r = ReadAll(*log, recs[1].pos);
  REQUIRE(r.reports.empty());
  CheckRecords(r.records, {recs[1], recs[2]});

  r = ReadAll(*log, 0, recs[2].pos);  // the limit ends a record
  REQUIRE(r.reports.empty());
  CheckRecords(r.records, {recs[0], recs[1]});
  REQUIRE(r.valid_end == recs[2].pos);

  r = ReadAll(*log, 0, recs[2].pos + 50);  // the limit cuts a record
  CheckRecords(r.records, {recs[0], recs[1]});
  REQUIRE(r.reports.size() == 1);
  REQUIRE(r.reports[0].offset == recs[2].pos);
  REQUIRE(r.reports[0].bytes == 50);

  r = ReadAll(*log, log->end());
  REQUIRE(r.records.empty());
  REQUIRE(r.reports.empty());
  REQUIRE(r.valid_end == log->end());
}

// ---- Read mappings (LogFile::MappedRange) ----

namespace {

// Mappings of "path" in this process (lines of /proc/self/maps naming it).
int MappingsOf(const std::string& path) {
  std::string maps = ReadFile("/proc/self/maps");
  int n = 0;
  for (size_t at = maps.find(path); at != std::string::npos; at = maps.find(path, at + 1)) ++n;
  return n;
}

uint64_t RoundUpPage(uint64_t n) { return (n + LogFile::kMapPage - 1) / LogFile::kMapPage * LogFile::kMapPage; }

}  // namespace

TEST_CASE("LogFile::MappedRange gives a record's bytes in place when it lies within one page",
          "[engine][log][mmap]") {
  TempDir dir;
  auto log = Open(dir / "data.log");
  std::vector<size_t> sizes;
  for (int i = 0; i < 300; ++i) sizes.push_back(static_cast<size_t>(i * 37 % 700));
  const auto recs = AppendAll(log.get(), sizes);
  int mapped = 0, crossing = 0;
  for (const Written& w : recs) {
    INFO("record at " << w.pos << ", " << w.size << " bytes");
    const bool one_page = w.pos / LogFile::kMapPage == (w.pos + w.size - 1) / LogFile::kMapPage;
    const char* p = log->MappedRange(w.pos, w.size);
    if (!one_page) {
      REQUIRE(p == nullptr);  // two pages: the caller preads (one read, not two faults)
      ++crossing;
      continue;
    }
    REQUIRE(p != nullptr);
    ++mapped;
    RecordView view;
    REQUIRE(ParseRecord(p, w.size, &view) == ParseResult::kOk);
    REQUIRE(view.key == w.key);
    REQUIRE(std::string(view.value) == w.value);
  }
  CHECK(mapped > 200);
  CHECK(crossing > 0);
  CHECK(log->MappedRange(0, 0) == nullptr);
  // Never past the file's size on disk (reserved space included).
  CHECK(log->MappedRange(RoundUpPage(log->allocated()) + 8, 16) == nullptr);
  CHECK(log->read_mapped_bytes() <= RoundUpPage(log->allocated()));
  CHECK(log->read_mapped_bytes() <= RoundUpPage(FileSize(dir / "data.log")));
}

TEST_CASE("SpanReadPolicy maps two-page reads after a run of cached preads, stops at a slow one",
          "[engine][log][mmap]") {
  using flatkv::engine::SpanReadPolicy;
  constexpr uint64_t kFast = SpanReadPolicy::kDiskReadNs / 10;
  constexpr uint64_t kSlow = SpanReadPolicy::kDiskReadNs;  // a disk read's time
  SpanReadPolicy policy;
  CHECK_FALSE(policy.UseMapping());  // a file starts on pread: its pages may be on disk
  for (uint32_t i = 1; i < SpanReadPolicy::kCachedStreak; ++i) policy.NotePread(kFast);
  CHECK_FALSE(policy.UseMapping());
  policy.NotePread(kSlow);  // one read from the disk restarts the count
  for (uint32_t i = 1; i < SpanReadPolicy::kCachedStreak; ++i) policy.NotePread(kFast);
  CHECK_FALSE(policy.UseMapping());
  policy.NotePread(kFast);
  CHECK(policy.UseMapping());
  policy.NoteMapped(kFast);
  CHECK(policy.UseMapping());
  policy.NoteMapped(kSlow);  // a page faulted in from the disk: back to pread at once
  CHECK_FALSE(policy.UseMapping());
  for (uint32_t i = 1; i < SpanReadPolicy::kCachedStreak; ++i) policy.NotePread(kFast);
  CHECK_FALSE(policy.UseMapping());  // the count started over
}

TEST_CASE("LogFile::ReadForGet reads a record on two pages by pread, then in place once cached",
          "[engine][log][mmap]") {
  TempDir dir;
  auto log = Open(dir / "data.log");
  std::vector<size_t> sizes;
  for (int i = 0; i < 400; ++i) sizes.push_back(static_cast<size_t>(900 + i * 53 % 300));
  sizes.push_back(6000);  // on two pages or three
  sizes.push_back(9000);  // on three or more: always a pread
  const auto recs = AppendAll(log.get(), sizes);
  auto pages = [](const Written& w) {
    return (w.pos + w.size - 1) / LogFile::kMapPage - w.pos / LogFile::kMapPage + 1;
  };
  // Reads every record, checks its bytes and where they came from, and
  // counts the spans (records on two pages) read in place.
  std::string buf;
  auto read_all = [&]() {
    int spans_in_place = 0;
    for (const Written& w : recs) {
      INFO("record at " << w.pos << ", " << w.size << " bytes, " << pages(w) << " pages");
      const bool policy_maps = log->span_policy().UseMapping();
      const char* data = nullptr;
      size_t got = 0;
      REQUIRE(log->ReadForGet(w.pos, w.size, &buf, &data, &got).ok());
      REQUIRE(got == w.size);
      RecordView view;
      REQUIRE(ParseRecord(data, got, &view) == ParseResult::kOk);
      REQUIRE(view.key == w.key);
      REQUIRE(std::string(view.value) == w.value);
      const bool mapped = data != buf.data();
      if (pages(w) == 1) REQUIRE(mapped);
      if (pages(w) == 2) REQUIRE(mapped == policy_maps);
      if (pages(w) > 2) REQUIRE_FALSE(mapped);
      spans_in_place += mapped && pages(w) == 2;
    }
    return spans_in_place;
  };
  // The file was just written, so its preads are served from the page cache:
  // after kCachedStreak of them in a row, spans go through the mapping. A
  // read the machine delays past kDiskReadNs (a busy CI host) sends the file
  // back to pread for another streak, so this allows several passes.
  CHECK_FALSE(log->span_policy().UseMapping());
  int spans = 0;
  for (int pass = 0; pass < 50 && spans < 500; ++pass) spans += read_all();
  CHECK(spans >= 500);
}

TEST_CASE("LogFile read mappings grow with the file and earlier addresses stay valid",
          "[engine][log][mmap]") {
  TempDir dir;
  const std::string path = dir / "data.log";
  auto log = Open(path);
  const auto first = AppendAll(log.get(), {100, 200});
  const char* p0 = log->MappedRange(first[0].pos, first[0].size);
  REQUIRE(p0 != nullptr);
  const uint64_t mapped_before = log->read_mapped_bytes();
  // Grow the file by several reserve steps, through both write paths.
  std::vector<size_t> sizes;
  for (int i = 0; i < 3000; ++i) sizes.push_back(i % 500 == 0 ? 100000 : 300 + i % 50);
  const auto later = AppendAll(log.get(), sizes, 7);
  const Written& last = later.back();
  REQUIRE(log->MappedRange(last.pos, last.size) != nullptr);
  CHECK(log->read_mapped_bytes() > mapped_before);
  CHECK(log->read_mapped_bytes() <= RoundUpPage(FileSize(path)));
  // The first address is unchanged and still reads the first record.
  REQUIRE(log->MappedRange(first[0].pos, first[0].size) == p0);
  RecordView view;
  REQUIRE(ParseRecord(p0, first[0].size, &view) == ParseResult::kOk);
  REQUIRE(std::string(view.value) == first[0].value);
  // Every one-page record reads back through its mapping.
  for (const Written& w : later) {
    const char* p = log->MappedRange(w.pos, w.size);
    if (p == nullptr) continue;
    REQUIRE(ParseRecord(p, w.size, &view) == ParseResult::kOk);
    REQUIRE(std::string(view.value) == w.value);
  }
  // One chunk, grown in place: the kernel keeps it to one or two mappings.
  CHECK(MappingsOf(path) <= 3);
}

TEST_CASE("LogFile releases its read mappings on Close, Discard and Truncate",
          "[engine][log][mmap]") {
  TempDir dir;
  const std::string path = dir / "data.log";
  const std::string how = GENERATE(std::string("close"), std::string("discard"),
                                   std::string("truncate"));
  auto log = Open(path);
  const auto recs = AppendAll(log.get(), {100, 200, 300});
  REQUIRE(log->MappedRange(recs[2].pos, recs[2].size) != nullptr);
  REQUIRE(MappingsOf(path) >= 1);
  if (how == "close") REQUIRE(log->Close().ok());
  if (how == "discard") log->Discard();
  if (how == "truncate") {
    REQUIRE(log->Truncate(recs[1].pos + recs[1].size).ok());
    CHECK(log->MappedRange(recs[2].pos, recs[2].size) == nullptr);  // cut off
    CHECK(log->MappedRange(recs[0].pos, recs[0].size) != nullptr);  // mapped anew
    REQUIRE(log->Close().ok());
  }
  CHECK(log->read_mapped_bytes() == 0);
  CHECK(MappingsOf(path) == 0);
  CHECK(log->MappedRange(recs[0].pos, recs[0].size) == nullptr);  // closed: Read() reports it
}

TEST_CASE("LogFile read mappings of a reopened file cover its whole size and no more",
          "[engine][log][mmap]") {
  TempDir dir;
  const std::string path = dir / "data.log";
  const auto recs = WriteThree(path, 100, 5000, 30);  // closed: truncated to its end
  const uint64_t size = FileSize(path);
  REQUIRE(size % LogFile::kMapPage != 0);
  std::unique_ptr<LogFile> log;
  REQUIRE(LogFile::Open(path, false, &log).ok());
  const Written& tail = recs[2];  // in the file's last, partial page
  const char* p = log->MappedRange(tail.pos, tail.size);
  REQUIRE(p != nullptr);
  RecordView view;
  REQUIRE(ParseRecord(p, tail.size, &view) == ParseResult::kOk);
  CHECK(std::string(view.value) == tail.value);
  CHECK(log->read_mapped_bytes() == RoundUpPage(size));
  CHECK(log->MappedRange(size, 8) == nullptr);  // past the end: not mapped
}

TEST_CASE("LogReader::record gives each record's bytes exactly as they lie in the file",
          "[engine][log]") {
  TempDir dir;
  const auto recs = WriteThree(dir / "data.log", 100, 5000, 7);
  const std::string file = ReadFile(dir / "data.log");
  auto log = Open(dir / "data.log");
  LogReader reader(log.get(), 0, log->end(), [](uint64_t, uint64_t, const char*) {});
  REQUIRE(reader.record().empty());
  RecordView view;
  uint64_t pos;
  for (const Written& w : recs) {
    REQUIRE(reader.Next(&view, &pos));
    REQUIRE(pos == w.pos);
    REQUIRE(reader.record() == std::string_view(file).substr(w.pos, w.size));
  }
  REQUIRE_FALSE(reader.Next(&view, &pos));
}

TEST_CASE("LogFile::AppendEncoded appends whole records that read back like appended ones",
          "[engine][log]") {
  TempDir dir;
  auto log = Open(dir / "data.log");
  auto recs = AppendAll(log.get(), {10, 20});
  // Three records in one write (the largest past the mapped path's bound),
  // then ordinary appends after them, mapped and pwritev.
  std::string batch;
  std::vector<Written> copied;
  for (size_t size : {size_t{1000}, size_t{0}, LogFile::kDirectWriteBytes + 5}) {
    Written w{static_cast<int64_t>(100 + copied.size()), Value(size, 9), 0, RecordSize(size)};
    w.pos = log->end() + batch.size();
    batch += Encode(w.key, w.value);
    copied.push_back(w);
  }
  uint64_t start = 0;
  const uint64_t end_before = log->end();
  REQUIRE(log->AppendEncoded(batch, &start).ok());
  REQUIRE(start == end_before);
  REQUIRE(log->end() == end_before + batch.size());
  REQUIRE(log->allocated() >= log->end());
  recs.insert(recs.end(), copied.begin(), copied.end());
  for (const Written& w : AppendAll(log.get(), {30, LogFile::kDirectWriteBytes, 40}, 5)) {
    recs.push_back(w);
  }
  ReadsBackClean(*log, recs);
  REQUIRE(log->Close().ok());
  REQUIRE(FileSize(dir / "data.log") == recs.back().pos + recs.back().size);
  log = Open(dir / "data.log");
  CheckRecords(ReadAll(*log).records, recs);
}

namespace {

// Pages of the file at "path" in [from, to) that are in the page cache.
size_t ResidentPages(const std::string& path, uint64_t from, uint64_t to) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  void* p = mmap(nullptr, to, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  REQUIRE(p != MAP_FAILED);
  std::vector<unsigned char> vec((to + 4095) / 4096);
  REQUIRE(mincore(p, to, vec.data()) == 0);
  munmap(p, to);
  size_t resident = 0;
  for (uint64_t page = from / 4096; page < vec.size(); ++page) resident += vec[page] & 1;
  return resident;
}

}  // namespace

TEST_CASE("Small appends after large direct writes fault in only the pages they use",
          "[engine][log]") {
  // Tombstones written after 100 KiB values (deletes beside a compaction
  // that copies such values) used to fault their pages in through the
  // writable window with the kernel's mmap read-around, which zero-filled
  // up to read_ahead_kb of reserved space (8 MiB on this VM's disk) around
  // each fault: deletes ran at 25-40k/s instead of 400-700k/s. The pages
  // past what the appends populate (their own, and 256 KiB ahead once they
  // follow each other) must stay out of the page cache.
  TempDir dir;
  const std::string path = dir / "data.log";
  auto log = Open(path);
  // 64 values of 100 KiB (pwritev) make a file of 6.4 MB, reserved ahead
  // by an eighth of it: room that read-around would fill.
  AppendAll(log.get(), std::vector<size_t>(64, 100u << 10));
  for (int round = 0; round < 3; ++round) {
    // 300 records of 32 bytes: they cross into two fresh pages.
    AppendAll(log.get(), std::vector<size_t>(300, 0), round);
    const uint64_t populated = (log->end() + 4095) / 4096 * 4096 + (256u << 10);
    REQUIRE(log->allocated() >= populated + (64u << 10));  // room left to fault in
    INFO("round " << round << ": end " << log->end() << ", file reserved to "
                  << log->allocated());
    CHECK(ResidentPages(path, populated, log->allocated()) == 0);
    AppendAll(log.get(), {100u << 10}, round);  // the end jumps again
  }
  REQUIRE(log->Close().ok());
}

namespace {

// cachestat(2) (Linux 6.5): Debian 12's headers predate it.
struct CacheStatRange {
  uint64_t off, len;
};
struct CacheStat {
  uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted;
};
constexpr long kSysCachestat = 451;  // x86_64 and aarch64 alike

// Dirty pages of the file at "path" in [from, to), once the writeback
// already started there has finished; -1 if the kernel lacks cachestat.
int64_t DirtyPagesAfterWriteback(const std::string& path, uint64_t from, uint64_t to) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  REQUIRE(sync_file_range(fd, static_cast<off_t>(from), static_cast<off_t>(to - from),
                          SYNC_FILE_RANGE_WAIT_BEFORE) == 0);
  CacheStatRange range{from, to - from};
  CacheStat cs{};
  const long rc = syscall(kSysCachestat, fd, &range, &cs, 0);
  ::close(fd);
  if (rc != 0) return -1;
  return static_cast<int64_t>(cs.nr_dirty);
}

// Whether a line of /proc/self/maps or smaps maps the file at "path".
bool NamesFile(const std::string& line, const std::string& path) {
  return line.size() >= path.size() &&
         line.compare(line.size() - path.size(), path.size(), path) == 0;
}

// KiB of the file at "path" that this process has mapped (Rss in smaps).
uint64_t MappedKiB(const std::string& path) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool ours = false;
  uint64_t kib = 0;
  while (std::getline(smaps, line)) {
    if (!line.empty() && std::isxdigit(static_cast<unsigned char>(line[0])) &&
        line.find('-') != std::string::npos && line.find(':') > line.find(' ')) {
      ours = NamesFile(line, path);
    } else if (ours && line.rfind("Rss:", 0) == 0) {
      kib += std::stoull(line.substr(4));
    }
  }
  return kib;
}

}  // namespace

TEST_CASE("StartWriteback leaves the pages the write window holds writable", "[engine][log]") {
  // Writing back a page mapped writable write-protects it, a TLB shootdown
  // to the other CPUs each, and the appender then faults it writable again:
  // 9 % of a compaction's time under 4 KiB overwrites. The hint writes back
  // what lies behind the window's released pages and leaves the rest (at
  // most kReleaseBytes behind the end, and the pages populated ahead) to
  // Sync().
  TempDir dir;
  const std::string path = dir / "data.log";
  auto log = Open(path);
  AppendAll(log.get(), std::vector<size_t>(2000, 1000));  // about 2 MB through the window
  const uint64_t end = log->end();
  log->StartWriteback();
  const int64_t behind = DirtyPagesAfterWriteback(path, 0, end - (600u << 10));
  if (behind < 0) {
    WARN("this kernel has no cachestat(2) (Linux 6.5) to count dirty pages: not checked");
    return;
  }
  CHECK(behind == 0);  // the bulk is written back
  // Pages around the end are still dirty: the window maps them writable.
  // (Before, the hint wrote back every whole page below the end.)
  const uint64_t last_page = end / 4096 * 4096;
  CHECK(DirtyPagesAfterWriteback(path, last_page - (64u << 10), last_page) > 0);
  REQUIRE(log->Sync().ok());
  CHECK(DirtyPagesAfterWriteback(path, 0, log->allocated()) == 0);
  REQUIRE(log->Close().ok());
}

TEST_CASE("ReleaseWindow unmaps the window's pages and appends go on after it", "[engine][log]") {
  // A compaction releases the window of every new data file right before
  // the sync that makes it durable, so that sync write-protects nothing.
  TempDir dir;
  const std::string path = dir / "data.log";
  auto log = Open(path);
  auto recs = AppendAll(log.get(), std::vector<size_t>(700, 1000));
  REQUIRE(MappedKiB(path) > 0);  // the pages behind the end and ahead of it
  log->ReleaseWindow();
  CHECK(MappedKiB(path) == 0);
  log->StartWriteback();  // nothing is mapped now: all whole pages below the end
  const uint64_t last_page = log->end() / 4096 * 4096;
  const int64_t dirty = DirtyPagesAfterWriteback(path, 0, last_page);
  if (dirty >= 0) {
    CHECK(dirty == 0);
  } else {
    WARN("this kernel has no cachestat(2) (Linux 6.5) to count dirty pages: not checked");
  }
  // Appends after it, through the window (re-faulted) and direct, read
  // back, also after a second release in the middle of a page.
  for (const Written& w : AppendAll(log.get(), {10, 3000, LogFile::kDirectWriteBytes, 20}, 3)) {
    recs.push_back(w);
  }
  log->ReleaseWindow();
  log->ReleaseWindow();  // twice: nothing left to drop
  for (const Written& w : AppendAll(log.get(), std::vector<size_t>(300, 900), 4)) {
    recs.push_back(w);
  }
  ReadsBackClean(*log, recs);
  REQUIRE(log->Close().ok());
  log = Open(path);
  CheckRecords(ReadAll(*log).records, recs);
}

TEST_CASE("After ReleaseWindow appends fault in only their own pages until ResumeLookahead",
          "[engine][log]") {
  // While a compaction syncs the new generation, writers keep appending to
  // it; pages populated ahead of them would be dirty and mapped writable,
  // so that sync would write back zeros and write-protect each page (a TLB
  // shootdown to the writer's CPU). Only the pages the appends write are
  // mapped until the sync is over; then the lookahead comes back.
  TempDir dir;
  const std::string path = dir / "data.log";
  auto log = Open(path);
  // 2.5 MB first, so the file reserves about 300 KiB at a time (an eighth
  // of what it holds) and there is room for the lookahead.
  auto recs = AppendAll(log.get(), std::vector<size_t>(2500, 1000));
  log->ReleaseWindow();
  REQUIRE(MappedKiB(path) == 0);
  for (const Written& w : AppendAll(log.get(), std::vector<size_t>(20, 100), 2)) {
    recs.push_back(w);  // about 2.5 KB: one page, or two across an edge
  }
  CHECK(MappedKiB(path) <= 8);
  log->ResumeLookahead();
  for (const Written& w : AppendAll(log.get(), std::vector<size_t>(20, 100), 3)) {
    recs.push_back(w);
  }
  // Populated ahead again, as far as the reserved space reaches.
  const uint64_t ahead_kib = std::min<uint64_t>(256, (log->allocated() - log->end()) / 1024);
  REQUIRE(ahead_kib >= 32);  // enough to tell a lookahead from the pages written
  CHECK(MappedKiB(path) + 4 >= ahead_kib);
  ReadsBackClean(*log, recs);
  REQUIRE(log->Close().ok());
  log = Open(path);
  CheckRecords(ReadAll(*log).records, recs);
}

namespace {

// Start addresses of this process's writable mappings of the file at "path".
std::vector<std::string> WritableMappings(const std::string& path) {
  std::ifstream maps("/proc/self/maps");
  std::vector<std::string> out;
  std::string line;
  while (std::getline(maps, line)) {
    std::istringstream in(line);
    std::string range, perms;
    in >> range >> perms;
    if (perms.size() >= 2 && perms[1] == 'w' && NamesFile(line, path)) {
      out.push_back(range.substr(0, range.find('-')));
    }
  }
  return out;
}

}  // namespace

TEST_CASE("A growing file keeps its write window while it reserves space step by step",
          "[engine][log]") {
  // A young file reserves an eighth of what it holds at a time; the window
  // used to map only what was reserved, so a data file growing to 2 MB was
  // unmapped and mapped again about 50 times, each munmap a TLB shootdown
  // to the other CPU. It maps a span past the file's end now (touching
  // nothing there), and moves only once the end leaves that span.
  TempDir dir;
  const std::string path = dir / "data.log";
  auto log = Open(path);
  auto recs = AppendAll(log.get(), std::vector<size_t>(10, 100));
  const std::vector<std::string> first = WritableMappings(path);
  REQUIRE(first.size() == 1);
  const uint64_t reserved = log->allocated();
  for (const Written& w : AppendAll(log.get(), std::vector<size_t>(4000, 1000), 1)) {
    recs.push_back(w);  // 4 MB: the reservation grows in many steps
  }
  REQUIRE(log->allocated() > 8 * reserved);
  CHECK(WritableMappings(path) == first);
  // Past the span (64 MiB) the window moves; the records on both sides of
  // the move read back, before and after a reopen.
  for (const Written& w : AppendAll(log.get(), std::vector<size_t>(23000, 3000), 2)) {
    recs.push_back(w);
  }
  CHECK(WritableMappings(path).size() == 1);
  CHECK(WritableMappings(path) != first);
  ReadsBackBeforeAndAfterReopen(path, &log, recs);
}

TEST_CASE("LogReader::PeekKeys names the keys of the buffered records after the current one",
          "[engine][log]") {
  // A compaction prefetches the index slots of these keys while it checks
  // the current record; a wrong key would only cost a useless prefetch,
  // but a walk past the buffer or a crash on a strange header would not.
  TempDir dir;
  auto log = Open(dir / "data.log");
  const auto recs = AppendAll(log.get(), {10, 0, 300, 5, 70, 1, 2});  // keys 1..7
  LogReader reader(log.get(), 0, log->end(), [](uint64_t, uint64_t, const char*) {});
  RecordView view;
  uint64_t pos;
  auto peek = [&](size_t n) {
    std::vector<int64_t> keys;
    reader.PeekKeys(n, [&](int64_t k) { keys.push_back(k); });
    return keys;
  };
  REQUIRE(reader.Next(&view, &pos));
  REQUIRE(view.key == 1);
  CHECK(peek(3) == std::vector<int64_t>{2, 3, 4});
  CHECK(peek(100) == std::vector<int64_t>{2, 3, 4, 5, 6, 7});
  CHECK(peek(0).empty());
  while (reader.Next(&view, &pos) && view.key != 7) {
  }
  REQUIRE(view.key == 7);
  CHECK(peek(4).empty());  // nothing after the last record
  REQUIRE(log->Close().ok());
}
