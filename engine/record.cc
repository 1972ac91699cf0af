#include "engine/record.h"

#include <chrono>
#include <cstring>

#include "engine/crc32c.h"

namespace flatkv::engine {
namespace {

inline void Put32(char* p, uint32_t v) { std::memcpy(p, &v, 4); }
inline void Put64(char* p, uint64_t v) { std::memcpy(p, &v, 8); }
inline uint32_t Get32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline uint64_t Get64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

void FillHeader(char* hdr, RecordType type, uint64_t timestamp, size_t value_size) {
  Put32(hdr + 4, static_cast<uint32_t>(value_size));
  Put32(hdr + 8, 0);  // reserved_sz: no padding
  hdr[12] = static_cast<char>(type);
  hdr[13] = static_cast<char>(kRecordKeySize);
  hdr[14] = 0;
  hdr[15] = 0;
  Put64(hdr + 16, timestamp);
}

uint32_t RecordCrc(const char* hdr, std::string_view prefix, std::string_view value,
                   const char* key) {
  uint32_t crc = crc32c::Value(hdr + 4, kRecordHeaderSize - 4);
  crc = crc32c::Extend(crc, prefix.data(), prefix.size());
  crc = crc32c::Extend(crc, value.data(), value.size());
  crc = crc32c::Extend(crc, key, kRecordKeySize);
  return crc32c::Mask(crc);
}

}  // namespace

namespace {

// The checks of a header that need no other byte: the reason it is not a
// record's, or nullptr.
const char* BadHeader(const char* p) {
  const uint32_t value_size = Get32(p + 4);
  const uint32_t reserved = Get32(p + 8);
  const auto type = static_cast<uint8_t>(p[12]);
  const auto klen = static_cast<uint8_t>(p[13]);
  if (type < 1 || type > 3) return "bad record type";
  if (klen != kRecordKeySize) return "bad key length";
  if (p[14] != 0 || p[15] != 0) return "nonzero reserved header bytes";
  if (value_size > kMaxRecordValue || reserved > kMaxRecordValue) return "bad value length";
  if (type == static_cast<uint8_t>(RecordType::kTombstone) && value_size != 0) {
    return "tombstone with a value";
  }
  return nullptr;
}

// Parses a record whose header is at hdr and whose value, key and padding
// follow at rest[0, n) (rest == hdr + kRecordHeaderSize when contiguous).
ParseResult ParseParts(const char* hdr, const char* rest, size_t n, RecordView* view,
                       const char** reason) {
  if (const char* why = BadHeader(hdr); why != nullptr) {
    if (reason != nullptr) *reason = why;
    return ParseResult::kBad;
  }
  const uint32_t value_size = Get32(hdr + 4);
  const size_t tail = size_t{value_size} + kRecordKeySize;  // after the header
  view->size = kRecordHeaderSize + tail + Get32(hdr + 8);
  if (kRecordHeaderSize + n < view->size) return ParseResult::kIncomplete;
  const uint32_t crc =
      rest == hdr + kRecordHeaderSize
          ? crc32c::Value(hdr + 4, kRecordHeaderSize - 4 + tail)
          : crc32c::Extend(crc32c::Value(hdr + 4, kRecordHeaderSize - 4), rest, tail);
  if (crc32c::Mask(crc) != Get32(hdr)) {
    if (reason != nullptr) *reason = "checksum mismatch";
    return ParseResult::kBad;
  }
  view->type = static_cast<RecordType>(hdr[12]);
  view->timestamp = Get64(hdr + 16);
  view->key = static_cast<int64_t>(Get64(rest + value_size));
  view->value = std::string_view(rest, value_size);
  return ParseResult::kOk;
}

}  // namespace

ParseResult ParseRecord(const char* p, size_t n, RecordView* view, const char** reason) {
  if (n < kRecordHeaderSize) {
    view->size = kRecordHeaderSize;
    return ParseResult::kIncomplete;
  }
  return ParseParts(p, p + kRecordHeaderSize, n - kRecordHeaderSize, view, reason);
}

ParseResult ParseRecordSplit(const char* header, const char* rest, size_t n, RecordView* view,
                             const char** reason) {
  return ParseParts(header, rest, n, view, reason);
}

void EncodeRecordHeader(char* hdr, RecordType type, int64_t key, uint64_t timestamp,
                        std::string_view prefix, std::string_view value) {
  char key_bytes[kRecordKeySize];
  Put64(key_bytes, static_cast<uint64_t>(key));
  FillHeader(hdr, type, timestamp, prefix.size() + value.size());
  Put32(hdr, RecordCrc(hdr, prefix, value, key_bytes));
}

void EncodeRecord(char* dst, RecordType type, int64_t key, uint64_t timestamp,
                  std::string_view prefix, std::string_view value) {
  char* v = dst + kRecordHeaderSize;
  if (!prefix.empty()) std::memcpy(v, prefix.data(), prefix.size());
  if (!value.empty()) std::memcpy(v + prefix.size(), value.data(), value.size());
  char* k = v + prefix.size() + value.size();
  Put64(k, static_cast<uint64_t>(key));
  FillHeader(dst, type, timestamp, prefix.size() + value.size());
  // One pass over the freshly written (cache-hot) bytes.
  const size_t body = kRecordHeaderSize + prefix.size() + value.size() + kRecordKeySize;
  Put32(dst, crc32c::Mask(crc32c::Value(dst + 4, body - 4)));
}

std::string EncodeAppendParts(const std::vector<AppendPart>& parts) {
  std::string out(1 + parts.size() * kAppendPartBytes, '\0');
  out[0] = static_cast<char>(parts.size());
  char* p = out.data() + 1;
  for (const AppendPart& part : parts) {
    Put64(p, part.record_pos);
    Put32(p + 8, part.record_size);
    Put32(p + 12, part.payload_size);
    p += kAppendPartBytes;
  }
  return out;
}

bool DecodeAppendParts(std::string_view value, std::vector<AppendPart>* parts,
                       std::string_view* payload) {
  if (value.empty()) return false;
  const size_t n = static_cast<uint8_t>(value[0]);
  const size_t meta = 1 + n * kAppendPartBytes;
  if (n == 0 || n > kMaxAppendParts || value.size() < meta) return false;
  parts->clear();
  const char* p = value.data() + 1;
  for (size_t i = 0; i < n; ++i, p += kAppendPartBytes) {
    AppendPart part{Get64(p), Get32(p + 8), Get32(p + 12)};
    if (part.record_size < RecordSize(part.payload_size)) return false;
    parts->push_back(part);
  }
  *payload = value.substr(meta);
  return true;
}

uint64_t NowMicros() {
  using namespace std::chrono;
  return static_cast<uint64_t>(
      duration_cast<microseconds>(system_clock::now().time_since_epoch()).count());
}

}  // namespace flatkv::engine
