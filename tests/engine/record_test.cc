// Tests of engine/crc32c.h and engine/record.{h,cc}: the checksum against
// published CRC32C vectors, and the log record and append part-list codecs,
// including every way ParseRecord must refuse a damaged record.
#include <catch2/catch.hpp>

#include <cstring>
#include <string>
#include <vector>

#include "engine/crc32c.h"
#include "engine/record.h"

namespace crc32c = flatkv::engine::crc32c;
using flatkv::engine::AppendPart;
using flatkv::engine::DecodeAppendParts;
using flatkv::engine::EncodeAppendParts;
using flatkv::engine::EncodeRecord;
using flatkv::engine::EncodeRecordHeader;
using flatkv::engine::kMaxAppendParts;
using flatkv::engine::kMaxRecordValue;
using flatkv::engine::kRecordHeaderSize;
using flatkv::engine::kRecordKeySize;
using flatkv::engine::ParseRecord;
using flatkv::engine::ParseRecordSplit;
using flatkv::engine::ParseResult;
using flatkv::engine::RecordSize;
using flatkv::engine::RecordType;
using flatkv::engine::RecordView;

namespace {

// Bit-at-a-time CRC32C, written from the definition, to check the fast paths.
uint32_t ReferenceCrc(const std::string& s) {
  uint32_t crc = ~0u;
  for (unsigned char c : s) {
    crc ^= c;
    for (int k = 0; k < 8; ++k) crc = (crc & 1) ? (crc >> 1) ^ 0x82f63b78u : crc >> 1;
  }
  return ~crc;
}

std::string Pattern(size_t n, uint32_t seed) {
  std::string s(n, '\0');
  uint32_t x = seed * 2654435761u + 1;
  for (auto& c : s) {
    x = x * 1103515245u + 12345u;
    c = static_cast<char>(x >> 24);
  }
  return s;
}

std::string Encode(RecordType type, int64_t key, uint64_t ts, std::string_view value,
                   std::string_view prefix = {}) {
  std::string rec(RecordSize(prefix.size() + value.size()), '\0');
  EncodeRecord(rec.data(), type, key, ts, prefix, value);
  return rec;
}

uint32_t Get32(const std::string& s, size_t off) {
  uint32_t v;
  std::memcpy(&v, s.data() + off, 4);
  return v;
}

void Put32(std::string* s, size_t off, uint32_t v) { std::memcpy(s->data() + off, &v, 4); }

// Recomputes the masked checksum after a test edits a header on purpose.
void Reseal(std::string* rec) {
  const size_t body = kRecordHeaderSize + Get32(*rec, 4) + kRecordKeySize;
  Put32(rec, 0, crc32c::Mask(crc32c::Value(rec->data() + 4, body - 4)));
}

ParseResult Parse(const std::string& rec, RecordView* view, std::string* why = nullptr) {
  const char* reason = nullptr;
  ParseResult r = ParseRecord(rec.data(), rec.size(), view, &reason);
  if (why != nullptr) *why = reason != nullptr ? reason : "";
  return r;
}

}  // namespace

TEST_CASE("crc32c::Value matches the published CRC32C test vectors", "[engine][crc32c]") {
  REQUIRE(crc32c::Value("123456789", 9) == 0xE3069283u);
  REQUIRE(crc32c::Value("", 0) == 0u);
  // RFC 3720 (iSCSI) B.4.
  std::string buf(32, '\0');
  REQUIRE(crc32c::Value(buf.data(), buf.size()) == 0x8A9136AAu);
  buf.assign(32, '\xff');
  REQUIRE(crc32c::Value(buf.data(), buf.size()) == 0x62A8AB43u);
  for (int i = 0; i < 32; ++i) buf[i] = static_cast<char>(i);
  REQUIRE(crc32c::Value(buf.data(), buf.size()) == 0x46DD794Eu);
  for (int i = 0; i < 32; ++i) buf[i] = static_cast<char>(31 - i);
  REQUIRE(crc32c::Value(buf.data(), buf.size()) == 0x113FDB5Cu);
}

TEST_CASE("crc32c::Value agrees with a bitwise CRC for every length and alignment",
          "[engine][crc32c]") {
  const std::string data = Pattern(300, 7);
  for (size_t start = 0; start < 8; ++start) {
    for (size_t n = 0; start + n <= data.size(); ++n) {
      const std::string piece = data.substr(start, n);
      INFO("start " << start << " length " << n);
      REQUIRE(crc32c::Value(data.data() + start, n) == ReferenceCrc(piece));
    }
  }
}

