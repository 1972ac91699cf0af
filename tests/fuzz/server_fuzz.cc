// Fuzz target: the Thrift port as a client sees it. The input is sent as
// is over a loopback connection to a real EventServer (framing: 4-byte
// length + binary-protocol message, pipelined), dispatched by the real
// FrontProcessor to the real Handler over a temporary store. The server
// must answer or close that connection, and keep serving: after every
// input a well-formed get must still be answered.
#include <cstdint>
#include <string>

#include "tests/fuzz/fuzz_server.h"

namespace {

// A framed binary-protocol call get(1: i64 key = 7), seqid 1.
std::string GetCall() {
  std::string m;
  auto u32 = [&](uint32_t v) {
    for (int i = 3; i >= 0; --i) m.push_back(static_cast<char>(v >> (8 * i)));
  };
  u32(0x80010001);  // version 1, T_CALL
  u32(3);
  m += "get";
  u32(1);                                       // seqid
  m += std::string("\x0a\x00\x01", 3);          // field 1, i64
  m += std::string("\x00\x00\x00\x00\x00\x00\x00\x07", 8);
  m.push_back('\0');                            // T_STOP
  std::string frame;
  for (int i = 3; i >= 0; --i) frame.push_back(static_cast<char>(m.size() >> (8 * i)));
  return frame + m;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto& f = flatkv::fuzz::ServerFixture::Get(true, false);
  const int port = f.thrift->port();
  (void)flatkv::fuzz::Exchange(port, std::string_view(reinterpret_cast<const char*>(data), size));
  static uint64_t n = 0;
  if (++n % 64 == 1) {  // still serving (every 64th input: a connection costs)
    const std::string answer = flatkv::fuzz::Exchange(port, GetCall());
    if (answer.size() < 8) __builtin_trap();
  }
  return 0;
}
