// ZooKeeper access control of a ring (shared/DESIGN.md, "Security").
//
// With cluster.zookeeper_auth_file set, an instance authenticates every
// ZooKeeper session with the digest scheme ("user:password", zoo_add_auth)
// and creates every node under its service path with the ACL
//
//   digest:<user>:<base64(sha1(user:password))>  ALL
//   world:anyone                                 READ
//
// so clients (RingClient, `flatkv --zk`) keep reading the ring without
// credentials while only the ring's instances may create, delete or change
// a node. A ring made before that (every node open to the world) is
// protected in place by SecureRing() (`flatkv admin secure-ring`).
//
// Between the two, a transitional ACL ("that identity: all; anyone: all",
// `admin secure-ring --transitional`) lets instances that run without
// credentials keep writing the ring while the others restart with them: an
// instance with credentials runs on such a node (and warns) but refuses a
// node the world may write whose ACL does not name its identity.
//
// The digest scheme sends "user:password" in clear to ZooKeeper: protect
// the link itself (its own network, or a TLS tunnel). Nothing here logs the
// password.
//
// Thread safety: ZkCredentials and NodeAcl are plain values once built; the
// functions taking a zhandle_t make synchronous calls on it and may run on
// any thread but the handle's completion thread.
#pragma once

#include <memory>
#include <string>

#include "engine/status.h"

// The ZooKeeper C client's types (zookeeper/zookeeper.h), so that users of
// this header need not see the client.
typedef struct _zhandle zhandle_t;
struct ACL_vector;

namespace flatkv::partition {

// Digest credentials: the content of cluster.zookeeper_auth_file.
struct ZkCredentials {
  std::string user;
  std::string password;

  // False when unset: nodes are created open to the world, as before.
  bool set() const { return !user.empty(); }
  // "user:password", the certificate zoo_add_auth takes for "digest".
  std::string Certificate() const { return user + ":" + password; }
  // "user:base64(sha1(user:password))", the id of ZooKeeper's digest ACLs.
  std::string DigestId() const;
};

// Reads "path": one line "user:password" (a trailing newline or CRLF is
// stripped; the password may hold ':'). On success fills *out and sets
// *open_to_others when the group or others may read or write the file (the
// caller warns). Returns InvalidArgument beginning with "key: path: " for a
// missing or unreadable file, an empty one, one of several lines, one
// without ':', or an empty user. The message never holds the password.
Status ReadZkCredentials(const std::string& key, const std::string& path, ZkCredentials* out,
                         bool* open_to_others);

// The ACL FlatKV creates its nodes with: the one above with credentials,
// ZooKeeper's OPEN_ACL_UNSAFE without. "transitional": the identity all
// and anyone all (credentials required).
class NodeAcl {
 public:
  explicit NodeAcl(const ZkCredentials& credentials, bool transitional = false);
  ~NodeAcl();
  NodeAcl(const NodeAcl&) = delete;
  NodeAcl& operator=(const NodeAcl&) = delete;

  // For zoo_create and friends; valid as long as this object.
  const ACL_vector* get() const;

 private:
  struct Rep;
  std::unique_ptr<Rep> rep_;
};

// Queues the digest authentication on "zh" (a new handle: the client sends
// it on every (re)connection of the session, before any later request).
// Does nothing without credentials. Returns Unavailable if the client
// refused to queue it.
Status AddAuth(zhandle_t* zh, const ZkCredentials& credentials);

// Nodes the world may write (world:anyone has more than read: write,
// create, delete or change the ACL), as FindOpenNode reports them.
struct OpenNodes {
  std::string open;          // the first whose ACL does not give "credentials" all; "" if none
  std::string transitional;  // the first whose ACL does; "" if none
};

// Walks "root" and everything under it, parents before children, and
// fills *found (the walk stops at the first open node). A node deleted
// during the walk is skipped. Unavailable on a ZooKeeper failure,
// InvalidArgument if ZooKeeper refuses to show an ACL (NOAUTH).
Status FindOpenNode(zhandle_t* zh, const std::string& root, const ZkCredentials& credentials,
                    OpenNodes* found);

// Sets "acl" on "root" and on every node under it, ephemeral ones
// included: each node before its children are listed, so a child created
// meanwhile is either listed or was created under the new ACL. A node
// deleted during the walk is skipped. *nodes counts the nodes set.
// InvalidArgument naming the node if ZooKeeper refuses (NOAUTH: the
// credentials are not the ones the ring was secured with); Unavailable on
// other ZooKeeper failures (running it again is safe).
Status SecureTree(zhandle_t* zh, const std::string& root, const NodeAcl& acl, int* nodes);

// `flatkv admin secure-ring [--transitional]`: connects to "hosts" (within
// "timeout_ms"), authenticates with "credentials" and runs SecureTree on
// "service_path" with NodeAcl(credentials, transitional). NotFound if the
// service path does not exist; otherwise as SecureTree. Idempotent.
Status SecureRing(const std::string& hosts, const std::string& service_path,
                  const ZkCredentials& credentials, bool transitional, int timeout_ms,
                  int* nodes);

}  // namespace flatkv::partition
