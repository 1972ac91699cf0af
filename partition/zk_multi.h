// The one way FlatKV sends a ZooKeeper multi.
//
// The C client's zoo_amulti (Debian's 3.8, and ZooKeeper's current code
// alike) builds the request op by op and stops building at the first op
// whose request cannot be made; for every op after it, it still frees the
// request's path, which was never set: whatever the stack held there. A
// request cannot be made once the handle's session has expired (or its
// authentication failed), so a multi sent on such a handle frees memory the
// client does not own, typically one of the caller's paths (a double free
// later, or a crash at once). A registry may well send one then: the handle
// learns of the expiry on its I/O thread, and the registry only when the
// completion thread delivers the event.
//
// So a multi goes out only on a handle that is connected at the call. Its
// session can then expire before the client builds the request only if the
// client loses the connection, reconnects and is told so within those few
// instructions.
#pragma once
#include <zookeeper/zookeeper.h>

namespace flatkv::partition {

// zoo_multi on a connected handle. On any other: ZINVALIDSTATE if the
// session has expired or its authentication failed (what every other call
// answers then), ZCONNECTIONLOSS while it is (re)connecting; nothing is sent
// and "results" is left as it was.
int ZkMulti(zhandle_t* zh, int count, const zoo_op_t* ops, zoo_op_result_t* results);

}  // namespace flatkv::partition