TEST_CASE("crc32c::Value agrees with a bitwise CRC around every three-stream block size",
          "[engine][crc32c]") {
  // The hardware path runs three streams over blocks of 3 x 4096, 3 x 256
  // and 3 x 64 bytes, then single words and bytes: lengths on, before and
  // after each block boundary, and record sizes of 1 KiB and 4 KiB values.
  const std::string data = Pattern(3 * 4096 * 2 + 3 * 256 + 3 * 64 + 100, 11);
  for (size_t n : {size_t{191}, size_t{192}, size_t{193}, size_t{199}, size_t{767}, size_t{768},
                   size_t{769}, size_t{959}, size_t{960}, size_t{1052}, size_t{4124},
                   size_t{12287}, size_t{12288}, size_t{12289}, size_t{12288 + 768 + 192 + 7},
                   size_t{2 * 12288 + 768 + 192 + 9}}) {
    for (size_t start = 0; start < 8; ++start) {
      INFO("start " << start << " length " << n);
      REQUIRE(start + n <= data.size());
      REQUIRE(crc32c::Value(data.data() + start, n) == ReferenceCrc(data.substr(start, n)));
    }
  }
}

TEST_CASE("crc32c::Extend continues a CRC across split buffers", "[engine][crc32c]") {
  const std::string data = Pattern(1000, 3);
  const uint32_t whole = crc32c::Value(data.data(), data.size());
  for (size_t cut : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{500}, size_t{999},
                     size_t{1000}}) {
    const uint32_t head = crc32c::Value(data.data(), cut);
    REQUIRE(crc32c::Extend(head, data.data() + cut, data.size() - cut) == whole);
  }
  REQUIRE(crc32c::Value("hello world", 11) != crc32c::Value("hello worle", 11));
}

TEST_CASE("crc32c::Extend agrees with a bitwise CRC on large buffers, whole and in pieces",
          "[engine][crc32c]") {
  // From 256 bytes on the work goes to ISA-L (engine/crc32c.h), which
  // continues from the CRC of what came before: pieces on both sides of
  // that threshold, a 100 KiB value's record and more than a MiB.
  const std::string data = Pattern((1u << 20) + 4099, 5);
  const uint32_t whole = ReferenceCrc(data);
  REQUIRE(crc32c::Value(data.data(), data.size()) == whole);
  REQUIRE(crc32c::Value(data.data() + 1, 102432) == ReferenceCrc(data.substr(1, 102432)));
  for (size_t cut : {size_t{255}, size_t{256}, size_t{257}, size_t{102432}, data.size() - 256,
                     data.size() - 255}) {
    INFO("cut " << cut);
    const uint32_t head = crc32c::Value(data.data(), cut);
    REQUIRE(head == ReferenceCrc(data.substr(0, cut)));
    REQUIRE(crc32c::Extend(head, data.data() + cut, data.size() - cut) == whole);
  }
}

TEST_CASE("crc32c::Mask changes the CRC and Unmask restores it", "[engine][crc32c]") {
  for (uint32_t crc : {0u, 1u, 0xE3069283u, 0x80000000u, 0xffffffffu, crc32c::kMaskDelta}) {
    INFO("crc " << crc);
    REQUIRE(crc32c::Mask(crc) != crc);
    REQUIRE(crc32c::Mask(crc32c::Mask(crc)) != crc32c::Mask(crc));
    REQUIRE(crc32c::Unmask(crc32c::Mask(crc)) == crc);
    REQUIRE(crc32c::Unmask(crc32c::Unmask(crc32c::Mask(crc32c::Mask(crc)))) == crc);
  }
}

TEST_CASE("EncodeRecord writes the documented version 1 layout", "[engine][record]") {
  const std::string value = "some value";
  const std::string rec = Encode(RecordType::kValue, -42, 0x0102030405060708ull, value);
  REQUIRE(rec.size() == kRecordHeaderSize + value.size() + kRecordKeySize);
  REQUIRE(Get32(rec, 4) == value.size());
  REQUIRE(Get32(rec, 8) == 0u);  // no padding
  REQUIRE(rec[12] == static_cast<char>(RecordType::kValue));
  REQUIRE(rec[13] == static_cast<char>(kRecordKeySize));
  REQUIRE(rec[14] == 0);
  REQUIRE(rec[15] == 0);
  uint64_t ts, key;
  std::memcpy(&ts, rec.data() + 16, 8);
  std::memcpy(&key, rec.data() + kRecordHeaderSize + value.size(), 8);
  REQUIRE(ts == 0x0102030405060708ull);
  REQUIRE(static_cast<int64_t>(key) == -42);
  REQUIRE(rec.substr(kRecordHeaderSize, value.size()) == value);
  REQUIRE(crc32c::Unmask(Get32(rec, 0)) == crc32c::Value(rec.data() + 4, rec.size() - 4));
}

