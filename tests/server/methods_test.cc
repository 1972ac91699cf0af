// server/methods.h against the IDL: every method of the FlatKV service has
// its traits, under its own name, and the traits agree with one another.
#include "server/methods.h"

#include <cctype>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include <catch2/catch.hpp>

namespace {

using flatkv::server::Dispatch;
using flatkv::server::FindMethod;
using flatkv::server::Handler;
using flatkv::server::KeyKind;
using flatkv::server::TraitsOf;

// The method names of "service FlatKV { ... }" in thrift/flatkv.thrift.
std::set<std::string> IdlMethods() {
  std::ifstream in(std::string(FLATKV_SOURCE_DIR) + "/thrift/flatkv.thrift");
  std::stringstream text;
  text << in.rdbuf();
  std::string idl = text.str();
  const size_t begin = idl.find("service FlatKV {");
  REQUIRE(begin != std::string::npos);
  idl = idl.substr(begin, idl.find("\n}", begin) - begin);
  idl = std::regex_replace(idl, std::regex("//[^\n]*"), "");
  std::set<std::string> names;
  const std::regex method(R"(([A-Za-z_]\w*)\s*\()");
  for (auto it = std::sregex_iterator(idl.begin(), idl.end(), method); it != std::sregex_iterator();
       ++it) {
    if ((*it)[1] != "throws") names.insert((*it)[1]);
  }
  return names;
}

}  // namespace

TEST_CASE("Every method of the IDL has its traits, found by its name", "[server][methods]") {
  const std::set<std::string> idl = IdlMethods();
  std::set<std::string> table;
  for (int m = 0; m < Handler::kMethods; ++m) {
    const auto& t = TraitsOf(static_cast<Handler::Method>(m));
    table.insert(t.name);
    CHECK(FindMethod(t.name) == &t);
  }
  CHECK(table == idl);
  CHECK(FindMethod("nosuchmethod") == nullptr);
}

TEST_CASE("A single-key client call and its peer twin agree on key, value and result",
          "[server][methods]") {
  int routed = 0;
  for (int m = 0; m < Handler::kMethods; ++m) {
    const auto& t = TraitsOf(static_cast<Handler::Method>(m));
    if (t.dispatch != Dispatch::kRouted) continue;
    ++routed;
    INFO(t.name);
    REQUIRE(t.twin != Handler::kMethods);
    const auto& peer = TraitsOf(t.twin);
    CHECK(peer.twin == t.method);
    std::string lower = peer.name;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    CHECK(lower == "peer" + std::string(t.name));  // put and peerPut, sget and peerSGet
    CHECK(peer.key == t.key);
    CHECK(t.key != KeyKind::kNone);
    CHECK(peer.has_value == t.has_value);
    CHECK(peer.write == t.write);
    CHECK(peer.idempotent == t.idempotent);
    CHECK(peer.result == t.result);
    // A forwarded write waits for the owner's chain; a forwarded read is
    // answered at once.
    CHECK(peer.dispatch == (t.write ? Dispatch::kChainWait : Dispatch::kInline));
  }
  CHECK(routed == 7);  // get, put, remove, append, sget, sput, sremove
  CHECK_FALSE(TraitsOf(Handler::kAppend).idempotent);
}
