#include "server/member/chain_log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <spdlog/spdlog.h>

#include "engine/crc32c.h"

namespace flatkv::server {
namespace {

using partition::ChainEntry;

constexpr size_t kHeader = 8;                 // length, crc
constexpr uint32_t kMaxBody = 1u << 30;       // far past any frame
constexpr char kState = 'S';
constexpr char kEntry = 'E';

// ENOSPC/EDQUOT become NoSpace (Status::FromErrno), which the replicator
// handles by leaving the chain rather than stopping the process.
Status Errno(const std::string& what, const std::string& path) {
  return Status::FromErrno(what + " " + path, errno);
}

template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(v));
}

template <typename T>
bool Get(const char** p, const char* end, T* v) {
  if (static_cast<size_t>(end - *p) < sizeof(T)) return false;
  std::memcpy(v, *p, sizeof(T));
  *p += sizeof(T);
  return true;
}

void Frame(const std::string& body, std::string* out) {
  Put<uint32_t>(out, static_cast<uint32_t>(body.size()));
  Put<uint32_t>(out, engine::crc32c::Mask(engine::crc32c::Value(body.data(), body.size())));
  out->append(body);
}

void EncodeState(const ChainLog::State& s, std::string* out) {
  std::string body(1, kState);
  Put<int64_t>(&body, s.position.epoch);
  Put<uint64_t>(&body, s.position.seq);
  Put<uint8_t>(&body, s.intact ? 1 : 0);
  Frame(body, out);
}

void EncodeEntry(const ChainEntry& e, std::string* out) {
  std::string body(1, kEntry);
  body.reserve(1 + 20 + 8 * e.keys.size() + e.op.size());
  Put<int64_t>(&body, e.epoch);
  Put<uint64_t>(&body, e.seq);
  Put<uint32_t>(&body, static_cast<uint32_t>(e.keys.size()));
  for (uint64_t k : e.keys) Put<uint64_t>(&body, k);
  body += e.op;
  Frame(body, out);
}

// One record's body; false if it is not a whole, valid record.
bool Decode(const char* p, const char* end, ChainLog::State* state, ChainEntry* entry,
            bool* is_state) {
  char type;
  if (!Get(&p, end, &type)) return false;
  if (type == kState) {
    uint8_t intact;
    if (!Get(&p, end, &state->position.epoch) || !Get(&p, end, &state->position.seq) ||
        !Get(&p, end, &intact) || p != end) {
      return false;
    }
    state->intact = intact != 0;
    *is_state = true;
    return true;
  }
  uint32_t n;
  if (type != kEntry || !Get(&p, end, &entry->epoch) || !Get(&p, end, &entry->seq) ||
      !Get(&p, end, &n) || static_cast<size_t>(end - p) / 8 < n) {
    return false;
  }
  entry->keys.resize(n);
  for (uint64_t& k : entry->keys) Get(&p, end, &k);
  entry->op.assign(p, end);
  *is_state = false;
  return true;
}

Status SyncDir(const std::string& path) {
  const std::string dir = path.substr(0, path.find_last_of('/') + 1);
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Errno("cannot open the directory of", path);
  const int rc = ::fsync(fd);
  ::close(fd);
  return rc == 0 ? Status::OK() : Errno("cannot sync the directory of", path);
}

}  // namespace

Status ChainLog::Open(const std::string& path, State* state, std::vector<ChainEntry>* entries,
                      std::unique_ptr<ChainLog>* log) {
  *state = State();
  entries->clear();
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT) {
    // A new member (or one from before the log): nothing it can claim.
    std::unique_ptr<ChainLog> fresh(new ChainLog(path, -1, 0, 0));
    FLATKV_RETURN_IF_ERROR(fresh->Reset(State()));
    *log = std::move(fresh);
    return Status::OK();
  }
  if (fd < 0) return Errno("cannot open", path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    Status s = Errno("cannot stat", path);
    ::close(fd);
    return s;
  }
  std::string bytes(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < bytes.size()) {
    const ssize_t n = ::pread(fd, bytes.data() + got, bytes.size() - got, static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      Status s = Errno("cannot read", path);
      ::close(fd);
      return s;
    }
    got += static_cast<size_t>(n);
  }
  size_t at = 0;
  while (at + kHeader <= bytes.size()) {
    uint32_t len, crc;
    std::memcpy(&len, bytes.data() + at, 4);
    std::memcpy(&crc, bytes.data() + at + 4, 4);
    if (len == 0 || len > kMaxBody || len > bytes.size() - at - kHeader) break;
    const char* body = bytes.data() + at + kHeader;
    if (engine::crc32c::Unmask(crc) != engine::crc32c::Value(body, len)) break;
    State s;
    ChainEntry e;
    bool is_state = false;
    if (!Decode(body, body + len, &s, &e, &is_state)) break;
    if (is_state) {
      *state = s;
      entries->clear();
    } else {
      entries->push_back(std::move(e));
    }
    at += kHeader + len;
  }
  uint64_t allocated = bytes.size();
  const bool zeros = std::all_of(bytes.begin() + static_cast<ptrdiff_t>(at), bytes.end(),
                                 [](char c) { return c == 0; });
  if (!zeros) {
    spdlog::warn("chain: {}: cutting off {} bytes after offset {} (a torn or damaged record)",
                 path, bytes.size() - at, at);
    if (::ftruncate(fd, static_cast<off_t>(at)) != 0 || ::fdatasync(fd) != 0) {
      Status s = Errno("cannot truncate", path);
      ::close(fd);
      return s;
    }
    allocated = at;
  }
  log->reset(new ChainLog(path, fd, at, allocated));
  return Status::OK();
}

