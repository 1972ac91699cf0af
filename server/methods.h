// The traits of every method of flatkv.thrift, in one table: its name, the
// key it takes, whether it writes, whether it may be sent twice, its result,
// its peer* twin, and where a server runs it. The handler's counters, the
// I/O thread's choice between answering inline and handing a call to a
// worker (Handler::MayBlock), and the Forwarder's encoding of forwarded
// calls all read it, so a method added to the IDL is described once.
#pragma once

#include <cstdint>
#include <string_view>

#include "server/handler.h"

namespace flatkv::server {

// Where a server runs a call (Handler::MayBlock).
enum class Dispatch : uint8_t {
  kInline,      // on the I/O thread: never forwarded, never waits
  kRouted,      // a single-key client call: inline if its key is served here
                // without a chain write, else forwarded or on a worker
  kFanOut,      // may call other members (batches, scans, ring changes): a worker
  kWholeStore,  // reads or flushes the whole store (verify, backup): a worker
  kChainWait,   // waits for the chain or the member's replication state: a
                // worker in a chain member, inline elsewhere
  kChainFrame,  // peerChain: inline unless the member's loop is behind
};

enum class KeyKind : uint8_t { kNone, kInt, kString };

// The result field of a single-key call (field 0 "success"), as the
// Forwarder decodes and re-encodes it.
enum class ResultKind : uint8_t { kVoid, kBool, kGetResult, kOther };

struct MethodTraits {
  Handler::Method method;
  const char* name;  // as in flatkv.thrift
  Dispatch dispatch;
  KeyKind key;       // of a single-key call (first argument, or second after a PeerContext)
  bool has_value;    // a single-key write's value follows its key
  bool write;
  bool idempotent;   // false: never sent twice (append)
  ResultKind result;
  // A single-key client call's peer* twin, and the twin's client call;
  // Handler::kMethods for the others.
  Handler::Method twin;
};

// The traits of "method" (any value below Handler::kMethods).
const MethodTraits& TraitsOf(Handler::Method method);
// The traits of the method called "name", or nullptr if the IDL has none.
const MethodTraits* FindMethod(std::string_view name);

}  // namespace flatkv::server
