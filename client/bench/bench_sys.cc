#include "client/bench/bench_sys.h"

#include <sys/stat.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <vector>

namespace flatkv::client {
namespace {

namespace fs = std::filesystem;

// Scans a "Key:  value" file such as /proc/self/status for "key" and returns
// its first number, or false if the file or the key is missing.
bool ReadProcField(const char* path, const char* key, uint64_t* value) {
  std::FILE* f = std::fopen(path, "r");
  if (f == nullptr) return false;
  char line[256];
  size_t key_len = std::strlen(key);
  bool found = false;
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    if (std::strncmp(line, key, key_len) == 0 && line[key_len] == ':') {
      found = std::sscanf(line + key_len + 1, "%" SCNu64, value) == 1;
      break;
    }
  }
  std::fclose(f);
  return found;
}

}  // namespace

uint64_t ReadRssBytes() {
  uint64_t kb = 0;
  if (!ReadProcField("/proc/self/status", "VmRSS", &kb)) return 0;
  return kb * 1024;
}

uint64_t ReadIoWriteBytes(bool* ok) {
  uint64_t bytes = 0;
  bool read = ReadProcField("/proc/self/io", "write_bytes", &bytes);
  if (ok != nullptr) *ok = read;
  return read ? bytes : 0;
}

uint64_t DiskBytes(const std::string& dir) {
  uint64_t total = 0;
  std::error_code ec;
  fs::recursive_directory_iterator it(dir, fs::directory_options::skip_permission_denied,
                                      ec);
  for (; !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    struct stat st;
    if (::lstat(it->path().c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) {
      total += static_cast<uint64_t>(st.st_blocks) * 512;
    }
  }
  return total;
}

DataFileBytes ReadDataFileBytes(const std::string& dir) {
  DataFileBytes total;
  std::error_code ec;
  fs::recursive_directory_iterator it(dir, fs::directory_options::skip_permission_denied,
                                      ec);
  for (; !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() < 9 || name.compare(0, 5, "data-") != 0 ||
        name.compare(name.size() - 4, 4, ".log") != 0) {
      continue;
    }
    struct stat st;
    if (::lstat(it->path().c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
      total.size += static_cast<uint64_t>(st.st_size);
      total.allocated += static_cast<uint64_t>(st.st_blocks) * 512;
    }
  }
  return total;
}

Status PrepareDir(const std::string& dir, bool fresh, bool* was_empty) {
  std::error_code ec;
  if (dir.empty()) return Status::InvalidArgument("--dir is empty");
  fs::file_status st = fs::status(dir, ec);
  if (fs::exists(st) && !fs::is_directory(st)) {
    return Status::InvalidArgument("--dir " + dir + " exists and is not a directory");
  }
  if (!fs::exists(st) && !fs::create_directories(dir, ec) && ec) {
    return Status::IOError("cannot create --dir " + dir + ": " + ec.message());
  }
  if (fresh) {
    // --fresh empties the directory the user named; refusing "/" keeps a
    // typo such as `--dir $UNSET/` from wiping the machine.
    fs::path canonical = fs::canonical(dir, ec);
    if (ec) return Status::IOError("cannot resolve --dir " + dir + ": " + ec.message());
    if (canonical == canonical.root_path()) {
      return Status::InvalidArgument("refusing --fresh on the root directory");
    }
    // List first, then remove: deleting entries while readdir() walks the
    // same directory may skip some.
    std::vector<fs::path> entries;
    for (fs::directory_iterator it(dir, ec); !ec && it != fs::directory_iterator();
         it.increment(ec)) {
      entries.push_back(it->path());
    }
    if (ec) return Status::IOError("--fresh: cannot list " + dir + ": " + ec.message());
    for (const fs::path& entry : entries) {
      fs::remove_all(entry, ec);
      if (ec) {
        return Status::IOError("--fresh: cannot remove " + entry.string() + ": " +
                               ec.message());
      }
    }
  }
  fs::directory_iterator first(dir, ec);
  if (ec) return Status::IOError("cannot list --dir " + dir + ": " + ec.message());
  *was_empty = first == fs::directory_iterator();
  return Status::OK();
}

}  // namespace flatkv::client
