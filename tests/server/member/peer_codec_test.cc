// PeekCall (server/member/peer_codec.h): the method and key of calls the
// generated client encodes, and what it makes of calls cut short, of the
// wrong shape or of no such method.
#include "server/member/peer_codec.h"

#include <catch2/catch.hpp>

#include <memory>
#include <string>

#include <thrift/protocol/TBinaryProtocol.h>
#include <thrift/transport/TBufferTransports.h>

#include "FlatKV.h"

using flatkv::server::CallPeek;
using flatkv::server::PeekCall;

namespace {

// The bytes the generated client sends for "call" (the message, no frame).
template <typename Call>
std::string Encode(const Call& call) {
  auto buffer = std::make_shared<apache::thrift::transport::TMemoryBuffer>();
  auto protocol = std::make_shared<apache::thrift::protocol::TBinaryProtocol>(buffer);
  flatkv::rpc::FlatKVClient client(protocol);
  call(client);
  return buffer->getBufferAsString();
}

CallPeek Peek(const std::string& message, bool* ok = nullptr) {
  CallPeek peek;
  const bool read = PeekCall(reinterpret_cast<const uint8_t*>(message.data()),
                             static_cast<uint32_t>(message.size()), &peek);
  if (ok != nullptr) *ok = read;
  return peek;
}

}  // namespace

TEST_CASE("PeekCall reads the method and key of a single-key call", "[peer_codec]") {
  CallPeek get = Peek(Encode([](auto& c) { c.send_get(-42); }));
  REQUIRE(get.traits != nullptr);
  CHECK(std::string(get.traits->name) == "get");
  CHECK(get.key == CallPeek::Key::kInt);
  CHECK(get.int_key == -42);

  CallPeek put = Peek(Encode([](auto& c) { c.send_put(1LL << 40, "value"); }));
  REQUIRE(put.traits != nullptr);
  CHECK(put.traits->write);
  CHECK(put.key == CallPeek::Key::kInt);
  CHECK(put.int_key == 1LL << 40);

  const std::string message = Encode([](auto& c) { c.send_sput(std::string("k\0y", 3), "v"); });
  CallPeek sput = Peek(message);
  REQUIRE(sput.traits != nullptr);
  CHECK(std::string(sput.traits->name) == "sput");
  CHECK(sput.key == CallPeek::Key::kString);
  CHECK(sput.string_key == std::string_view("k\0y", 3));
  // The key is read where it lies: a view into the message, not a copy.
  CHECK(sput.string_key.data() >= message.data());
  CHECK(sput.string_key.data() < message.data() + message.size());
}

TEST_CASE("PeekCall gives no key for calls without one", "[peer_codec]") {
  CallPeek stats = Peek(Encode([](auto& c) { c.send_stats(); }));
  REQUIRE(stats.traits != nullptr);
  CHECK(stats.key == CallPeek::Key::kNone);
  CallPeek batch = Peek(Encode([](auto& c) { c.send_multiGet({1, 2, 3}); }));
  REQUIRE(batch.traits != nullptr);
  CHECK(batch.key == CallPeek::Key::kNone);
}

TEST_CASE("PeekCall refuses what is not a strict call and marks a bad key", "[peer_codec]") {
  const std::string get = Encode([](auto& c) { c.send_get(7); });
  bool ok = true;
  // Cut inside the version word, the name, and the key.
  Peek(get.substr(0, 3), &ok);
  CHECK_FALSE(ok);
  Peek(get.substr(0, 9), &ok);
  CHECK_FALSE(ok);
  CallPeek cut = Peek(get.substr(0, get.size() - 6), &ok);
  CHECK(ok);
  CHECK(cut.key == CallPeek::Key::kMalformed);
  // No version word (an old-style message).
  Peek(std::string("\x00\x00\x00\x03get", 7) + get.substr(get.size() - 16), &ok);
  CHECK_FALSE(ok);
  // A method the IDL does not have.
  std::string unknown = get;
  unknown.replace(unknown.find("get"), 3, "gex");
  CallPeek none = Peek(unknown, &ok);
  CHECK(ok);
  CHECK(none.traits == nullptr);
  // An integer key sent as a string.
  std::string typed = get;
  const size_t field = typed.size() - 12;  // type byte, id, i64, stop
  REQUIRE(typed[field] == 10);             // T_I64
  typed[field] = 11;                       // T_STRING: a length then bytes, which are not there
  CallPeek bad = Peek(typed, &ok);
  CHECK(ok);
  CHECK(bad.key == CallPeek::Key::kMalformed);
  // A first field that is not field 1: no key read.
  std::string renumbered = get;
  renumbered[field + 2] = 2;
  CallPeek other = Peek(renumbered, &ok);
  CHECK(ok);
  CHECK(other.key == CallPeek::Key::kNone);
}
