// The host list FlatKV hands to the ZooKeeper C client (zk_hosts.h).
#include "partition/zk_hosts.h"

#include <string_view>
#include <vector>

namespace flatkv::partition {

std::string ClientHosts(const std::string& hosts) {
  const size_t slash = hosts.find('/');
  const std::string_view servers = std::string_view(hosts).substr(0, slash);
  std::vector<std::string_view> entries;
  for (size_t start = 0; start <= servers.size();) {
    size_t comma = servers.find(',', start);
    if (comma == std::string_view::npos) comma = servers.size();
    if (comma > start) entries.push_back(servers.substr(start, comma - start));
    start = comma + 1;
  }
  if (entries.size() < 2 || entries.size() % 2 != 0) return hosts;
  std::string out(servers);
  out += ',';
  out += entries.front();
  if (slash != std::string::npos) out += hosts.substr(slash);
  return out;
}

}  // namespace flatkv::partition
