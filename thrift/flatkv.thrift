// The wire contract of FlatKV (shared/DESIGN.md, "Service contract"). Binary
// protocol, framed transport, service FlatKV. Field ids and enum values are
// forever: add, never renumber or reuse. C++ is generated into the build tree
// (thrift --gen cpp:no_skeleton,moveable_types); Python with thrift --gen py,
// Java and Go by client/examples/. Field names are not on the wire, but they
// are identifiers in every generated language: no parameter may be called
// `ctx` (Thrift 0.17's Go code passes a context.Context named ctx first and
// would not compile).

namespace cpp flatkv.rpc
namespace py flatkv
namespace java flatkv.rpc
namespace go flatkv

// Why a call failed. Not found is not an error (GetResult.found = false).
enum ErrorCode {
  KEY_OUT_OF_RANGE = 0,  // outside [storage.key_min, storage.key_max)
  VALUE_TOO_LARGE = 1,   // over storage.max_value_bytes (or the frame limit)
  INVALID_ARGUMENT = 2,  // e.g. a string key over storage.max_key_bytes, a bad cursor
  STORAGE_ERROR = 3,     // the engine failed: I/O error, full disk, corruption
  NOT_OWNER = 4,         // the key belongs to another partition (cluster mode)
  UNAUTHORIZED = 5,      // admin method without the right admin.token
  OVERLOADED = 6,        // the worker queue is full: retry later
  UNAVAILABLE = 7,       // shutting down, or the partition has no serving member
}

enum WriteMode {
  SAFE = 1,   // a write reaches the engine before it is acknowledged
  ASYNC = 2,  // a write is acknowledged from the cache and flushed later
}

exception KvError {
  1: ErrorCode code,
  2: string message,
}

struct GetResult {
  1: bool found,
  2: binary value,
  // multiGet only: this key's record could not be read (found = false):
  // its error, while every other key of the batch is answered. A single
  // get throws KvError instead.
  3: optional ErrorCode errorCode,
  4: optional string errorMessage,
}

struct KvPair {
  1: i64 key,
  2: binary value,
}

struct ScanResult {
  1: list<KvPair> pairs,
  2: bool done,     // nothing follows
  3: i64 nextKey,   // pass as fromKey to resume
}

struct LogScanResult {
  1: list<KvPair> pairs,
  2: bool done,
  3: binary cursor,  // pass back to resume; empty starts
}

struct CompactionStatus {
  1: bool running,
  2: double percent,
  3: i64 bytesDone,
  4: i64 bytesTotal,
  5: i64 tablesCompacted,
  6: i64 bytesReclaimed,
  7: string lastError,
}

struct NodeInfo {
  1: string version,
  2: i64 mark,           // ring position (cluster mode; 0 standalone)
  3: i64 keyMin,
  4: i64 keyMax,
  5: string role,        // standalone | single | head | middle | tail | syncing | fenced
  6: WriteMode writeMode,
  7: i64 uptimeSeconds,
}

// One instance of a ring.
struct Member {
  1: string host,
  2: i32 port,
}

// The instances of one mark, ordered into a chain: head first. Empty when
// no member serves the mark.
struct Partition {
  1: i64 mark,
  2: list<Member> chain,
}

// The ring as the instance called sees it (shared/DESIGN.md, "Cluster").
// mark Ni owns hashes [N(i-1), Ni); the first mark also owns hashes >= the
// last mark and < itself. A standalone instance answers one partition of
// mark 0 holding itself.
struct RingInfo {
  1: i64 version,        // grows with every change of the ring or a chain
  2: i64 hashBound,      // string key hash = XXH64(key, seed 0) mod hashBound
  3: string replication, // sync | async
  4: list<Partition> partitions,  // by mark, ascending
  // The ring change in progress (<service_path>/.cluster/change's JSON:
  // adding or removing a mark), if any.
  5: optional string change,
}

// Carried by every call between instances (never by a client).
struct PeerContext {
  1: required string token,     // cluster.peer_token ("" when none is set)
  2: required i64 ringVersion,  // the sender's ring version
  3: required i64 mark,         // the mark the sender routed the call to
  // peerGet only: read this member's own copy, whatever its role, and
  // answer STORAGE_ERROR for a bad record instead of repairing it (read
  // repair asks the other members of the chain with it).
  4: optional bool ownCopy = false,
}

