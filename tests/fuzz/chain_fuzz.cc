// Fuzz target: what a chain member does with a peerChain frame from its
// predecessor, past the point peer_fuzz reaches (a standalone server answers
// peerChain with NOT_OWNER before decoding anything). The input is a
// ChainFrame in the binary protocol, as the wire carries it (strings and
// lists limited to the input's size, as the EventServer limits them to the
// frame's), read by the generated code (any i32 lands in the ChainKind and
// ChainOpKind enums), then:
//   1. DecodeChainFrame (the replicator's check of the message kind);
//   2. DecodeChainOps on every entry (the op kinds, keys and values);
//   3. a real partition::ChainMember, the tail of the chain
//      [127.0.0.1:1, 127.0.0.1:2], takes it from the head (OnMessage; the
//      frame's chain id is replaced by the member's own when the first byte
//      is even, so the state machine does not just drop it as stale);
//   4. what it says to apply goes through ApplyChainEntries into a real
//      Store behind the write-back cache (the fixture of the other server
//      targets), as Replicator::ApplyEntries does.
// Nothing may crash, trip a sanitizer, or allocate past the fuzzer's limits.
#include <cstdint>
#include <string>
#include <vector>

#include <thrift/protocol/TBinaryProtocol.h>
#include <thrift/transport/TBufferTransports.h>

#include "partition/chain.h"
#include "server/member/replicator.h"
#include "tests/fuzz/fuzz_server.h"

using apache::thrift::protocol::TBinaryProtocol;
using apache::thrift::transport::TMemoryBuffer;

namespace {

constexpr const char* kHead = "127.0.0.1:1";
constexpr const char* kSelf = "127.0.0.1:2";

// The tail of a registered two-member chain, rebuilt for every input (its
// state is a few counters; the store behind it persists, as a member's does).
struct Member {
  flatkv::partition::ChainMember member{kSelf, flatkv::partition::ChainOptions{},
                                        flatkv::partition::ChainPosition{1, 0}};
  flatkv::partition::ChainConfig config;
  Member() {
    config.version = 1;
    config.id = 0x5eed;
    config.members = {kHead, kSelf};
    config.epochs = {100, 200};
    config.sync = true;
    config.recorded = config.members;
    config.recorded_zxid = 201;
    member.OnRegistered(200, 0, 1000);
    member.OnSessionAnswer(1000, int64_t{1} << 60, 1000, &sink);
    member.OnConfig(config, 1000, &sink);
  }
  flatkv::partition::ChainOutput sink;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  auto& f = flatkv::fuzz::ServerFixture::Get(false, false);
  const bool own_chain = data[0] % 2 == 0;
  auto buf = std::make_shared<TMemoryBuffer>(const_cast<uint8_t*>(data + 1),
                                             static_cast<uint32_t>(size - 1),
                                             TMemoryBuffer::OBSERVE);
  TBinaryProtocol in(buf, static_cast<int32_t>(size), static_cast<int32_t>(size), true, true);
  flatkv::rpc::ChainFrame frame;
  try {
    frame.read(&in);
  } catch (const std::exception&) {
    return 0;  // not a frame: the server answers a protocol error
  }
  flatkv::partition::ChainMessage msg;
  if (!flatkv::server::DecodeChainFrame(frame, &msg).ok()) return 0;
  for (const auto& e : msg.entries) {
    std::vector<flatkv::rpc::ChainOp> ops;
    if (!flatkv::server::DecodeChainOps(e.op, &ops).ok()) return 0;  // OnFrame refuses it
  }
  Member m;
  if (own_chain) msg.chain = m.config.id;
  flatkv::partition::ChainOutput out;
  m.member.OnMessage(kHead, msg, 2000, &out);
  m.member.OnTick(2500, &out);
  if (!out.apply.empty()) {
    std::vector<std::pair<uint64_t, bool>> existed;
    (void)flatkv::server::ApplyChainEntries(f.cache.get(), out.apply, &existed);
  }
  return 0;
}