TEST_CASE("EncodeRecord and ParseRecord round-trip every record type and size",
          "[engine][record]") {
  const auto type = GENERATE(RecordType::kValue, RecordType::kTombstone, RecordType::kAppend);
  const size_t gen_size = GENERATE(0, 1, 100, 70000);
  const size_t size = type == RecordType::kTombstone ? 0 : gen_size;  // tombstones are empty
  const int64_t key = GENERATE(int64_t{0}, int64_t{-1}, int64_t{1} << 40, INT64_MIN, INT64_MAX);
  INFO("type " << static_cast<int>(type) << " size " << size << " key " << key);
  const std::string value = Pattern(size, static_cast<uint32_t>(size));
  const std::string rec = Encode(type, key, 123456789, value);
  REQUIRE(rec.size() == RecordSize(size));
  RecordView view;
  REQUIRE(Parse(rec, &view) == ParseResult::kOk);
  REQUIRE(view.type == type);
  REQUIRE(view.key == key);
  REQUIRE(view.timestamp == 123456789u);
  REQUIRE(view.size == rec.size());
  REQUIRE(view.value == value);
  REQUIRE(view.value.data() == rec.data() + kRecordHeaderSize);  // no copy
  // Trailing bytes (the next record) are not part of this one.
  const std::string two = rec + Encode(RecordType::kValue, 5, 6, "next");
  REQUIRE(Parse(two, &view) == ParseResult::kOk);
  REQUIRE(view.size == rec.size());
  REQUIRE(view.value == value);
}

TEST_CASE("EncodeRecord stores the prefix followed by the value", "[engine][record]") {
  const std::string rec = Encode(RecordType::kAppend, 9, 1, "tail", "head-");
  RecordView view;
  REQUIRE(Parse(rec, &view) == ParseResult::kOk);
  REQUIRE(view.value == "head-tail");
  REQUIRE(rec == Encode(RecordType::kAppend, 9, 1, "head-tail"));
}

TEST_CASE("EncodeRecordHeader plus value and key bytes equals EncodeRecord's bytes",
          "[engine][record]") {
  const size_t size = GENERATE(0, 1, 100, 70000);
  const std::string prefix = GENERATE(std::string(), std::string("\x02pfx", 4));
  const std::string value = Pattern(size, 11);
  const int64_t key = -987654321;
  char hdr[kRecordHeaderSize];
  EncodeRecordHeader(hdr, RecordType::kAppend, key, 77, prefix, value);
  std::string assembled(hdr, sizeof(hdr));
  assembled += prefix;
  assembled += value;
  const auto ukey = static_cast<uint64_t>(key);
  assembled.append(reinterpret_cast<const char*>(&ukey), sizeof(ukey));
  REQUIRE(assembled == Encode(RecordType::kAppend, key, 77, value, prefix));
}

TEST_CASE("ParseRecord returns kIncomplete with the needed size for a truncated record",
          "[engine][record]") {
  const std::string rec = Encode(RecordType::kValue, 3, 4, Pattern(100, 1));
  for (size_t n = 0; n < rec.size(); ++n) {
    INFO("first " << n << " bytes");
    RecordView view;
    REQUIRE(ParseRecord(rec.data(), n, &view) == ParseResult::kIncomplete);
    REQUIRE(view.size == (n < kRecordHeaderSize ? kRecordHeaderSize : rec.size()));
  }
}

TEST_CASE("ParseRecord rejects a record whose checksum does not match", "[engine][record]") {
  const std::string good = Encode(RecordType::kValue, 12345, 99, Pattern(100, 2));
  // Every byte the checksum covers, and the checksum itself.
  for (size_t i = 0; i < good.size(); ++i) {
    if (i >= 4 && i < 16) continue;  // sizes, type and key length have own checks
    std::string bad = good;
    bad[i] = static_cast<char>(bad[i] ^ 0x20);
    INFO("flipped byte " << i);
    RecordView view;
    std::string why;
    REQUIRE(Parse(bad, &view, &why) == ParseResult::kBad);
    REQUIRE_THAT(why, Catch::Contains("checksum"));
  }
}

