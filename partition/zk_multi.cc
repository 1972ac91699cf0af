#include "partition/zk_multi.h"

namespace flatkv::partition {

int ZkMulti(zhandle_t* zh, int count, const zoo_op_t* ops, zoo_op_result_t* results) {
  const int state = zoo_state(zh);
  if (state != ZOO_CONNECTED_STATE) return state < 0 ? ZINVALIDSTATE : ZCONNECTIONLOSS;
  return zoo_multi(zh, count, ops, results);
}

}  // namespace flatkv::partition
