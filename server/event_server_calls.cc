// How the EventServer runs calls (event_server.cc's notes, "Offload" and
// "Asynchronous calls"): a Caller decodes and answers a call in reused
// buffers, inline on an I/O thread or on a worker of the WorkerPool; a call
// handed to a worker, or taken by the thread's AsyncCalls, comes back to
// its connection's I/O thread, which writes the answer and serves on.
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>

#include <spdlog/spdlog.h>
#include <thrift/protocol/TBinaryProtocol.h>
#include <thrift/transport/TBufferTransports.h>

#include "server/event_server.h"
#include "server/event_server_internal.h"
#include "server/thrift_limits.h"

namespace flatkv::server {

using apache::thrift::transport::TMemoryBuffer;
using event_io::kAnswerInitial;
using event_io::kAnswerKeep;
using event_io::kFrameHeader;

namespace event_io {

bool Caller::Run(apache::thrift::TProcessor* processor, uint8_t* message, uint32_t len,
                 uint8_t** answer, uint32_t* size) {
  bool ok = false;
  try {
    in_->resetBuffer(message, len, TMemoryBuffer::OBSERVE);
    LimitToMessage(in_protocol_.get(), len);  // lengths that lie are refused unallocated
    out_->resetBuffer();
    out_->getWritePtr(kFrameHeader);
    out_->wroteBytes(kFrameHeader);  // the length, filled in below
    ok = processor->process(in_protocol_, out_protocol_, nullptr);
    in_->readEnd();  // resets the bytes counted against the message size limit
    in_->resetBuffer();
  } catch (const std::exception& e) {
    WarnRateLimited(std::string("call failed: ") + e.what());
    return false;
  } catch (...) {
    return false;
  }
  if (!ok) return false;
  uint32_t written = 0;
  out_->getBuffer(answer, &written);
  *size = 0;
  if (written > kFrameHeader) {
    const uint32_t body = written - kFrameHeader;
    (*answer)[0] = static_cast<uint8_t>(body >> 24);
    (*answer)[1] = static_cast<uint8_t>(body >> 16);
    (*answer)[2] = static_cast<uint8_t>(body >> 8);
    (*answer)[3] = static_cast<uint8_t>(body);
    *size = written;
  }
  return true;
}

void Caller::Trim() {
  if (out_->getBufferSize() <= kAnswerKeep) return;
  try {
    out_->resetBuffer(kAnswerInitial);
  } catch (const std::exception&) {
    // keeps the large buffer; a later call tries again
  }
}

}  // namespace event_io

Status EventServer::WorkerPool::Start(int workers) {
  try {
    for (int i = 0; i < workers; ++i) {
      callers_.push_back(std::make_unique<event_io::Caller>());
      threads_.emplace_back([this, caller = callers_.back().get()] { Run(caller); });
    }
  } catch (const std::exception& e) {
    return Status::IOError(std::string("cannot start a worker: ") + e.what());
  }
  return Status::OK();
}

void EventServer::WorkerPool::Submit(Call* call) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.Push(call);
  }
  ready_.notify_one();
}

void EventServer::WorkerPool::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  ready_.notify_all();
  for (std::thread& thread : threads_) thread.join();
  threads_.clear();
  std::lock_guard<std::mutex> lock(mu_);
  queue_.DeleteAll();  // their connections are closed by IoThread::Free()
}

bool EventServer::IoThread::WantsWorker(const uint8_t* message, uint32_t len) const {
  if (!server_->offload_) return false;
  try {
    return server_->offload_(message, len);
  } catch (...) {
    return false;  // documented as not throwing; inline is always correct
  }
}

// Hands a copy of the call in "message" to a worker; "conn" is neither read
// nor served until it comes back (Resume()). False if out of memory.
bool EventServer::IoThread::Offload(Connection* conn, const uint8_t* message, uint32_t len) {
  std::unique_ptr<Call> call(new (std::nothrow) Call);
  if (call == nullptr) return false;
  call->message.reset(new (std::nothrow) uint8_t[len]);
  if (call->message == nullptr) return false;
  std::memcpy(call->message.get(), message, len);
  call->len = len;
  return Submit(conn, std::move(call));
}

