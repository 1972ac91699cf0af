// A log record: the unit appended to a data file. Layout (little-endian),
// version 1; FORMAT.md has the full description.
//
//   0        4           8             12     13     14     16            24
//   +--------+-----------+-------------+------+------+------+-------------+
//   | crc32c | value_size| reserved_sz | type | klen | zero | timestamp   |
//   +--------+-----------+-------------+------+------+------+-------------+
//   | value (value_size bytes) | key (klen = 8 bytes) | reserved_sz bytes |
//   +--------------------------+----------------------+-------------------+
//
// crc32c is masked (crc32c::Mask) and covers bytes [4, 24) of the header, the
// value and the key. reserved_sz bytes of padding may follow the key; writers
// of version 1 write 0. An append fragment (type kAppend) stores in its value
// the list of the older parts of the key's value, then the appended bytes:
//
//   | n (u8) | n x { record_pos u64, record_size u32, payload_size u32 } | bytes |
//
// Thread safety: free functions on caller-owned buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace flatkv::engine {

enum class RecordType : uint8_t {
  kValue = 1,      // a full value
  kTombstone = 2,  // the key was removed
  kAppend = 3,     // bytes appended to older parts (see above)
};

constexpr size_t kRecordHeaderSize = 24;
constexpr size_t kRecordKeySize = 8;
// A value larger than this is never valid on disk, whatever the options say.
constexpr uint32_t kMaxRecordValue = 1u << 31;
// Appended values keep at most this many older parts (the merge rule keeps it
// near log2 of the value size; this is the sanity bound).
constexpr size_t kMaxAppendParts = 64;
constexpr size_t kAppendPartBytes = 16;

inline size_t RecordSize(size_t value_size) {
  return kRecordHeaderSize + value_size + kRecordKeySize;
}

struct RecordView {
  RecordType type = RecordType::kValue;
  uint64_t timestamp = 0;
  int64_t key = 0;
  std::string_view value;  // points into the parsed buffer
  size_t size = 0;         // bytes the record occupies on disk, padding included
};

// One older part of an appended value.
struct AppendPart {
  uint64_t record_pos = 0;    // where the record holding the part starts
  uint32_t record_size = 0;   // its size on disk
  uint32_t payload_size = 0;  // bytes of the value it contributes
};

enum class ParseResult {
  kOk,          // a whole, checksum-valid record
  kIncomplete,  // the header is sane but fewer than view->size bytes are there
  kBad,         // not a record: bad header, size or checksum
};

// Parses the record at p[0, n). On kIncomplete, view->size holds the bytes
// needed. On kBad, *reason (if non-null) says why.
ParseResult ParseRecord(const char* p, size_t n, RecordView* view,
                        const char** reason = nullptr);
// The same for a record read in two pieces: its kRecordHeaderSize header
// bytes, and the rest[0, n) that follow them (value, key, padding).
// view->value points into rest.
ParseResult ParseRecordSplit(const char* header, const char* rest, size_t n, RecordView* view,
                             const char** reason = nullptr);

// Encodes a record into dst, which must hold RecordSize(prefix.size() +
// value.size()) bytes. The record's value is prefix followed by value.
void EncodeRecord(char* dst, RecordType type, int64_t key, uint64_t timestamp,
                  std::string_view prefix, std::string_view value);

// Writes the header of such a record into hdr[kRecordHeaderSize] and returns
// it; used for large values written with pwritev without copying them.
void EncodeRecordHeader(char* hdr, RecordType type, int64_t key, uint64_t timestamp,
                        std::string_view prefix, std::string_view value);

// Encodes / decodes the part list at the start of a kAppend record's value.
std::string EncodeAppendParts(const std::vector<AppendPart>& parts);
// On success fills *parts and *payload (the appended bytes) and returns true.
bool DecodeAppendParts(std::string_view value, std::vector<AppendPart>* parts,
                       std::string_view* payload);

// Microseconds since the Unix epoch.
uint64_t NowMicros();

}  // namespace flatkv::engine
