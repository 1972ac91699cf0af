// FrontProcessor is the generated FlatKVProcessor plus the two answers the
// generated code cannot give:
//
//   Overload. TNonblockingServer queues every complete request for the
//   worker pool, and Thrift's own overload actions either block the I/O
//   thread or close connections. FrontProcessor runs in the worker that takes
//   a request off the queue: when server.max_queued_calls or more requests are
//   still waiting behind it, it skips the handler and answers
//   KvError{OVERLOADED} at once (the call's arguments are skipped unread, a
//   few microseconds), so the queue drains at the speed of rejection rather
//   than of work and clients learn to back off instead of timing out.
//
//   Malformed calls. A call whose arguments are missing or mistyped (every
//   argument is "required" in flatkv.thrift), or whose message type is not a
//   call, makes the generated code throw before any answer is written, and
//   the client would wait forever. FrontProcessor answers it with a
//   TApplicationException naming the method (PROTOCOL_ERROR or
//   INVALID_MESSAGE_TYPE). Unknown method names already get UNKNOWN_METHOD
//   from the generated code.
//
// Thread safety: process() runs concurrently in every worker; the handler is
// thread-safe and the counters are atomic.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include <thrift/concurrency/ThreadManager.h>

#include "FlatKV.h"

namespace flatkv::server {

class FrontProcessor : public rpc::FlatKVProcessor {
 public:
  // "workers" is the pool whose queue is measured (null: calls run on the
  // I/O threads and there is no queue); max_queued >= 1.
  FrontProcessor(std::shared_ptr<rpc::FlatKVIf> handler,
                 std::shared_ptr<apache::thrift::concurrency::ThreadManager> workers,
                 size_t max_queued);

  bool process(std::shared_ptr<apache::thrift::protocol::TProtocol> in,
               std::shared_ptr<apache::thrift::protocol::TProtocol> out,
               void* connection_context) override;

  // flatkv.thrift declares "name" oneway (its callers read no answer).
  static bool IsOneway(const std::string& name);

  // Calls answered with OVERLOADED so far.
  int64_t overloaded() const { return overloaded_.load(std::memory_order_relaxed); }
  // Calls answered with a TApplicationException for malformed input.
  int64_t malformed() const { return malformed_.load(std::memory_order_relaxed); }

 private:
  // Skips the call's arguments and answers KvError{OVERLOADED} (out null:
  // a oneway call, not answered).
  void RejectOverloaded(apache::thrift::protocol::TProtocol* in,
                        apache::thrift::protocol::TProtocol* out, const std::string& name,
                        int32_t seqid, size_t queued);
  // Answers the call with a TApplicationException (out null: a oneway
  // call; logs it instead).
  void Fail(apache::thrift::protocol::TProtocol* out, const std::string& name, int32_t seqid,
            int type, const std::string& message);

  const std::shared_ptr<apache::thrift::concurrency::ThreadManager> workers_;
  const size_t max_queued_;
  std::atomic<int64_t> overloaded_{0};
  std::atomic<int64_t> malformed_{0};
};

}  // namespace flatkv::server
