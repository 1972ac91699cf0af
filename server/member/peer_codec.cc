// The ring member's hand-written Thrift codec (peer_codec.h): PeekCall(),
// and the Forwarder's: a client call decoded with the protocol the
// processor uses, its peer* twin encoded as FlatKVClient::send_peer* would,
// the peer's answer decoded as recv_peer* would, and the client method's
// answer written exactly as its generated *_result would be.
#include <cstring>
#include <string>

#include <thrift/TApplicationException.h>
#include <thrift/protocol/TBinaryProtocol.h>
#include <thrift/transport/TBufferTransports.h>

#include "server/member/forwarder.h"
#include "server/member/forwarder_internal.h"
#include "server/member/peer_codec.h"
#include "server/methods.h"
#include "server/thrift_limits.h"

namespace flatkv::server {

using apache::thrift::TApplicationException;
using apache::thrift::protocol::T_BOOL;
using apache::thrift::protocol::T_CALL;
using apache::thrift::protocol::T_EXCEPTION;
using apache::thrift::protocol::T_I64;
using apache::thrift::protocol::T_REPLY;
using apache::thrift::protocol::T_STOP;
using apache::thrift::protocol::T_STRING;
using apache::thrift::protocol::T_STRUCT;
using apache::thrift::protocol::TBinaryProtocol;
using apache::thrift::protocol::TMessageType;
using apache::thrift::protocol::TType;
using apache::thrift::transport::TMemoryBuffer;
using forwarder_io::FindSpec;
using forwarder_io::kFrameHeader;
using forwarder_io::PeerName;
using forwarder_io::PutFrameLength;
using forwarder_io::StringKey;

namespace {

// A cursor over a binary-protocol message (big-endian), enough to read the
// call's name and its first argument. Every read checks the bounds.
struct Reader {
  const uint8_t* p;
  const uint8_t* end;
  bool Take(size_t n, const uint8_t** out) {
    if (static_cast<size_t>(end - p) < n) return false;
    *out = p;
    p += n;
    return true;
  }
  bool I32(int32_t* v) {
    const uint8_t* b;
    if (!Take(4, &b)) return false;
    *v = static_cast<int32_t>(uint32_t{b[0]} << 24 | uint32_t{b[1]} << 16 | uint32_t{b[2]} << 8 |
                              uint32_t{b[3]});
    return true;
  }
  bool I64(int64_t* v) {
    int32_t hi, lo;
    if (!I32(&hi) || !I32(&lo)) return false;
    *v = static_cast<int64_t>(static_cast<uint64_t>(static_cast<uint32_t>(hi)) << 32 |
                              static_cast<uint32_t>(lo));
    return true;
  }
  bool Bytes(std::string_view* v) {
    int32_t n;
    const uint8_t* b;
    if (!I32(&n) || n < 0 || !Take(static_cast<size_t>(n), &b)) return false;
    *v = std::string_view(reinterpret_cast<const char*>(b), static_cast<size_t>(n));
    return true;
  }
};

constexpr uint8_t kTypeI64 = 10;
constexpr uint8_t kTypeString = 11;

}  // namespace

bool PeekCall(const uint8_t* message, uint32_t len, CallPeek* peek) {
  *peek = CallPeek();
  Reader r{message, message + len};
  int32_t version, seqid;
  std::string_view name;
  if (!r.I32(&version) || (static_cast<uint32_t>(version) & 0xffff0000u) != 0x80010000u ||
      !r.Bytes(&name) || !r.I32(&seqid)) {
    return false;
  }
  peek->traits = FindMethod(name);
  if (peek->traits == nullptr || peek->traits->key == KeyKind::kNone) return true;
  const uint8_t* type;
  const uint8_t* id;
  if (!r.Take(1, &type) || !r.Take(2, &id) || (id[0] << 8 | id[1]) != 1) return true;
  peek->key = CallPeek::Key::kMalformed;
  if (peek->traits->key == KeyKind::kInt) {
    if (*type == kTypeI64 && r.I64(&peek->int_key)) peek->key = CallPeek::Key::kInt;
  } else if (*type == kTypeString && r.Bytes(&peek->string_key)) {
    peek->key = CallPeek::Key::kString;
  }
  return true;
}

// Reads the call's name and arguments with the protocol the processor
// uses, so anything it would refuse is left to it.
bool Forwarder::Parse(const uint8_t* message, uint32_t len, Op* op, bool* inline_call) {
  *inline_call = false;
  bool ok = false;
  try {
    in_->resetBuffer(const_cast<uint8_t*>(message), len, TMemoryBuffer::OBSERVE);
    LimitToMessage(in_protocol_.get(), len);  // lengths that lie are refused unallocated
    std::string name;
    TMessageType type;
    in_protocol_->readMessageBegin(name, type, op->seqid);
    op->spec = type == T_CALL ? FindSpec(name, &op->peer) : nullptr;
    if (op->spec != nullptr) {
      // The arguments struct: (field 1 the peer's context,) then the key
      // and the value; the generated code skips unknown fields and insists
      // on the required.
      std::string ignored;
      TType ftype;
      int16_t fid;
      const int16_t key_id = op->peer ? 2 : 1;
      bool have_ctx = !op->peer, have_key = false, have_value = false;
      in_protocol_->readStructBegin(ignored);
      for (;;) {
        in_protocol_->readFieldBegin(ignored, ftype, fid);
        if (ftype == T_STOP) break;
        if (fid == 1 && op->peer && ftype == T_STRUCT) {
          op->ctx.read(in_protocol_.get());
          have_ctx = true;
        } else if (fid == key_id && !StringKey(*op->spec) && ftype == T_I64) {
          in_protocol_->readI64(op->key);
          have_key = true;
        } else if (fid == key_id && StringKey(*op->spec) && ftype == T_STRING) {
          in_protocol_->readBinary(op->string_key);
          have_key = true;
        } else if (fid == key_id + 1 && op->spec->has_value && ftype == T_STRING) {
          in_protocol_->readBinary(op->value);
          have_value = true;
        } else {
          in_protocol_->skip(ftype);
        }
        in_protocol_->readFieldEnd();
      }
      in_protocol_->readStructEnd();
      in_protocol_->readMessageEnd();
      ok = have_ctx && have_key && (have_value || !op->spec->has_value);
      *inline_call = !ok;  // a required argument missing
    }
  } catch (const std::exception&) {
    *inline_call = op->spec != nullptr;  // malformed arguments
  }
  in_->readEnd();  // resets the bytes counted against the message size limit
  in_->resetBuffer();
  return ok;
}

// Encodes op's peer call (the blocking path's FlatKVClient::send_peer*
// writes the same bytes) with "seqid": *frame (with its length) and *size
// stay valid until the next encoding. False if out of memory.
bool Forwarder::EncodePeerCall(const Op& op, int32_t seqid, uint8_t** frame, uint32_t* size) {
  const MethodTraits& spec = *op.spec;
  try {
    out_->resetBuffer();
    out_->getWritePtr(kFrameHeader);
    out_->wroteBytes(kFrameHeader);  // the length, filled in below
    TBinaryProtocol* p = out_protocol_.get();
    p->writeMessageBegin(PeerName(spec), T_CALL, seqid);
    p->writeStructBegin("args");
    p->writeFieldBegin("ctx", T_STRUCT, 1);
    op.target.context.write(p);
    p->writeFieldEnd();
    if (StringKey(spec)) {
      p->writeFieldBegin("key", T_STRING, 2);
      p->writeBinary(op.string_key);
    } else {
      p->writeFieldBegin("key", T_I64, 2);
      p->writeI64(op.key);
    }
    p->writeFieldEnd();
    if (spec.has_value) {
      p->writeFieldBegin("value", T_STRING, 3);
      p->writeBinary(op.value);
      p->writeFieldEnd();
    }
    p->writeFieldStop();
    p->writeStructEnd();
    p->writeMessageEnd();
  } catch (const std::exception&) {
    return false;  // out of memory
  }
  out_->getBuffer(frame, size);
  PutFrameLength(*frame, *size - static_cast<uint32_t>(kFrameHeader));
  return true;
}

// Decodes the answer to the oldest call, as the generated recv_peer* would
// (result field 0 or field 1, unknown fields skipped), drains it, then
// answers the client or hands the call to a worker (NOT_OWNER).
bool Forwarder::Complete(Conn* conn, uint8_t* body, uint32_t len) {
  if (conn->pending.empty()) return false;
  Op* op = conn->pending.front();
  const MethodTraits& spec = *op->spec;
  Outcome outcome;
  std::string failure;
  bool in_step = true;
  try {
    in_->resetBuffer(body, len, TMemoryBuffer::OBSERVE);
    TBinaryProtocol* p = in_protocol_.get();
    // A peer's answer is no more trusted than a client's call: no string or
    // list longer than the frame (answers to forwarded calls hold no list
    // of small elements, so this refuses only lengths that lie).
    p->setStringSizeLimit(static_cast<int32_t>(std::min<uint32_t>(len, INT32_MAX)));
    p->setContainerSizeLimit(static_cast<int32_t>(std::min<uint32_t>(len, INT32_MAX)));
    std::string name;
    TMessageType type;
    int32_t seqid = 0;
    p->readMessageBegin(name, type, seqid);
    if (seqid != op->peer_seqid || name != PeerName(spec)) {
      in_step = false;
    } else if (type == T_EXCEPTION) {
      TApplicationException e;
      e.read(p);
      failure = e.what();
    } else if (type != T_REPLY) {
      in_step = false;
    } else {
      std::string ignored;
      TType ftype;
      int16_t fid;
      p->readStructBegin(ignored);
      for (;;) {
        p->readFieldBegin(ignored, ftype, fid);
        if (ftype == T_STOP) break;
        if (fid == 0 && spec.result == ResultKind::kGetResult && ftype == T_STRUCT) {
          outcome.get.read(p);
          outcome.has_success = true;
        } else if (fid == 0 && spec.result == ResultKind::kBool && ftype == T_BOOL) {
          p->readBool(outcome.existed);
          outcome.has_success = true;
        } else if (fid == 1 && ftype == T_STRUCT) {
          outcome.err.read(p);
          outcome.has_err = true;
          // Passed on to the client as the peer said it, unless the code is
          // none this build knows (read as its integer: RawEnum).
          const int64_t code = RawEnum(outcome.err.code);
          if (code < rpc::ErrorCode::KEY_OUT_OF_RANGE || code > rpc::ErrorCode::UNAVAILABLE) {
            outcome.err.code = rpc::ErrorCode::UNAVAILABLE;
            outcome.err.message = "member " + conn->peer->address +
                                  " answered an unknown error code " + std::to_string(code) +
                                  ": " + outcome.err.message;
          }
        } else {
          p->skip(ftype);
        }
        p->readFieldEnd();
      }
      p->readStructEnd();
      p->readMessageEnd();
      if (!outcome.has_err && !outcome.has_success && spec.result != ResultKind::kVoid) {
        failure = std::string(PeerName(spec)) + " failed: unknown result";  // as recv_peer*
      }
    }
  } catch (const std::exception& e) {
    in_step = false;  // a malformed answer: the connection's state is unknown
  }
  in_->readEnd();
  in_->resetBuffer();
  if (!in_step) return false;
  evbuffer_drain(conn->input, kFrameHeader + len);
  conn->pending.pop_front();
  ++conn->completed;
  if (!failure.empty()) {
    FailOp(op, conn->peer->address + ": " + PeerName(spec) + ": " + failure);
  } else if (outcome.has_err && outcome.err.code == rpc::ErrorCode::NOT_OWNER) {
    Redo(op);
  } else {
    Answer(op, outcome);
  }
  return true;
}

// Writes the client method's answer exactly as its generated *_result
// would: "success" if set, else "err" if set (never both).
void Forwarder::Answer(Op* op, const Outcome& outcome) {
  std::unique_ptr<Op> owned(op);
  const MethodTraits& spec = *op->spec;
  handler_->Finish(op->peer ? spec.twin : spec.method, op->start, outcome.has_err);
  Reply* reply = op->reply;
  op->reply = nullptr;
  if (reply == nullptr) return;  // the client went away
  uint8_t* frame = nullptr;
  uint32_t size = 0;
  try {
    out_->resetBuffer();
    out_->getWritePtr(kFrameHeader);
    out_->wroteBytes(kFrameHeader);
    TBinaryProtocol* p = out_protocol_.get();
    p->writeMessageBegin(op->peer ? PeerName(spec) : spec.name, T_REPLY, op->seqid);
    p->writeStructBegin("result");
    if (outcome.has_err) {
      p->writeFieldBegin("err", T_STRUCT, 1);
      outcome.err.write(p);
      p->writeFieldEnd();
    } else if (spec.result == ResultKind::kGetResult) {
      p->writeFieldBegin("success", T_STRUCT, 0);
      outcome.get.write(p);
      p->writeFieldEnd();
    } else if (spec.result == ResultKind::kBool) {
      p->writeFieldBegin("success", T_BOOL, 0);
      p->writeBool(outcome.existed);
      p->writeFieldEnd();
    }
    p->writeFieldStop();
    p->writeStructEnd();
    p->writeMessageEnd();
    out_->getBuffer(&frame, &size);
    PutFrameLength(frame, size - static_cast<uint32_t>(kFrameHeader));
  } catch (const std::exception&) {
    size = 0;
  }
  // Copied before anything else runs on this thread; an empty answer (out
  // of memory) closes the client connection.
  reply->Answer(frame, size);
}

}  // namespace flatkv::server
