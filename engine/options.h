// EngineOptions: every knob of the storage engine, with its default inline.
// server/config.cc fills one from the `storage.*` keys of the YAML config; the
// names below match those keys.
#pragma once

#include <cstdint>
#include <limits>
#include <string>

namespace flatkv::engine {

enum class SyncMode {
  kNone,      // writes reach the OS page cache before they return (a killed
              // process loses nothing; an OS crash may lose recent writes)
  kInterval,  // as kNone, plus fdatasync of every written file each sync_interval_ms
  kAlways,    // fdatasync before a write returns; concurrent writers share one
              // fdatasync per data file (group commit)
};

// Parses "none" | "interval" | "always"; returns false on anything else.
bool ParseSyncMode(const std::string& text, SyncMode* mode);
const char* SyncModeName(SyncMode mode);

struct EngineOptions {
  // Directory holding the store; created if missing.
  std::string path = "./data";

  // Keys the store accepts: [key_min, key_max). Anything else is KeyOutOfRange.
  int64_t key_min = 0;
  int64_t key_max = std::numeric_limits<int64_t>::max();

  // Keys per flat table (segment). A segment is created on the first write of
  // a key inside its range, so sparse key spaces cost only the touched ones.
  uint64_t segment_keys = uint64_t{1} << 24;

  // Bytes per index slot, 4..8. The slot holds the record's position plus a
  // record-size hint so a get is always one read: width 4 has no hint and
  // addresses 4 GiB per data file (a get of a record over 4 KiB reads twice);
  // width 5 spends 6 bits (16 GiB per file); widths 6..8 spend 8 bits
  // (1 TiB per file at the default 6).
  int index_item_bytes = 6;

  // Append-only data files per table; key k lives in file (k - kmin) mod N.
  int data_files = 16;

  // Largest value accepted by Put/Append (ValueTooLarge beyond).
  uint32_t max_value_bytes = 64u << 20;

  // Slots of the string-key table (ikey = hash(skey) mod string_slots).
  // Best performance when about the number of string keys stored.
  uint64_t string_slots = uint64_t{1} << 24;

  // Longest string key accepted by SPut (InvalidArgument beyond).
  uint32_t max_key_bytes = 4096;

  // Compaction I/O budget in MB/s of log read (0 = unlimited), so
  // foreground latency stays flat while it runs.
  uint32_t compaction_mb_per_sec = 0;

  // A table is compacted automatically once this share of its log bytes is
  // garbage (overwritten/removed values, tombstones). 0 turns that off;
  // Store::Compact() still works.
  double compaction_garbage_ratio = 0.5;

  // Tables smaller than this are never compacted automatically.
  uint64_t compaction_min_bytes = 1u << 20;

  // The store-wide bound on space: while the log bytes of all open tables
  // exceed this multiple of their live bytes, the compactor compacts the
  // table with the most garbage, then the next, until they are back under
  // it. A compaction needs room for one table's live bytes besides (the new
  // generation), so the disk peaks near this ratio plus the largest table's
  // share of the live data. Should the writes outrun the compactor and the
  // ratio pass this + 0.1 (plus, while a table compacts, its share of the
  // live bytes times its dead bytes, which its switch frees), each write
  // waits (at most 100 ms) for it: the disk stays bounded and the writes
  // slow down instead. 0 turns this rule
  // (and the waits) off, leaving only compaction_garbage_ratio; so does
  // compaction_garbage_ratio 0, which turns all automatic compaction off.
  // Otherwise at least 1.1.
  double compaction_disk_ratio = 1.5;

  // How the automatic policy compacts an integer-key table (storage.
  // compaction_mode): false ("whole") copies the whole table into a new
  // generation; true ("in_place") frees the oldest part of each data file,
  // copying what is live there to the file's end (FlatTable::CleanHead), so
  // the disk stays near compaction_disk_ratio x the live data without room
  // for a second copy of a table. In place is not the default: each round
  // fdatasyncs the table's files before it frees anything, so every write
  // reaches the disk, where a whole compaction deletes an old generation
  // whose latest writes the kernel had not written back yet (README,
  // "Compaction in place"). The string-key table, a table being compacted
  // whole already, one with a record that fails its checksum and
  // Store::Compact() always go whole.
  bool compaction_in_place = false;

  SyncMode sync = SyncMode::kNone;
  uint32_t sync_interval_ms = 1000;

  // Where a write to a segment that has no flat table goes (storage.
  // sparse_tier): false ("off") creates the segment's flat table; true
  // ("on") puts the key in the sparse tier (sparse_tier.h), and the segment
  // becomes a flat table only once its keys are dense enough (Store, "The
  // sparse tier"). Segments that are flat tables already stay so.
  bool sparse_tier = false;

  // Slots of the sparse tier's hashed table (storage.sparse_slots): its
  // keys go to slot hash(key) mod sparse_slots, as string keys do with
  // string_slots. Best near twice the number of keys the tier holds: at
  // one slot a key, over a third of a fill's puts land on a taken slot and
  // rewrite its bucket (the old copy is garbage for a compaction), at two a
  // fifth; fewer make buckets of several keys (each get reads the whole
  // bucket), many more make its compactions copy an index mostly empty.
  // Fixed once the tier exists (a store opened with another value is
  // refused).
  uint64_t sparse_slots = uint64_t{1} << 24;

  // Descriptors the store may keep open for its tables: each open table
  // holds its index (one descriptor and one mapping) and its data files (one
  // each). Tables beyond the budget that no operation used recently are
  // closed (descriptors and mappings released) and reopened on their next
  // use; see Store. At least one table (and the string-key table) always
  // stays open, whatever the budget. flatkv-server lowers it to fit its
  // RLIMIT_NOFILE with room kept for connections.
  uint32_t max_open_files = 4096;

  // How often the index is made durable and the checkpoint advanced, which
  // bounds the log tail replayed after a crash. 0 disables periodic
  // checkpoints (a clean close still writes one).
  uint32_t checkpoint_interval_ms = 10000;
};

}  // namespace flatkv::engine
