// Fuzz target: the HTTP port (server/http.cc): the input is sent as is
// over a loopback connection to the real HttpServer, whose routes call the
// real Handler over a temporary store. Every request gets a status line or
// a closed connection, and the server keeps serving: after every 64th
// input GET /health must answer 200.
#include <cstdint>
#include <string>

#include "tests/fuzz/fuzz_server.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto& f = flatkv::fuzz::ServerFixture::Get(false, true);
  const int port = f.http->port();
  (void)flatkv::fuzz::Exchange(port, std::string_view(reinterpret_cast<const char*>(data), size),
                               500);
  static uint64_t n = 0;
  if (++n % 64 == 1) {
    const std::string answer = flatkv::fuzz::Exchange(
        port, "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    if (answer.rfind("HTTP/1.1 200", 0) != 0) __builtin_trap();
  }
  return 0;
}
