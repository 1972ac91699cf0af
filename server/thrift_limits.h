// Size limits for reading calls with Thrift's binary protocol.
//
// Thrift 0.17 allocates a string or a list from its length field before it
// reads the bytes: TBinaryProtocol::readStringBody() resizes the string to
// the claimed length when the transport cannot lend that many bytes, and a
// list of structs is resized to its claimed count unchecked (structs count
// as 0 bytes in checkReadBytesAvailable). A 30-byte call claiming a 771 MB
// string made the server allocate and zero 771 MB (found by
// tests/fuzz/peer_fuzz). No string inside a message can be longer than the
// message, and every list in a FlatKV request holds i64s or structs of at
// least 8 wire bytes, so these limits refuse only lengths that lie; the call
// is then answered PROTOCOL_ERROR (FrontProcessor).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <limits>
#include <memory>

#include <thrift/protocol/TBinaryProtocol.h>

namespace flatkv::server {

// The generated code stores any i32 from the wire in an enum field; loading
// a value outside the enum's range as the enum is undefined behaviour (the
// same class as tests/fuzz/server_fuzz's write mode 258), so the field is
// read back as its integer before it is checked.
template <typename Enum>
inline int64_t RawEnum(const Enum& e) {
  std::underlying_type_t<Enum> raw;
  static_assert(sizeof(raw) == sizeof(e));
  std::memcpy(&raw, &e, sizeof(raw));
  return static_cast<int64_t>(raw);
}

// Smallest wire size of an element of any list in a request.
inline constexpr uint32_t kMinListElementBytes = 8;

// Limits "protocol" for reading one message of "len" bytes.
inline void LimitToMessage(apache::thrift::protocol::TBinaryProtocol* protocol, uint32_t len) {
  const uint32_t max = std::numeric_limits<int32_t>::max();
  protocol->setStringSizeLimit(static_cast<int32_t>(std::min(len, max)));
  protocol->setContainerSizeLimit(static_cast<int32_t>(len / kMinListElementBytes + 1));
}

// A protocol factory for servers that see frames of at most max_frame_bytes
// (Thrift's TNonblockingServer: the limits are per connection, not per call).
inline std::shared_ptr<apache::thrift::protocol::TBinaryProtocolFactory> LimitedProtocolFactory(
    uint64_t max_frame_bytes) {
  const auto len = static_cast<uint32_t>(
      std::min<uint64_t>(max_frame_bytes, std::numeric_limits<int32_t>::max()));
  return std::make_shared<apache::thrift::protocol::TBinaryProtocolFactory>(
      static_cast<int32_t>(len), static_cast<int32_t>(len / kMinListElementBytes + 1),
      /*strict_read=*/false, /*strict_write=*/true);  // Thrift's defaults
}

}  // namespace flatkv::server
