// Status is how every fallible function in engine/, partition/ and server/
// reports its outcome: errors are values, never exceptions. A Status is either
// OK or carries a code and a message that names what failed (file, offset,
// key, option), in the style of LevelDB's and Kudu's Status.
//
// Thread safety: a Status is a plain value; distinct objects may be used from
// different threads without synchronization.
#pragma once

#include <string>
#include <string_view>
#include <utility>

namespace flatkv {

class [[nodiscard]] Status {
 public:
  enum class Code : int {
    kOk = 0,
    kNotFound = 1,
    kCorruption = 2,
    kInvalidArgument = 3,
    kIOError = 4,
    kKeyOutOfRange = 5,   // key outside the store's [key_min, key_max)
    kValueTooLarge = 6,   // value larger than max_value_bytes
    kNoSpace = 7,         // the disk (or a data file's addressable size) is full
    kBusy = 8,            // resource temporarily unavailable; retry later
    // Codes only a remote server gives (client/ maps KvError onto them).
    kUnauthorized = 9,    // admin call without the right admin.token
    kNotOwner = 10,       // the key belongs to another partition
    kUnavailable = 11,    // the server is shutting down or has no serving member
  };

  Status() = default;  // OK

  static Status OK() { return Status(); }
  static Status NotFound(std::string_view msg) { return Status(Code::kNotFound, msg); }
  static Status Corruption(std::string_view msg) { return Status(Code::kCorruption, msg); }
  static Status InvalidArgument(std::string_view msg) {
    return Status(Code::kInvalidArgument, msg);
  }
  static Status IOError(std::string_view msg) { return Status(Code::kIOError, msg); }
  // An IOError built from an errno value: "<context>: <strerror(err)>".
  // ENOSPC and EDQUOT become kNoSpace so callers can tell a full disk apart.
  static Status FromErrno(std::string_view context, int err);
  static Status KeyOutOfRange(std::string_view msg) { return Status(Code::kKeyOutOfRange, msg); }
  static Status ValueTooLarge(std::string_view msg) { return Status(Code::kValueTooLarge, msg); }
  static Status NoSpace(std::string_view msg) { return Status(Code::kNoSpace, msg); }
  static Status Busy(std::string_view msg) { return Status(Code::kBusy, msg); }
  static Status Unauthorized(std::string_view msg) { return Status(Code::kUnauthorized, msg); }
  static Status NotOwner(std::string_view msg) { return Status(Code::kNotOwner, msg); }
  static Status Unavailable(std::string_view msg) { return Status(Code::kUnavailable, msg); }

  bool ok() const { return code_ == Code::kOk; }
  bool IsNotFound() const { return code_ == Code::kNotFound; }
  bool IsCorruption() const { return code_ == Code::kCorruption; }
  bool IsInvalidArgument() const { return code_ == Code::kInvalidArgument; }
  bool IsIOError() const { return code_ == Code::kIOError; }
  bool IsKeyOutOfRange() const { return code_ == Code::kKeyOutOfRange; }
  bool IsValueTooLarge() const { return code_ == Code::kValueTooLarge; }
  bool IsNoSpace() const { return code_ == Code::kNoSpace; }
  bool IsBusy() const { return code_ == Code::kBusy; }
  bool IsUnauthorized() const { return code_ == Code::kUnauthorized; }
  bool IsNotOwner() const { return code_ == Code::kNotOwner; }
  bool IsUnavailable() const { return code_ == Code::kUnavailable; }

  Code code() const { return code_; }
  const std::string& message() const { return msg_; }

  // "OK", or "<CodeName>: <message>".
  std::string ToString() const;

  // Returns a copy whose message is "<context>: <message>"; OK stays OK.
  Status WithContext(std::string_view context) const;

 private:
  Status(Code code, std::string_view msg) : code_(code), msg_(msg) {}

  Code code_ = Code::kOk;
  std::string msg_;
};

// Returns the status of "expr" from the enclosing function if it is not OK.
#define FLATKV_RETURN_IF_ERROR(expr)          \
  do {                                        \
    ::flatkv::Status _st = (expr);            \
    if (!_st.ok()) return _st;                \
  } while (0)

}  // namespace flatkv
