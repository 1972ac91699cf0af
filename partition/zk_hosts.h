// The host list FlatKV hands to the ZooKeeper C client.
//
// After losing its server, the C client (Debian's 3.8, and ZooKeeper's
// current code alike) steps through its shuffled address list twice per
// failed attempt: once when the attempt fails and once when it picks the
// next server. Over an even number of addresses it therefore tries only
// every other one, for good: a client of "a:2181,b:2181" that lost both
// servers keeps knocking on the one that is still down while the other
// serves again, until its session is gone. Over an odd number the same
// step of two reaches every address.
//
// So an even list (two or more servers) gets its first server once more.
// That server takes two of the attempts in each round instead of one; every
// server is tried within a round. A name that resolves to several addresses
// counts as one entry here: list servers by address, or by names of one
// address each, to be sure of the odd count.
#pragma once
#include <string>

namespace flatkv::partition {

// "hosts" as cluster.zookeeper holds it ("h:p,h:p[/chroot]"); returns it
// with the first server repeated when it names an even number (>= 2) of
// servers, the chroot kept at the end. Empty entries (",,") are not
// counted, and the text is otherwise passed through unchanged.
std::string ClientHosts(const std::string& hosts);

}  // namespace flatkv::partition
