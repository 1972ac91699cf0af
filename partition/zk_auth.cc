// ZooKeeper access control of a ring (zk_auth.h).
#include "partition/zk_auth.h"

#include <openssl/evp.h>
#include <sys/stat.h>
#include <zookeeper/zookeeper.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <iterator>
#include <mutex>
#include <vector>

#include "partition/zk_hosts.h"

namespace flatkv::partition {
namespace {

// Bigger than any credentials file worth reading.
constexpr std::streamsize kMaxFileBytes = 4096;

Status ZkFailure(std::string_view what, const std::string& path, int rc) {
  const std::string msg = "zookeeper " + std::string(what) + " " + path + ": " + zerror(rc);
  return rc == ZNOAUTH ? Status::InvalidArgument(msg) : Status::Unavailable(msg);
}

// Anything past READ lets the world change the node, or its ACL. (The
// ZOO_PERM_* constants are `extern const int`, not constant expressions.)
bool WorldWritable(const ACL_vector& acl) {
  const int writes = ZOO_PERM_WRITE | ZOO_PERM_CREATE | ZOO_PERM_DELETE | ZOO_PERM_ADMIN;
  for (int i = 0; i < acl.count; ++i) {
    const ACL& a = acl.data[i];
    if (std::strcmp(a.id.scheme, "world") == 0 && std::strcmp(a.id.id, "anyone") == 0 &&
        (a.perms & writes) != 0) {
      return true;
    }
  }
  return false;
}

// The ACL gives the digest identity "id" every permission. (ZooKeeper shows
// the digest in full to a client that may change the ACL, which a node the
// world may write lets anyone do.)
bool GivesAll(const ACL_vector& acl, const std::string& id) {
  for (int i = 0; i < acl.count; ++i) {
    const ACL& a = acl.data[i];
    if (std::strcmp(a.id.scheme, "digest") == 0 && a.id.id == id &&
        (a.perms & ZOO_PERM_ALL) == ZOO_PERM_ALL) {
      return true;
    }
  }
  return false;
}

// The children of "path"; ZNONODE if it went meanwhile.
int Children(zhandle_t* zh, const std::string& path, std::vector<std::string>* out) {
  String_vector children{};
  const int rc = zoo_get_children(zh, path.c_str(), 0, &children);
  if (rc != ZOK) return rc;
  out->assign(children.data, children.data + children.count);
  deallocate_String_vector(&children);
  return ZOK;
}

std::string Child(const std::string& parent, const std::string& name) {
  return parent == "/" ? "/" + name : parent + "/" + name;
}

}  // namespace

std::string ZkCredentials::DigestId() const {
  const std::string cert = Certificate();
  unsigned char sha[EVP_MAX_MD_SIZE];
  unsigned int sha_len = 0;
  EVP_Digest(cert.data(), cert.size(), sha, &sha_len, EVP_sha1(), nullptr);
  // Base64 of 20 bytes: 28 characters and the NUL EVP_EncodeBlock adds.
  unsigned char b64[4 * ((EVP_MAX_MD_SIZE + 2) / 3) + 1];
  const int b64_len = EVP_EncodeBlock(b64, sha, static_cast<int>(sha_len));
  return user + ":" + std::string(reinterpret_cast<const char*>(b64), static_cast<size_t>(b64_len));
}

Status ReadZkCredentials(const std::string& key, const std::string& path, ZkCredentials* out,
                         bool* open_to_others) {
  const std::string where = key + ": " + path + ": ";
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::InvalidArgument(where + "cannot read (" + std::strerror(errno) + ")");
  std::string text(kMaxFileBytes + 1, '\0');
  in.read(text.data(), kMaxFileBytes + 1);
  if (in.bad()) return Status::InvalidArgument(where + "cannot read (" + std::strerror(errno) + ")");
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > static_cast<size_t>(kMaxFileBytes)) {
    return Status::InvalidArgument(where + "larger than 4096 bytes; expected user:password");
  }
  if (!text.empty() && text.back() == '\n') text.pop_back();
  if (!text.empty() && text.back() == '\r') text.pop_back();
  if (text.empty()) return Status::InvalidArgument(where + "empty; expected user:password");
  if (text.find('\n') != std::string::npos) {
    return Status::InvalidArgument(where + "more than one line; expected user:password");
  }
  const size_t colon = text.find(':');
  if (colon == std::string::npos) {
    return Status::InvalidArgument(where + "no ':'; expected user:password");
  }
  if (colon == 0) return Status::InvalidArgument(where + "empty user; expected user:password");
  struct stat st {};
  *open_to_others = ::stat(path.c_str(), &st) == 0 && (st.st_mode & (S_IRWXG | S_IRWXO)) != 0;
  out->user = text.substr(0, colon);
  out->password = text.substr(colon + 1);
  return Status::OK();
}

// ---- NodeAcl -----------------------------------------------------------

struct NodeAcl::Rep {
  // ACL and Id hold char*: these strings own the bytes.
  std::string digest = "digest";
  std::string id;
  std::string world = "world";
  std::string anyone = "anyone";
  ACL entries[2];
  ACL_vector vector{};
};

NodeAcl::NodeAcl(const ZkCredentials& credentials, bool transitional) {
  if (!credentials.set()) return;
  rep_ = std::make_unique<Rep>();
  rep_->id = credentials.DigestId();
  rep_->entries[0] = ACL{ZOO_PERM_ALL, Id{rep_->digest.data(), rep_->id.data()}};
  rep_->entries[1] = ACL{transitional ? ZOO_PERM_ALL : ZOO_PERM_READ,
                         Id{rep_->world.data(), rep_->anyone.data()}};
  rep_->vector = ACL_vector{2, rep_->entries};
}

