// Fuzz target: the ring builder over what ZooKeeper holds (partition/ring.*):
// children names of the service path with their data, the .cluster
// settings JSON and the recorded chains' JSON. Other instances and other
// teams write these nodes, so any bytes must parse into a ring or be
// skipped. Input lines (\n): the first is the settings JSON; then
//   c NAME\tDATA   a child (member if its name parses), DATA its host:port
//   m MARK         a recorded mark
//   r MARK JSON    a recorded chain
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "partition/ring.h"
#include "tests/fuzz/fuzz_util.h"

using namespace flatkv::partition;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto lines =
      flatkv::fuzz::Split(std::string_view(reinterpret_cast<const char*>(data), size), '\n');
  RingSettings settings;
  if (!RingSettings::FromJson(lines[0], &settings).ok()) settings = RingSettings();
  if (settings.hash_bound <= 0) settings.hash_bound = kDefaultHashBound;
  (void)RingSettings::FromJson(settings.ToJson(), &settings);
  std::vector<int64_t> marks;
  std::vector<Ring::Registration> regs;
  std::map<int64_t, RecordedChain> recorded;
  int64_t czxid = 0;
  for (size_t i = 1; i < lines.size(); ++i) {
    std::string_view line = lines[i];
    if (line.size() < 2) continue;
    const char kind = line[0];
    line.remove_prefix(2);
    if (kind == 'c') {
      const size_t tab = line.find('\t');
      const std::string_view name = line.substr(0, tab);
      const std::string_view node_data = tab == std::string_view::npos ? "" : line.substr(tab + 1);
      Ring::Registration r;
      std::string host;
      int port = 0;
      if (!ParseMemberNode(name, &r.mark, &r.member.host, &r.member.port)) continue;
      if (ParseHostPort(node_data, "member data", &host, &port).ok() &&
          (host != r.member.host || port != r.member.port)) {
        continue;  // data disagrees with the name: the registry skips it
      }
      r.member.czxid = ++czxid;
      regs.push_back(r);
    } else if (kind == 'm') {
      marks.push_back(std::strtoll(std::string(line).c_str(), nullptr, 10));
    } else if (kind == 'r') {
      const size_t sp = line.find(' ');
      RecordedChain chain;
      if (sp == std::string_view::npos || !RecordedChain::FromJson(line.substr(sp + 1), &chain).ok()) {
        continue;
      }
      recorded[std::strtoll(std::string(line.substr(0, sp)).c_str(), nullptr, 10)] = chain;
      RecordedChain again;
      if (!RecordedChain::FromJson(chain.ToJson(), &again).ok() || !(again == chain)) {
        __builtin_trap();  // what was parsed must round-trip
      }
    }
  }
  auto ring = Ring::Make(static_cast<int64_t>(size), settings, marks, regs, recorded);
  (void)ring->ToString();
  if (ring->empty()) return 0;
  const auto ranges = ring->KeyOrder();
  for (const HashRange& r : ranges) {
    if (ring->OwnerIndex(r.lo) != r.partition || ring->OwnerIndex(r.hi) != r.partition) {
      __builtin_trap();  // KeyOrder and OwnerIndex agree
    }
    (void)ring->RangeOf(r.lo);
  }
  for (const Partition& p : ring->partitions()) {
    if (ring->Find(p.mark) != &p) __builtin_trap();
    for (const Member& m : p.chain) (void)ring->RoleOf(p.mark, m.address());
  }
  (void)ring->HashString(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
