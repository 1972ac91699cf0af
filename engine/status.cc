#include "engine/status.h"

#include <cerrno>
#include <cstring>

namespace flatkv {

Status Status::FromErrno(std::string_view context, int err) {
  std::string msg(context);
  msg += ": ";
  msg += std::strerror(err);
  if (err == ENOSPC || err == EDQUOT) return Status(Code::kNoSpace, msg);
  return Status(Code::kIOError, msg);
}

std::string Status::ToString() const {
  const char* name = "Unknown";
  switch (code_) {
    case Code::kOk: return "OK";
    case Code::kNotFound: name = "NotFound"; break;
    case Code::kCorruption: name = "Corruption"; break;
    case Code::kInvalidArgument: name = "InvalidArgument"; break;
    case Code::kIOError: name = "IOError"; break;
    case Code::kKeyOutOfRange: name = "KeyOutOfRange"; break;
    case Code::kValueTooLarge: name = "ValueTooLarge"; break;
    case Code::kNoSpace: name = "NoSpace"; break;
    case Code::kBusy: name = "Busy"; break;
    case Code::kUnauthorized: name = "Unauthorized"; break;
    case Code::kNotOwner: name = "NotOwner"; break;
    case Code::kUnavailable: name = "Unavailable"; break;
  }
  return std::string(name) + ": " + msg_;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  std::string msg(context);
  msg += ": ";
  msg += msg_;
  return Status(code_, msg);
}

}  // namespace flatkv