// Chain replication between the members of one mark (partition/chain.h;
// server/replicator.h). A replicated write is a list of idempotent
// assignments: an append travels as the put of its result, so replaying a
// write a member already holds changes nothing.
// SBUCKET (read repair of string keys): the string keys whose hash mod
// "slots" is "key" are exactly the pairs of "value" (a bucket of puts,
// engine/string_keys.h). A member whose storage.string_slots is "slots"
// writes that bucket whole; another one holds the same pairs already (only
// a member with a damaged bucket needs it) and skips it. Builds without
// SBUCKET refuse it (unknown op kind).
enum ChainOpKind { PUT = 0, REMOVE = 1, SPUT = 2, SREMOVE = 3, SBUCKET = 4 }
struct ChainOp {
  1: required ChainOpKind kind,
  2: optional i64 key,      // PUT, REMOVE; SBUCKET: the slot
  3: optional binary skey,  // SPUT, SREMOVE
  4: optional binary value, // PUT, SPUT, SBUCKET
  5: optional i64 slots,    // SBUCKET
}
struct ChainOps {
  1: required list<ChainOp> ops,
}
struct ChainEntry {
  1: required i64 seq,
  2: required i64 epoch,
  3: required list<i64> keys,  // hashes of the keys it touches
  4: required binary ops,      // a ChainOps, binary protocol: forwarded as it came
}
// partition::ChainMessage on the wire.
enum ChainKind { REPLICATE = 0, ACK = 1, SYNC_REQUEST = 2, SYNC_REFUSED = 3, COMMIT = 4 }
struct ChainFrame {
  1: required ChainKind kind,
  2: required i64 chain,
  3: required list<ChainEntry> entries,
  4: required i64 applied,
  5: required i64 committed,
  6: required i64 floor,
  7: required i64 positionEpoch,
  8: required i64 positionSeq,
  9: optional bool direct = false,  // ACK: the tail sent this commit point to the head too
}
struct StringKvPair {
  1: required binary key,
  2: required binary value,
}
// One page of a snapshot stream (the tail's store copied to a joiner).
// The first page has first = true and names the position the joiner
// resumes after; the last has last = true.
struct SnapshotPage {
  1: required i64 token,   // 0 on the first page; then what the first answered
  2: required bool first,
  3: required bool last,
  4: required i64 atEpoch,
  5: required i64 atSeq,
  6: required list<KvPair> pairs,
  7: required list<StringKvPair> spairs,
  // The sender's estimate of the whole stream's bytes (for progress).
  8: optional i64 totalBytes,
  // On the last page: the sender's position once it had read its whole
  // store (the copy may hold any write up to there). Absent: atEpoch/atSeq.
  9: optional i64 endEpoch,
  10: optional i64 endSeq,
}
// One page of a hash range exported by a member (peerExport): integer keys
// in key order, then string keys (in bucket order) whose hash lies in the
// range.
struct ExportPage {
  1: required list<KvPair> pairs,
  2: required list<StringKvPair> spairs,
  3: required bool done,       // nothing follows
  4: required binary cursor,   // pass back to resume; empty starts
  // On the first page (empty cursor): the exporter's estimate of the
  // range's live bytes (for progress in percent).
  5: optional i64 totalBytes,
}
// peerTrack's answer: names one record at one head (its address, a number
// drawn when its process started, the change's czxid).
struct TrackToken {
  1: required string head,
  2: required i64 nonce,
  3: required i64 czxid,
}
// One page of peerDelta: the recorded keys with what the head holds now.
struct DeltaPage {
  1: required bool continuous,     // false: no record for this token (reason says why)
  2: required string reason,
  3: required list<KvPair> pairs,          // recorded integer keys present
  4: required list<i64> removed,           // recorded integer keys absent
  5: required list<StringKvPair> spairs,   // recorded string keys present
  6: required list<binary> sremoved,       // recorded string keys absent
  7: required bool done,
  8: required binary cursor,       // pass back to resume; empty starts
  9: required i64 recorded,        // keys in the whole record
}
// flatkv admin digest: what a member holds, order-independent.
struct Digest {
  1: required i64 keys,        // live integer keys
  2: required i64 stringKeys,  // live string keys
  3: required string digest,   // hex: XOR over keys of XXH64(key, value)
  4: required i64 appliedEpoch,  // chain position (0, 0 standalone)
  5: required i64 appliedSeq,
}

// flatkv admin verify: every live record of a member read back and its
// checksum checked.
struct VerifyResult {
  1: required i64 records,    // live records read (string-key buckets count one each)
  2: required i64 bytes,      // their value bytes
  3: required i64 corrupt,    // records failing their checksum
  4: required i64 repaired,   // of those, rewritten through the chain from another member
  5: required list<string> problems,  // the first 100: file, offset, key, and the outcome
}
// flatkv admin backup: progress of the current (or last) online backup.
struct BackupStatus {
  1: required bool running,
  2: required double percent,       // of bytesTotal; 100 once complete
  3: required i64 bytesDone,        // key and value bytes copied
  4: required i64 bytesTotal,       // the store's live bytes at the start (an estimate)
  5: required i64 keysDone,
  6: required i64 corruptSkipped,   // records skipped for a bad checksum
  7: required string path,          // the backup's directory (on the server's machine)
  8: required bool complete,        // the last backup finished: path holds it
  9: required string lastError,     // empty unless the last backup failed
}