TEST_CASE("ParseRecord rejects a bad type or key length or reserved byte or length",
          "[engine][record]") {
  const std::string good = Encode(RecordType::kValue, 1, 2, "value");
  auto expect_bad = [](std::string rec, const char* what) {
    Reseal(&rec);  // a valid checksum must not rescue a bad header
    RecordView view;
    std::string why;
    REQUIRE(Parse(rec, &view, &why) == ParseResult::kBad);
    REQUIRE_THAT(why, Catch::Contains(what));
  };
  for (char type : {'\0', '\x04', '\x7f', '\xff'}) {
    std::string rec = good;
    rec[12] = type;
    expect_bad(rec, "type");
  }
  for (char klen : {'\0', '\x04', '\x07', '\x09', '\xff'}) {
    std::string rec = good;
    rec[13] = klen;
    expect_bad(rec, "key length");
  }
  for (size_t i : {size_t{14}, size_t{15}}) {
    std::string rec = good;
    rec[i] = 1;
    expect_bad(rec, "reserved");
  }
  for (uint32_t n : {kMaxRecordValue + 1, 0xffffffffu}) {
    std::string rec = good;
    Put32(&rec, 4, n);  // value length
    RecordView view;
    std::string why;
    REQUIRE(Parse(rec, &view, &why) == ParseResult::kBad);
    REQUIRE_THAT(why, Catch::Contains("length"));
    rec = good;
    Put32(&rec, 8, n);  // padding length
    REQUIRE(Parse(rec, &view, &why) == ParseResult::kBad);
  }
  std::string tomb = Encode(RecordType::kTombstone, 1, 2, "x");
  expect_bad(tomb, "tombstone");
}

TEST_CASE("ParseRecord rejects a length field that does not match the record",
          "[engine][record]") {
  const std::string good = Encode(RecordType::kValue, 1, 2, Pattern(100, 5)) +
                           Encode(RecordType::kValue, 3, 4, Pattern(50, 6));
  for (uint32_t n : {0u, 99u, 101u, 120u}) {
    std::string bad = good;
    Put32(&bad, 4, n);
    RecordView view;
    INFO("value length " << n);
    REQUIRE(Parse(bad, &view) == ParseResult::kBad);
  }
  // A length that runs past the buffer asks for more bytes instead.
  std::string bad = good;
  Put32(&bad, 4, 1u << 20);
  RecordView view;
  REQUIRE(Parse(bad, &view) == ParseResult::kIncomplete);
  REQUIRE(view.size == RecordSize(1u << 20));
}

TEST_CASE("ParseRecord counts padding in the size and asks for all of it",
          "[engine][record]") {
  // Version 1 readers must accept reserved_sz bytes of padding after the key
  // (record.h). The padding is part of the record (view->size includes it),
  // so a buffer that stops inside it holds "fewer than view->size bytes",
  // which record.h defines as kIncomplete.
  std::string rec = Encode(RecordType::kValue, 8, 9, "padded");
  Put32(&rec, 8, 16);
  Reseal(&rec);
  const size_t body = rec.size();
  rec.append(16, '\0');
  RecordView view;
  REQUIRE(Parse(rec, &view) == ParseResult::kOk);
  REQUIRE(view.size == body + 16);
  REQUIRE(view.value == "padded");
  REQUIRE(ParseRecord(rec.data(), body + 8, &view) == ParseResult::kIncomplete);
  REQUIRE(view.size == body + 16);
}

TEST_CASE("EncodeAppendParts and DecodeAppendParts round-trip a part list",
          "[engine][record]") {
  const size_t n = GENERATE(1, 2, 31, 64);
  std::vector<AppendPart> parts;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t payload = static_cast<uint32_t>(i * 1000 + 1);
    parts.push_back({(uint64_t{1} << 40) + i * 4096, static_cast<uint32_t>(RecordSize(payload) + i),
                     payload});
  }
  for (const std::string& tail : {std::string(), std::string("appended bytes")}) {
    const std::string encoded = EncodeAppendParts(parts) + tail;
    REQUIRE(encoded.size() == 1 + n * 16 + tail.size());
    std::vector<AppendPart> got = {{1, 2, 3}};  // replaced, not appended to
    std::string_view payload = "untouched";
    REQUIRE(DecodeAppendParts(encoded, &got, &payload));
    REQUIRE(payload == tail);
    REQUIRE(got.size() == n);
    for (size_t i = 0; i < n; ++i) {
      REQUIRE(got[i].record_pos == parts[i].record_pos);
      REQUIRE(got[i].record_size == parts[i].record_size);
      REQUIRE(got[i].payload_size == parts[i].payload_size);
    }
  }
}