// Queues "call" (message and len set) for a worker on behalf of "conn",
// which is neither read nor served until it comes back. False (conn then
// untouched) without workers.
bool EventServer::IoThread::Submit(Connection* conn, std::unique_ptr<Call> call) {
  if (server_->workers_ == nullptr) return false;
  call->io = this;
  call->conn = conn;
  conn->busy = true;
  StopReading(conn);
  server_->workers_->Submit(call.release());
  server_->offloaded_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void EventServer::Connection::Answer(const uint8_t* frame, size_t len) {
  io->AsyncAnswered(this, frame, len);
}

void EventServer::Connection::Redo(std::unique_ptr<uint8_t[]> message, uint32_t len,
                                   std::function<void(const std::function<void()>&)> wrap) {
  io->AsyncRedo(this, std::move(message), len, std::move(wrap));
}

// The AsyncCalls answered the call "conn" waited for: written like an
// answer given inline, then the frames that arrived meanwhile are served.
void EventServer::IoThread::AsyncAnswered(Connection* conn, const uint8_t* frame, size_t len) {
  conn->waiting = false;
  conn->ticket = nullptr;
  if (evbuffer_add(bufferevent_get_output(conn->bev), frame, len) != 0) {
    ProtocolError(conn, "a call could not be answered; connection closed");
    return;
  }
  if (conn->stalled) {
    conn->stalled = false;
    if (!ResumeReading(conn)) {
      Close(conn);
      return;
    }
  }
  ServeFrames(conn);
}

void EventServer::IoThread::AsyncRedo(Connection* conn, std::unique_ptr<uint8_t[]> message,
                                      uint32_t len,
                                      std::function<void(const std::function<void()>&)> wrap) {
  conn->waiting = false;
  conn->ticket = nullptr;
  conn->stalled = false;  // Resume() adds the read event again
  std::unique_ptr<Call> call(new (std::nothrow) Call);
  if (call != nullptr) {
    call->message = std::move(message);
    call->len = len;
    call->wrap = std::move(wrap);
  }
  if (call == nullptr || !Submit(conn, std::move(call))) {
    spdlog::error("cannot hand a call to a worker; connection closed");
    Close(conn);
  }
}

// The call of "call->conn" came back from its worker: its answer is written
// like one answered inline, then the connection is read and served again.
void EventServer::IoThread::Resume(std::unique_ptr<Call> call) {
  Connection* conn = call->conn;
  conn->busy = false;
  if (conn->bev == nullptr) {  // closed while the call was on the worker
    connections_.erase(conn);
    delete conn;
    return;
  }
  evbuffer* output = bufferevent_get_output(conn->bev);
  if (!call->ok || (!call->answer.empty() &&
                    evbuffer_add(output, call->answer.data(), call->answer.size()) != 0)) {
    ProtocolError(conn, "a call could not be answered; connection closed");
    return;
  }
  call.reset();
  if (!ResumeReading(conn)) {
    Close(conn);
    return;
  }
  ServeFrames(conn);  // the frames that arrived meanwhile, then the write
}

namespace {
// The call running inline on this I/O thread (RedoOnWorker()).
struct InlineCall {
  bool active = false;
  bool can_redo = false;  // the server has workers
  bool redo = false;
};
thread_local InlineCall inline_call;
}  // namespace

bool EventServer::InlineOnIoThread() { return inline_call.active; }

bool EventServer::RedoOnWorker() {
  if (!inline_call.active || !inline_call.can_redo) return false;
  inline_call.redo = true;
  return true;
}

// Runs one call on "message"; the answer (with its frame header) goes to
// "output". False if the processor threw or gave up; the connection must
// then be closed.
bool EventServer::IoThread::Answer(uint8_t* message, uint32_t len, evbuffer* output,
                                   bool* redo) {
  uint8_t* answer = nullptr;
  uint32_t size = 0;
  inline_call = {true, server_->workers_ != nullptr, false};
  bool ok = caller_.Run(server_->processor_.get(), message, len, &answer, &size);
  *redo = inline_call.redo;
  inline_call = InlineCall();
  if (ok && !*redo && size > 0) ok = evbuffer_add(output, answer, size) == 0;
  caller_.Trim();
  return ok;
}

void EventServer::WorkerPool::Run(event_io::Caller* caller) {
  for (;;) {
    Call* call = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      ready_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      call = queue_.Pop();
    }
    const auto run = [&] {
      uint8_t* answer = nullptr;
      uint32_t size = 0;
      call->ok = caller->Run(server_->processor_.get(), call->message.get(), call->len, &answer,
                             &size);
      if (call->ok) {
        try {
          call->answer.assign(answer, answer + size);
        } catch (const std::bad_alloc&) {
          call->ok = false;
        }
      }
      caller->Trim();
    };
    if (call->wrap) {
      call->wrap(run);
      call->wrap = nullptr;  // on this thread: what it holds is freed here
    } else {
      run();
    }
    call->message.reset();
    call->io->Answered(call);
  }
}

}  // namespace flatkv::server