NodeAcl::~NodeAcl() = default;

const ACL_vector* NodeAcl::get() const {
  return rep_ ? &rep_->vector : &ZOO_OPEN_ACL_UNSAFE;
}

// ---- calls on a handle ---------------------------------------------------

Status AddAuth(zhandle_t* zh, const ZkCredentials& credentials) {
  if (!credentials.set()) return Status::OK();
  const std::string cert = credentials.Certificate();
  // No completion: a refused authentication shows as the session state
  // ZOO_AUTH_FAILED_STATE, and every later request fails.
  const int rc = zoo_add_auth(zh, "digest", cert.data(), static_cast<int>(cert.size()), nullptr,
                              nullptr);
  if (rc != ZOK) {
    return Status::Unavailable("zookeeper: cannot authenticate as '" + credentials.user +
                               "': " + zerror(rc));
  }
  return Status::OK();
}

Status FindOpenNode(zhandle_t* zh, const std::string& root, const ZkCredentials& credentials,
                    OpenNodes* found) {
  ACL_vector acl{};
  Stat stat{};
  int rc = zoo_get_acl(zh, root.c_str(), &acl, &stat);
  if (rc == ZNONODE) return Status::OK();
  if (rc != ZOK) return ZkFailure("get ACL of", root, rc);
  const bool writable = WorldWritable(acl);
  const bool ours = credentials.set() && GivesAll(acl, credentials.DigestId());
  deallocate_ACL_vector(&acl);
  if (writable && !ours) {
    found->open = root;
    return Status::OK();
  }
  if (writable && found->transitional.empty()) found->transitional = root;
  std::vector<std::string> children;
  rc = Children(zh, root, &children);
  if (rc == ZNONODE) return Status::OK();
  if (rc != ZOK) return ZkFailure("list", root, rc);
  for (const std::string& child : children) {
    FLATKV_RETURN_IF_ERROR(FindOpenNode(zh, Child(root, child), credentials, found));
    if (!found->open.empty()) return Status::OK();
  }
  return Status::OK();
}

Status SecureTree(zhandle_t* zh, const std::string& root, const NodeAcl& acl, int* nodes) {
  int rc = zoo_set_acl(zh, root.c_str(), -1, const_cast<ACL_vector*>(acl.get()));
  if (rc == ZNONODE) return Status::OK();
  if (rc != ZOK) return ZkFailure("set ACL of", root, rc);
  ++*nodes;
  std::vector<std::string> children;
  rc = Children(zh, root, &children);
  if (rc == ZNONODE) return Status::OK();
  if (rc != ZOK) return ZkFailure("list", root, rc);
  for (const std::string& child : children) {
    FLATKV_RETURN_IF_ERROR(SecureTree(zh, Child(root, child), acl, nodes));
  }
  return Status::OK();
}

namespace {

// The client's own log: warnings and errors only (its INFO lines on every
// connect would bury a command's output).
void QuietZkLog(const char* message) {
  if (std::strstr(message, "ZOO_INFO@") != nullptr || std::strstr(message, "ZOO_DEBUG@") != nullptr) {
    return;
  }
  std::fprintf(stderr, "%s\n", message);
}

// Waits for the first session event of a fresh handle.
struct Connect {
  std::mutex mu;
  std::condition_variable cv;
  int state = 0;  // GUARDED_BY(mu)

  static void Watch(zhandle_t*, int type, int state, const char*, void* ctx) {
    if (type != ZOO_SESSION_EVENT) return;
    auto* self = static_cast<Connect*>(ctx);
    std::lock_guard<std::mutex> lock(self->mu);
    self->state = state;
    self->cv.notify_all();
  }
};

}  // namespace

Status SecureRing(const std::string& hosts, const std::string& service_path,
                  const ZkCredentials& credentials, bool transitional, int timeout_ms,
                  int* nodes) {
  *nodes = 0;
  if (!credentials.set()) return Status::InvalidArgument("secure-ring needs credentials");
  Connect connect;
  zhandle_t* zh = zookeeper_init2(ClientHosts(hosts).c_str(), &Connect::Watch,
                                  std::max(timeout_ms, 2000), nullptr, &connect, 0, &QuietZkLog);
  if (zh == nullptr) {
    return Status::InvalidArgument("zookeeper " + hosts + ": " + std::strerror(errno));
  }
  Status s = AddAuth(zh, credentials);
  bool connected = false;
  if (s.ok()) {
    std::unique_lock<std::mutex> lock(connect.mu);
    connected = connect.cv.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                                    [&] { return connect.state == ZOO_CONNECTED_STATE; });
    if (!connected) s = Status::Unavailable("zookeeper " + hosts + ": not connected within " +
                                            std::to_string(timeout_ms) + " ms");
  }
  if (s.ok()) {
    Stat stat{};
    const int rc = zoo_exists(zh, service_path.c_str(), 0, &stat);
    if (rc == ZNONODE) {
      s = Status::NotFound("no ring at " + service_path);
    } else if (rc != ZOK) {
      s = ZkFailure("exists", service_path, rc);
    }
  }
  if (s.ok()) {
    const NodeAcl acl(credentials, transitional);
    s = SecureTree(zh, service_path, acl, nodes);
  }
  zookeeper_close(zh);
  return s;
}

}  // namespace flatkv::partition