// Every argument is "required": a call whose argument is missing or of the
// wrong type is answered with a TApplicationException naming the method
// (PROTOCOL_ERROR) instead of running with a default value. The wire format
// is the same as without it.
service FlatKV {
  GetResult get(1: required i64 key) throws (1: KvError err),
  void put(1: required i64 key, 2: required binary value) throws (1: KvError err),
  // True if the key existed.
  bool remove(1: required i64 key) throws (1: KvError err),
  // Appends bytes; creates the key if absent.
  void append(1: required i64 key, 2: required binary value) throws (1: KvError err),
  // Results in request order.
  list<GetResult> multiGet(1: required list<i64> keys) throws (1: KvError err),
  void multiPut(1: required list<KvPair> pairs) throws (1: KvError err),
  // Key order from fromKey: ascending (keys >= fromKey), or with reverse
  // descending (keys <= fromKey).
  ScanResult scan(1: required i64 fromKey, 2: required i32 limit, 3: required bool reverse) throws (1: KvError err),
  // Log order: segment by segment, each data file in write order, live
  // records only (not one global insertion order); an empty cursor starts.
  LogScanResult scanLog(1: required binary cursor, 2: required i32 limit) throws (1: KvError err),

  GetResult sget(1: required binary key) throws (1: KvError err),
  void sput(1: required binary key, 2: required binary value) throws (1: KvError err),
  bool sremove(1: required binary key) throws (1: KvError err),

  // Admin methods: token = admin.token when one is configured.
  void setWriteMode(1: required string token, 2: required WriteMode mode) throws (1: KvError err),
  WriteMode getWriteMode() throws (1: KvError err),
  void compact(1: required string token) throws (1: KvError err),
  CompactionStatus compactionStatus() throws (1: KvError err),

  NodeInfo info() throws (1: KvError err),
  map<string, i64> stats() throws (1: KvError err),
  RingInfo ring() throws (1: KvError err),

  // Calls between instances: a call forwarded by the instance a client
  // called to the partition that owns the key. They are served only by a
  // member of peer.mark that owns the key in its own ring, and never
  // forwarded again: anything else is NOT_OWNER (the sender re-reads the
  // ring and retries once). A wrong peer.token is UNAUTHORIZED.
  GetResult peerGet(1: required PeerContext peer, 2: required i64 key) throws (1: KvError err),
  void peerPut(1: required PeerContext peer, 2: required i64 key, 3: required binary value) throws (1: KvError err),
  bool peerRemove(1: required PeerContext peer, 2: required i64 key) throws (1: KvError err),
  void peerAppend(1: required PeerContext peer, 2: required i64 key, 3: required binary value) throws (1: KvError err),
  list<GetResult> peerMultiGet(1: required PeerContext peer, 2: required list<i64> keys) throws (1: KvError err),
  void peerMultiPut(1: required PeerContext peer, 2: required list<KvPair> pairs) throws (1: KvError err),
  // Key order within the hash range [lo, hi] (inclusive), which peer.mark
  // owns whole; otherwise as scan.
  ScanResult peerScan(1: required PeerContext peer, 2: required i64 fromKey, 3: required i32 limit, 4: required bool reverse, 5: required i64 lo, 6: required i64 hi) throws (1: KvError err),
  // Log order over this partition's store, as scanLog (a cursor of
  // scanLog's standalone form).
  LogScanResult peerScanLog(1: required PeerContext peer, 2: required binary cursor, 3: required i32 limit) throws (1: KvError err),
  GetResult peerSGet(1: required PeerContext peer, 2: required binary key) throws (1: KvError err),
  void peerSPut(1: required PeerContext peer, 2: required binary key, 3: required binary value) throws (1: KvError err),
  bool peerSRemove(1: required PeerContext peer, 2: required binary key) throws (1: KvError err),

  // Chain replication: one message from member "sender" (host:port) of
  // peer.mark to this member. Oneway: nothing answers it; its effects
  // (acks, resends) travel as calls of their own, and a frame that is
  // refused (another mark, a wrong token, malformed) is dropped, counted in
  // errors.peerChain and logged by the receiver (the sender resends what
  // was not acknowledged). While the receiver is behind it reads no more
  // frames from the connection until it has caught up, so TCP holds the
  // sender back.
  oneway void peerChain(1: required PeerContext peer, 2: required string sender, 3: required ChainFrame frame),
  // A page of the snapshot stream from "sender"; returns the stream's token.
  // NOT_OWNER (not expected from "sender", or replaced by a later stream):
  // the sender stops.
  i64 peerSnapshot(1: required PeerContext peer, 2: required string sender, 3: required SnapshotPage page) throws (1: KvError err),

  // Admin: this member's digest (admin.token when one is configured).
  Digest digest(1: required string token) throws (1: KvError err),
  // Read repair: served by the head of peer.mark's chain for a member whose
  // copy of "key" fails its checksum. The head rewrites the key through the
  // chain with its newest value (its own copy, a write not yet committed,
  // or another member's copy) and answers that value once the chain has
  // acknowledged the rewrite.
  GetResult peerRepair(1: required PeerContext peer, 2: required i64 key) throws (1: KvError err),
  // Read repair of string keys, by bucket: the live pairs (a bucket of puts,
  // engine/string_keys.h) of the string keys whose hash mod "slots" is
  // "slot". With repair, served by the head of peer.mark's chain, which
  // rewrites that bucket through the chain (SBUCKET) from its own copy (or,
  // if that is bad, another member's with the writes not yet committed on
  // top) and answers once the chain acknowledged it; without, this
  // member's own copy (STORAGE_ERROR if it is bad, INVALID_ARGUMENT if its
  // storage.string_slots differs).
  binary peerBucket(1: required PeerContext peer, 2: required i64 slots, 3: required i64 slot, 4: required bool repair) throws (1: KvError err),
  // The records of this member's store whose hash lies in [lo, hi]
  // (inclusive; peer.mark must own all of it): for a new mark that takes the
  // range over. At most "limit" records per page (fewer, even none, with
  // done = false: a page's work is bounded).
  ExportPage peerExport(1: required PeerContext peer, 2: required i64 lo, 3: required i64 hi, 4: required binary cursor, 5: required i32 limit) throws (1: KvError err),
  // A ring change (.cluster/change) moving keys from peer.mark to a new
  // mark, served by the head of peer.mark. peerFence: re-reads the ring and
  // answers once every write this mark accepted before it saw the change is
  // committed; from then on the change's ranges hold still here (writes to
  // them are UNAVAILABLE) until the new mark serves them.
  void peerFence(1: required PeerContext peer) throws (1: KvError err),
  // Once the new mark serves [lo, hi] (this mark no longer owns any of it):
  // removes up to "limit" keys this mark still holds there, through its
  // chain, and returns how many (0: none left). Limit 0, to any member of
  // the mark: re-reads the ring and answers 0 once this member's view no
  // longer gives it any of [lo, hi], so it serves none of it from then on
  // (INVALID_ARGUMENT while the view still does).
  i64 peerDrop(1: required PeerContext peer, 2: required i64 lo, 3: required i64 hi, 4: required i32 limit) throws (1: KvError err),
  // A ring change in state precopy (czxid), served by the head of
  // peer.mark: from now on this head records the keys written to the
  // change's ranges (writes still flow), and answers once every write it
  // sequenced before is committed. A second call replaces the record.
  TrackToken peerTrack(1: required PeerContext peer, 2: required i64 czxid) throws (1: KvError err),
  // After peerFence: the keys recorded since peerTrack gave "token", with
  // their values here now (absent: removed), in pages of at most "limit"
  // keys. continuous = false if this head has no complete record for it
  // (another head or process, or the record overflowed): copy everything.
  DeltaPage peerDelta(1: required PeerContext peer, 2: required TrackToken token, 3: required binary cursor, 4: required i32 limit) throws (1: KvError err),
  // Admin (any ring member): removes "mark" from the ring: its keys move to
  // the next mark up, then its members stop serving and exit. Returns once
  // the change is recorded (.cluster/change); it runs in the background.
  // OVERLOADED while another ring change runs.
  void removeMark(1: required string token, 2: required i64 mark) throws (1: KvError err),
  // Admin (any ring member): rolls back the ring change in progress while
  // it still copies (nothing registered yet): the source takes writes to
  // the ranges again. INVALID_ARGUMENT past that point (it finishes by
  // itself); stop the importer first, or it starts the change over.
  void abortChange(1: required string token) throws (1: KvError err),
  // Admin: reads back every live record of this member and checks it;
  // with repair, a ring member rewrites each
  // bad integer key from its chain (as a read would).
  VerifyResult verify(1: required string token, 2: required bool repair) throws (1: KvError err),
  // Admin: starts an online backup of this instance's store into dir (an
  // absolute path on the server's machine that does not exist yet) at most
  // mbPerSec MB/s (0 = unlimited) and returns at once; backupStatus() shows
  // progress. The backup holds every write acknowledged before the call,
  // maybe later ones, never a torn value, and a standalone flatkv-server
  // with storage.path = dir opens it at once. INVALID_ARGUMENT for a bad
  // dir, OVERLOADED while a backup runs.
  void backup(1: required string token, 2: required string dir, 3: required i32 mbPerSec) throws (1: KvError err),
  BackupStatus backupStatus() throws (1: KvError err),
}
