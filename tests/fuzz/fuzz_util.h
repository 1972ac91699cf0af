// Helpers shared by the libFuzzer targets (tests/fuzz/*_fuzz.cc): a
// temporary directory that lives as long as the process, byte splitting,
// and a loopback socket exchange for the targets that drive a real server.
//
// Each target defines LLVMFuzzerTestOneInput; built with -DFLATKV_FUZZ=ON it
// links libFuzzer, and in every build replay_main.cc replays its seeds and
// regressions (tests/fuzz/<target>/) as a normal ctest.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <spdlog/spdlog.h>

namespace flatkv::fuzz {

// A directory removed at exit; one per process (targets reuse it).
class ProcessDir {
 public:
  ProcessDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "flatkv-fuzz-XXXXXX").string();
    const char* p = mkdtemp(tmpl.data());
    path_ = p != nullptr ? p : "/tmp";
  }
  ~ProcessDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline const std::string& TempRoot() {
  static ProcessDir dir;
  return dir.path();
}

// A fresh, empty directory under TempRoot().
inline std::string FreshDir(const std::string& name) {
  const std::string dir = TempRoot() + "/" + name;
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::filesystem::create_directories(dir, ec);
  return dir;
}

inline void Quiet() { spdlog::set_level(spdlog::level::off); }

// Splits "data" at every occurrence of "sep" (no empty-part collapsing).
inline std::vector<std::string_view> Split(std::string_view data, char sep) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  for (;;) {
    const size_t at = data.find(sep, start);
    if (at == std::string_view::npos) {
      parts.push_back(data.substr(start));
      return parts;
    }
    parts.push_back(data.substr(start, at - start));
    start = at + 1;
  }
}

// Connects to 127.0.0.1:port, sends "bytes", half-closes, and reads the
// answer until the server closes or "timeout_ms" of silence. Returns the
// bytes read (at most max_answer), or an empty string if it cannot connect.
inline std::string Exchange(int port, std::string_view bytes, int timeout_ms = 2000,
                            size_t max_answer = 1 << 20) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string answer;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    size_t sent = 0;
    while (sent < bytes.size()) {
      const ssize_t n = send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) break;
      sent += static_cast<size_t>(n);
    }
    shutdown(fd, SHUT_WR);
    char buf[65536];
    for (;;) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, timeout_ms) <= 0) break;
      const ssize_t n = recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) break;
      if (answer.size() < max_answer) answer.append(buf, static_cast<size_t>(n));
    }
  }
  close(fd);
  return answer;
}

}  // namespace flatkv::fuzz
