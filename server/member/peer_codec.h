// The ring member's hand-written Thrift codec, in one place
// (peer_codec.cc): PeekCall() below, which the MemberHandler uses to choose
// where a call runs, and the Forwarder's decoding of client calls,
// encoding of their peer* twins, decoding of the peers' answers and
// encoding of the client's answers (Forwarder::Parse, EncodePeerCall,
// Complete, Answer). Everything else speaks Thrift through the generated
// code.
#pragma once

#include <cstdint>
#include <string_view>

#include "server/methods.h"

namespace flatkv::server {

// What PeekCall() reads of a call: its method and, for a single-key call,
// the key (its first argument).
struct CallPeek {
  const MethodTraits* traits = nullptr;  // null: no method of that name
  enum class Key {
    kNone,       // the method takes no key, or its first field is not field 1
    kInt,        // int_key
    kString,     // string_key, pointing into the message
    kMalformed,  // field 1 of the wrong type, or cut short
  };
  Key key = Key::kNone;
  int64_t int_key = 0;
  std::string_view string_key;
};

// Reads the strict binary-protocol call in "message" ("len" bytes): its
// name and, for a method with a key, field 1. Every read checks the
// bounds; nothing is copied or allocated. False if the message is
// malformed or old-style (no version word). Cheap: the I/O thread runs it
// for every call a ring member reads.
bool PeekCall(const uint8_t* message, uint32_t len, CallPeek* peek);

}  // namespace flatkv::server
