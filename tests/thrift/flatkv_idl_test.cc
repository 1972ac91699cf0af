// The wire contract compiles and its types survive the binary protocol: the
// field ids and enum values other languages' clients rely on.
#include <catch2/catch.hpp>

#include <thrift/protocol/TBinaryProtocol.h>
#include <thrift/transport/TBufferTransports.h>

#include "FlatKV.h"
#include "flatkv_types.h"

using apache::thrift::protocol::TBinaryProtocol;
using apache::thrift::transport::TMemoryBuffer;

namespace {

template <typename T>
T RoundTrip(const T& in) {
  auto buffer = std::make_shared<TMemoryBuffer>();
  TBinaryProtocol protocol(buffer);
  in.write(&protocol);
  T out;
  out.read(&protocol);
  return out;
}

}  // namespace

TEST_CASE("The contract's structs survive the binary protocol", "[thrift]") {
  flatkv::rpc::GetResult get;
  get.found = true;
  get.value = std::string("bin\0ary", 7);
  const auto get2 = RoundTrip(get);
  REQUIRE(get2.found);
  REQUIRE(get2.value == get.value);

  flatkv::rpc::ScanResult scan;
  flatkv::rpc::KvPair pair;
  pair.key = -42;
  pair.value = "v";
  scan.pairs = {pair, pair};
  scan.done = false;
  scan.nextKey = 7;
  const auto scan2 = RoundTrip(scan);
  REQUIRE(scan2.pairs.size() == 2);
  REQUIRE(scan2.pairs[1].key == -42);
  REQUIRE(scan2.nextKey == 7);

  flatkv::rpc::KvError err;
  err.code = flatkv::rpc::ErrorCode::VALUE_TOO_LARGE;
  err.message = "value of 17 bytes exceeds 16";
  const auto err2 = RoundTrip(err);
  REQUIRE(err2.code == flatkv::rpc::ErrorCode::VALUE_TOO_LARGE);
  REQUIRE(err2.message == err.message);
}

TEST_CASE("Enum values match the contract and never move", "[thrift]") {
  REQUIRE(static_cast<int>(flatkv::rpc::ErrorCode::KEY_OUT_OF_RANGE) == 0);
  REQUIRE(static_cast<int>(flatkv::rpc::ErrorCode::UNAVAILABLE) == 7);
  REQUIRE(static_cast<int>(flatkv::rpc::WriteMode::SAFE) == 1);
  REQUIRE(static_cast<int>(flatkv::rpc::WriteMode::ASYNC) == 2);
}
