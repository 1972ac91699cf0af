// Fuzz target: the calls between instances (the peer* methods and every
// other method) through the real FrontProcessor and Handler, in process:
// byte 0 picks the method (a peer method, or with 0xff the input is a whole
// binary-protocol message), the rest are its argument bytes as the binary
// protocol carries them. A standalone handler must answer each with a
// typed error or a result, never crash.
#include <cstdint>
#include <string>

#include <thrift/protocol/TBinaryProtocol.h>
#include <thrift/transport/TBufferTransports.h>

#include "server/thrift_limits.h"
#include "tests/fuzz/fuzz_server.h"

using apache::thrift::protocol::TBinaryProtocol;
using apache::thrift::transport::TMemoryBuffer;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const char* const kMethods[] = {
      "peerGet",     "peerPut",   "peerRemove", "peerAppend", "peerMultiGet", "peerMultiPut",
      "peerScan",    "peerScanLog", "peerSGet", "peerSPut",   "peerSRemove",  "peerChain",
      "peerSnapshot", "digest",   "scan",       "scanLog",    "multiGet",     "multiPut",
      "append",      "compact",   "setWriteMode", "sput",     "sget",         "stats",
      "peerBucket"};
  if (size < 1) return 0;
  auto& f = flatkv::fuzz::ServerFixture::Get(false, false);
  auto in_buf = std::make_shared<TMemoryBuffer>();
  auto out_buf = std::make_shared<TMemoryBuffer>();
  auto in = std::make_shared<TBinaryProtocol>(in_buf);
  auto out = std::make_shared<TBinaryProtocol>(out_buf);
  if (data[0] == 0xff) {
    in_buf->write(data + 1, static_cast<uint32_t>(size - 1));
  } else {
    const char* method = kMethods[data[0] % (sizeof(kMethods) / sizeof(kMethods[0]))];
    try {
      in->writeMessageBegin(method,
                            flatkv::server::FrontProcessor::IsOneway(method)
                                ? apache::thrift::protocol::T_ONEWAY
                                : apache::thrift::protocol::T_CALL,
                            1);
    } catch (...) {
      return 0;
    }
    in_buf->write(data + 1, static_cast<uint32_t>(size - 1));
  }
  // As the EventServer reads each frame (server/thrift_limits.h).
  flatkv::server::LimitToMessage(in.get(), in_buf->available_read());
  try {
    f.processor->process(in, out, nullptr);
  } catch (const std::exception&) {
    // The server closes the connection on an exception out of process():
    // allowed for bytes that are not a message at all.
  }
  return 0;
}