ChainLog::ChainLog(std::string path, int fd, uint64_t size, uint64_t allocated)
    : path_(std::move(path)), fd_(fd), size_(size), allocated_(allocated) {}

uint64_t ChainLog::Preallocate(int fd, uint64_t from) {
  static const std::string kZeros(64 << 10, '\0');
  const uint64_t to = (from / kPreallocBytes + 1) * kPreallocBytes;
  uint64_t at = from;
  while (at < to) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kZeros.size(), to - at));
    const ssize_t w = ::pwrite(fd, kZeros.data(), n, static_cast<off_t>(at));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      // No room (or another error the next append will meet itself).
      if (::ftruncate(fd, static_cast<off_t>(from)) != 0) return at;
      return from;
    }
    at += static_cast<uint64_t>(w);
  }
  return to;
}

ChainLog::~ChainLog() {
  if (fd_ >= 0) ::close(fd_);
}

Status ChainLog::Write(const std::string& records) {
  size_t done = 0;
  while (done < records.size()) {
    const ssize_t n = ::pwrite(fd_, records.data() + done, records.size() - done,
                               static_cast<off_t>(size_ + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      Status s = Errno("cannot write", path_);
      // Whatever part got written is cut off again: the log stays whole.
      if (::ftruncate(fd_, static_cast<off_t>(size_)) != 0) {
        spdlog::error("chain: cannot cut {} back to {} bytes: {}", path_, size_,
                      std::strerror(errno));
      }
      allocated_ = size_;
      return s;
    }
    done += static_cast<size_t>(n);
  }
  size_ += records.size();
  // The zeros run out: the next ones, synced with this batch (the one
  // fdatasync per kPreallocBytes that commits a size change).
  if (size_ >= allocated_) allocated_ = Preallocate(fd_, size_);
  dirty_ = true;
  return Status::OK();
}

Status ChainLog::Append(const std::vector<ChainEntry>& entries) {
  std::string records;
  for (const ChainEntry& e : entries) EncodeEntry(e, &records);
  return Write(records);
}

Status ChainLog::Sync() {
  if (!dirty_) return Status::OK();
  if (::fdatasync(fd_) != 0) return Errno("cannot sync", path_);
  dirty_ = false;
  return Status::OK();
}

Status ChainLog::SyncAppended() {
  if (::fdatasync(fd_) != 0) return Errno("cannot sync", path_);
  return Status::OK();
}

Status ChainLog::Reset(const State& state) {
  const std::string tmp = path_ + ".new";
  std::string record;
  EncodeState(state, &record);
  int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("cannot create", tmp);
  Status st;
  uint64_t allocated = record.size();
  if (::pwrite(fd, record.data(), record.size(), 0) != static_cast<ssize_t>(record.size())) {
    st = Errno("cannot write", tmp);
  } else if (allocated = Preallocate(fd, record.size()); ::fdatasync(fd) != 0) {
    st = Errno("cannot sync", tmp);
  } else if (::rename(tmp.c_str(), path_.c_str()) != 0) {
    st = Errno("cannot rename over", path_);
  }
  if (st.ok()) st = SyncDir(path_);
  if (!st.ok()) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return st;
  }
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
  size_ = record.size();
  allocated_ = allocated;
  dirty_ = false;
  return Status::OK();
}

}  // namespace flatkv::server
