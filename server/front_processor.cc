#include "server/front_processor.h"

#include <cstring>
#include <type_traits>

#include <thrift/TApplicationException.h>

#include "server/event_server.h"

namespace flatkv::server {

using apache::thrift::TApplicationException;
using apache::thrift::protocol::T_CALL;
using apache::thrift::protocol::T_EXCEPTION;
using apache::thrift::protocol::T_ONEWAY;
using apache::thrift::protocol::T_REPLY;
using apache::thrift::protocol::T_STRUCT;
using apache::thrift::protocol::TMessageType;
using apache::thrift::protocol::TProtocol;

FrontProcessor::FrontProcessor(std::shared_ptr<rpc::FlatKVIf> handler,
                               std::shared_ptr<apache::thrift::concurrency::ThreadManager> workers,
                               size_t max_queued)
    : rpc::FlatKVProcessor(std::move(handler)),
      workers_(std::move(workers)),
      max_queued_(max_queued) {}

// Mirrors TDispatchProcessor::process, with the overload check before the
// dispatch and an answer for what the generated code would leave unanswered.
bool FrontProcessor::process(std::shared_ptr<TProtocol> in, std::shared_ptr<TProtocol> out,
                             void* connection_context) {
  std::string name;
  TMessageType type;
  int32_t seqid = 0;
  try {
    in->readMessageBegin(name, type, seqid);
  } catch (const apache::thrift::TException& e) {
    // No name or sequence id to answer with; an answer with neither still
    // tells the client what happened instead of leaving it waiting.
    Fail(out.get(), "", 0, TApplicationException::PROTOCOL_ERROR,
         std::string("malformed message header: ") + e.what());
    return true;
  }
  // Thrift stores the wire byte in the enum as it is; a byte outside
  // TMessageType's range is undefined behaviour once loaded as the enum
  // (found by tests/fuzz/server_fuzz), so it is read back as its integer.
  std::underlying_type_t<TMessageType> raw_type;
  static_assert(sizeof(raw_type) == sizeof(type));
  std::memcpy(&raw_type, &type, sizeof(raw_type));
  // A oneway method (flatkv.thrift: peerChain) is called with T_ONEWAY and
  // never answered, not even with an error: its sender reads nothing back.
  const bool oneway = IsOneway(name);
  if (raw_type != (oneway ? T_ONEWAY : T_CALL)) {
    Fail(out.get(), name, seqid, TApplicationException::INVALID_MESSAGE_TYPE,
         raw_type == T_CALL || raw_type == T_ONEWAY
             ? name + (oneway ? ": a oneway method, called with a call that waits for an answer"
                              : ": called oneway, but it answers every call")
             : name + ": message type " + std::to_string(raw_type) + " is not a call");
    return true;
  }
  const size_t queued = workers_ ? workers_->pendingTaskCount() : 0;
  if (workers_ && queued >= max_queued_) {
    RejectOverloaded(in.get(), oneway ? nullptr : out.get(), name, seqid, queued);
    return true;
  }
  try {
    return dispatchCall(in.get(), out.get(), name, seqid, connection_context);
  } catch (const apache::thrift::TException& e) {
    // Raised while reading the arguments (a missing or mistyped one throws
    // TProtocolException, arguments cut short inside the frame a transport
    // end-of-data), before anything was written: the generated code catches
    // everything the handler throws itself.
    Fail(oneway ? nullptr : out.get(), name, seqid, TApplicationException::PROTOCOL_ERROR,
         name + ": malformed arguments (" + e.what() +
             "): each argument must be present with the type flatkv.thrift gives it");
    return true;
  }
}

bool FrontProcessor::IsOneway(const std::string& name) { return name == "peerChain"; }

// Every method declares "throws (1: KvError err)", so one result shape fits
// all: a struct whose field 1 is the KvError.
void FrontProcessor::RejectOverloaded(TProtocol* in, TProtocol* out, const std::string& name,
                                      int32_t seqid, size_t queued) {
  in->skip(T_STRUCT);
  in->readMessageEnd();
  in->getTransport()->readEnd();
  overloaded_.fetch_add(1, std::memory_order_relaxed);

  rpc::KvError error;
  error.code = rpc::ErrorCode::OVERLOADED;
  error.message = name + ": server overloaded (" + std::to_string(queued) +
                  " calls queued, server.max_queued_calls = " + std::to_string(max_queued_) +
                  "); retry later";
  if (out == nullptr) return;  // oneway: dropped (a chain frame is sent again)
  out->writeMessageBegin(name, T_REPLY, seqid);
  out->writeStructBegin("result");
  out->writeFieldBegin("err", T_STRUCT, 1);
  error.write(out);
  out->writeFieldEnd();
  out->writeFieldStop();
  out->writeStructEnd();
  out->writeMessageEnd();
  out->getTransport()->writeEnd();
  out->getTransport()->flush();
}

void FrontProcessor::Fail(TProtocol* out, const std::string& name, int32_t seqid, int type,
                          const std::string& message) {
  malformed_.fetch_add(1, std::memory_order_relaxed);
  if (out == nullptr) {  // oneway: nobody to tell but the log
    WarnRateLimited(message);
    return;
  }
  TApplicationException error(static_cast<TApplicationException::TApplicationExceptionType>(type),
                              message);
  out->writeMessageBegin(name, T_EXCEPTION, seqid);
  error.write(out);
  out->writeMessageEnd();
  out->getTransport()->writeEnd();
  out->getTransport()->flush();
}

}  // namespace flatkv::server