TEST_CASE("DecodeAppendParts rejects a part list that is empty or too long or short or inconsistent",
          "[engine][record]") {
  std::vector<AppendPart> parts;
  std::string_view payload;
  REQUIRE_FALSE(DecodeAppendParts("", &parts, &payload));
  REQUIRE_FALSE(DecodeAppendParts(std::string(1, '\0'), &parts, &payload));  // n = 0
  REQUIRE_FALSE(DecodeAppendParts(std::string("\0bytes", 6), &parts, &payload));

  const AppendPart part{0, static_cast<uint32_t>(RecordSize(10)), 10};
  std::string over = EncodeAppendParts(std::vector<AppendPart>(kMaxAppendParts + 1, part));
  REQUIRE(static_cast<uint8_t>(over[0]) == kMaxAppendParts + 1);
  REQUIRE_FALSE(DecodeAppendParts(over, &parts, &payload));
  over[0] = static_cast<char>(0xff);
  over.resize(1 + 255 * 16, '\0');
  REQUIRE_FALSE(DecodeAppendParts(over, &parts, &payload));

  const std::string three = EncodeAppendParts(std::vector<AppendPart>(3, part));
  REQUIRE(DecodeAppendParts(three, &parts, &payload));
  for (size_t cut = 1; cut < three.size(); ++cut) {
    INFO("first " << cut << " bytes");
    REQUIRE_FALSE(DecodeAppendParts(std::string_view(three).substr(0, cut), &parts, &payload));
  }
  // A part whose record cannot hold its payload.
  const AppendPart bad{0, static_cast<uint32_t>(RecordSize(10) - 1), 10};
  REQUIRE_FALSE(DecodeAppendParts(EncodeAppendParts({part, bad}), &parts, &payload));
}

TEST_CASE("ParseRecordSplit reads a record held as header and rest like ParseRecord",
          "[engine][record]") {
  // A large get reads the header into its own buffer and the value, key
  // and padding into the caller's string (FlatTable::ReadLargeValue).
  const std::string value = Pattern(70000, 9);
  const std::string rec = Encode(RecordType::kValue, 77, 1234, value);
  std::string rest = rec.substr(kRecordHeaderSize);
  RecordView whole, split;
  const char* why = nullptr;
  REQUIRE(Parse(rec, &whole) == ParseResult::kOk);
  REQUIRE(ParseRecordSplit(rec.data(), rest.data(), rest.size(), &split, &why) ==
          ParseResult::kOk);
  REQUIRE(split.key == 77);
  REQUIRE(split.timestamp == 1234);
  REQUIRE(split.size == whole.size);
  REQUIRE(split.value == value);
  REQUIRE(split.value.data() == rest.data());
  // Extra bytes after the record (a size hint rounds up) are not its.
  rest += "trailing bytes";
  REQUIRE(ParseRecordSplit(rec.data(), rest.data(), rest.size(), &split) == ParseResult::kOk);
  REQUIRE(split.value == value);
  SECTION("a flipped byte in the value, the key or the header fails its checksum") {
    for (size_t at : {size_t{0}, size_t{69999}, size_t{70003}}) {
      std::string bad = rest;
      bad[at] ^= 0x10;
      INFO("byte " << at << " after the header");
      REQUIRE(ParseRecordSplit(rec.data(), bad.data(), bad.size(), &split, &why) ==
              ParseResult::kBad);
      REQUIRE(std::string(why) == "checksum mismatch");
    }
    std::string header = rec.substr(0, kRecordHeaderSize);
    header[20] ^= 0x01;  // the timestamp
    REQUIRE(ParseRecordSplit(header.data(), rest.data(), rest.size(), &split) ==
            ParseResult::kBad);
  }
  SECTION("a short rest is incomplete and says how much the record needs") {
    REQUIRE(ParseRecordSplit(rec.data(), rest.data(), 1000, &split) == ParseResult::kIncomplete);
    REQUIRE(split.size == rec.size());
  }
}
