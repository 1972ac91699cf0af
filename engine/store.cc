#include "engine/store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <limits>
#include <utility>

#include <spdlog/spdlog.h>

#include "engine/flat_table.h"
#include "engine/sparse_tier.h"
#include "engine/log_file.h"
#include "engine/string_keys.h"

namespace flatkv::engine {

bool ParseSyncMode(const std::string& text, SyncMode* mode) {
  if (text == "none") {
    *mode = SyncMode::kNone;
  } else if (text == "interval") {
    *mode = SyncMode::kInterval;
  } else if (text == "always") {
    *mode = SyncMode::kAlways;
  } else {
    return false;
  }
  return true;
}

const char* SyncModeName(SyncMode mode) {
  switch (mode) {
    case SyncMode::kNone: return "none";
    case SyncMode::kInterval: return "interval";
    case SyncMode::kAlways: return "always";
  }
  return "?";
}

namespace {

constexpr uint8_t kCursorVersion = 1;
// A log-scan cursor inside the sparse tier: this byte, then the next key.
constexpr uint8_t kSparseCursorVersion = 2;
constexpr size_t kSparseCursorBytes = 1 + 8;
constexpr size_t kCursorBytes = 1 + 8 + 4 + 8 + 8;  // version, segment, file, offset, generation

Status ValidateOptions(const EngineOptions& o) {
  if (o.path.empty()) return Status::InvalidArgument("storage.path: must not be empty");
  if (o.key_min >= o.key_max) {
    return Status::InvalidArgument("storage.key_min: must be less than storage.key_max");
  }
  if (o.segment_keys == 0 || o.segment_keys > (uint64_t{1} << 40)) {
    return Status::InvalidArgument("storage.segment_keys: must be in [1, 2^40]");
  }
  if (o.index_item_bytes < 4 || o.index_item_bytes > 8) {
    return Status::InvalidArgument("storage.index_item_bytes: must be in [4, 8]");
  }
  if (o.data_files < 1 || o.data_files > FlatIndex::kMaxDataFiles) {
    return Status::InvalidArgument("storage.data_files: must be in [1, " +
                                   std::to_string(FlatIndex::kMaxDataFiles) + "]");
  }
  if (o.max_value_bytes > (1u << 30)) {
    return Status::InvalidArgument("storage.max_value_bytes: must be at most 1 GiB");
  }
  if (!(o.compaction_disk_ratio == 0 ||
        (o.compaction_disk_ratio >= 1.1 && o.compaction_disk_ratio <= 1000))) {
    return Status::InvalidArgument("storage.compaction_disk_ratio: must be 0 (off) or in [1.1, 1000]");
  }
  if (o.sync == SyncMode::kInterval && o.sync_interval_ms == 0) {
    return Status::InvalidArgument("storage.sync_interval_ms: must be positive with sync: interval");
  }
  return Status::OK();
}

Status MakeDirs(const std::string& path) {
  std::string partial;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    partial = path.substr(0, pos);
    if (partial.empty()) continue;
    if (mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) {
      return Status::FromErrno("creating " + partial, errno);
    }
  }
  return Status::OK();
}

void PutU64(std::string* s, uint64_t v) { s->append(reinterpret_cast<const char*>(&v), 8); }

// Creates "path" holding "text", durable with its name once this returns.
Status WriteFileDurably(const std::string& path, const std::string& text) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::FromErrno("creating " + path, errno);
  const ssize_t n = ::write(fd, text.data(), text.size());
  if (n != static_cast<ssize_t>(text.size()) || fsync(fd) != 0) {
    const int err = n >= 0 && n != static_cast<ssize_t>(text.size()) ? ENOSPC : errno;
    ::close(fd);
    return Status::FromErrno("writing " + path, err);
  }
  ::close(fd);
  return SyncDirectory(path.substr(0, path.rfind('/')));
}

}  // namespace

Store::Store(const EngineOptions& options)
    : table_budget_(std::max<size_t>(1, options.max_open_files /
                                            (static_cast<size_t>(options.data_files) + 1))),
      options_(options),
      counters_(std::make_unique<EngineCounters>()) {}

Status Store::Open(const EngineOptions& options, std::unique_ptr<Store>* result) {
  FLATKV_RETURN_IF_ERROR(ValidateOptions(options));
  FLATKV_RETURN_IF_ERROR(MakeDirs(options.path));
  std::unique_ptr<Store> store(new Store(options));
  // The bucket filter: reserved whole, backed by memory only where touched
  // (a page of it covers 4096 slots).
  store->filter_bytes_ = options.string_slots;
  void* filter = mmap(nullptr, store->filter_bytes_, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (filter == MAP_FAILED) {
    return Status::FromErrno("reserving the string-key bucket filter (" +
                                 std::to_string(options.string_slots) + " bytes)",
                             errno);
  }
  store->filter_ = static_cast<uint8_t*>(filter);

  DIR* dir = opendir(options.path.c_str());
  if (dir == nullptr) return Status::FromErrno("listing " + options.path, errno);
  std::vector<uint64_t> segments;
  while (dirent* e = readdir(dir)) {
    unsigned long long id;
    char tail;
    if (std::sscanf(e->d_name, "seg-%16llx%c", &id, &tail) == 1 &&
        std::strlen(e->d_name) == 20) {
      segments.push_back(id);
    }
  }
  closedir(dir);
  std::sort(segments.begin(), segments.end());
  {
    std::lock_guard<std::mutex> lock(store->tables_mu_);
    for (uint64_t seg : segments) {
      std::unique_ptr<FlatTable> table;
      // create=true: a segment whose creation was cut short before its META
      // was written holds no data yet and is simply completed. Each table
      // is opened (so recovery runs now), then closed again if the budget
      // is full: no reader exists yet, so it closes at once. A table with an
      // unfinished compaction stays open for the compactor.
      FLATKV_RETURN_IF_ERROR(store->OpenTable(seg, true, &table));
      if (store->open_tables_.load() >= store->table_budget_ &&
          store->pending_.count(seg) == 0) {
        store->NoteClosedLocked(seg, table.get());
        FLATKV_RETURN_IF_ERROR(table->Close());
        table.reset();
      } else {
        store->open_tables_.fetch_add(1);
      }
      store->tables_[seg] = std::move(table);
    }
    store->PublishTablesLocked();
    if (access((options.path + "/strings").c_str(), F_OK) == 0) {
      FLATKV_RETURN_IF_ERROR(store->OpenStringTable(true, &store->strings_owner_));
      store->strings_.store(store->strings_owner_.get(), std::memory_order_release);
      store->open_tables_.fetch_add(1);
    }
  }
  FLATKV_RETURN_IF_ERROR(store->OpenSparseTier());
  if (options.sync == SyncMode::kInterval || options.checkpoint_interval_ms > 0) {
    store->bg_thread_ = std::thread([s = store.get()] { s->BackgroundLoop(); });
  }
  (void)store->PickAutomatic();  // the first write allowance
  store->compactor_thread_ = std::thread([s = store.get()] { s->CompactorLoop(); });
  *result = std::move(store);
  return Status::OK();
}

Store::~Store() {
  Status st = Close();
  if (!st.ok()) spdlog::error("closing store {}: {}", options_.path, st.ToString());
  if (filter_ != nullptr) munmap(filter_, filter_bytes_);
}

std::string Store::SegmentDir(uint64_t segment) const {
  char name[32];
  std::snprintf(name, sizeof(name), "/seg-%016llx", static_cast<unsigned long long>(segment));
  return options_.path + name;
}

TableParams Store::ParamsFor(uint64_t segment) const {
  TableParams p;
  p.dir = HomeDir(segment);
  p.index.item_bytes = options_.index_item_bytes;
  p.index.data_files = options_.data_files;
  p.sync = options_.sync;
  if (segment == kStringsSegment) {
    p.index.kmin = 0;
    p.index.slots = options_.string_slots;
    p.max_value_bytes = 1u << 30;  // a bucket holds many values; each is checked alone
    p.lost_value.emplace();
    AppendBucketDamaged(&*p.lost_value);
    return p;
  }
  const uint64_t start = segment * options_.segment_keys;
  const uint64_t span =
      static_cast<uint64_t>(options_.key_max) - static_cast<uint64_t>(options_.key_min);
  p.index.kmin = static_cast<int64_t>(static_cast<uint64_t>(options_.key_min) + start);
  p.index.slots = start < span ? std::min<uint64_t>(options_.segment_keys, span - start) : 0;
  p.max_value_bytes = options_.max_value_bytes;
  return p;
}

Status Store::OpenTable(uint64_t segment, bool create, std::unique_ptr<FlatTable>* table) {
  const TableParams p = ParamsFor(segment);
  if (p.index.slots == 0) {
    return Status::InvalidArgument(p.dir + " lies outside [storage.key_min, storage.key_max)");
  }
  return OpenHome(segment, p, create, table);
}

void Store::PublishTablesLocked() {
  auto array = std::make_unique<TableArray>();
  for (auto& [seg, table] : tables_) array->push_back({seg, table.get(), generation_[seg]});
  table_array_.store(array.get(), std::memory_order_release);
  arrays_.push_back(std::move(array));
}

std::vector<std::unique_ptr<const Store::TableArray>> Store::RetireArraysLocked() {
  std::vector<std::unique_ptr<const TableArray>> old;
  if (arrays_.size() <= 1) return old;
  old.reserve(arrays_.size() - 1);
  for (size_t i = 0; i + 1 < arrays_.size(); ++i) old.push_back(std::move(arrays_[i]));
  arrays_.erase(arrays_.begin(), arrays_.end() - 1);
  return old;
}

const Store::TableArray& Store::Tables() const {
  static const TableArray kEmpty;
  const TableArray* a = table_array_.load(std::memory_order_acquire);
  return a != nullptr ? *a : kEmpty;
}

int64_t Store::SegmentFirstKey(uint64_t segment) const {
  return static_cast<int64_t>(static_cast<uint64_t>(options_.key_min) +
                              segment * options_.segment_keys);
}

int64_t Store::SegmentLastKey(uint64_t segment) const {
  const TableParams p = ParamsFor(segment);
  return static_cast<int64_t>(static_cast<uint64_t>(p.index.kmin) + p.index.slots - 1);
}

uint64_t Store::SegmentId(int64_t key) const {
  return (static_cast<uint64_t>(key) - static_cast<uint64_t>(options_.key_min)) /
         options_.segment_keys;
}

Status Store::FindTable(int64_t key, FlatTable** table) const {
  const TableArray& tables = Tables();
  const uint64_t seg = SegmentId(key);
  const TableRef* ref = nullptr;
  if (tables.size() == 1) {
    if (tables[0].segment == seg) ref = &tables[0];
  } else {
    auto it = std::lower_bound(tables.begin(), tables.end(), seg,
                               [](const TableRef& r, uint64_t s) { return r.segment < s; });
    if (it != tables.end() && it->segment == seg) ref = &*it;
  }
  *table = nullptr;
  if (ref == nullptr) return Status::OK();  // no such segment
  if (ref->table != nullptr) {
    ref->table->MarkUsed();
    *table = ref->table;
    return Status::OK();
  }
  return OpenSegment(seg, table);  // closed by the budget: reopen
}

Status Store::OpenSegment(uint64_t seg, FlatTable** table) const {
  // Reopening fills a cache; the Store's contents do not change.
  Store* self = const_cast<Store*>(this);
  std::lock_guard<std::mutex> lock(self->tables_mu_);
  return self->OpenSegmentLocked(seg, table);
}

Status Store::OpenSegmentLocked(uint64_t seg, FlatTable** table) {
  *table = nullptr;
  if (closed_.load()) return Status::IOError("store " + options_.path + " is closed");
  auto it = tables_.find(seg);
  if (it == tables_.end()) return Status::OK();
  if (it->second == nullptr) {
    auto closing = idle_closing_.find(seg);
    if (closing != idle_closing_.end()) {
      // CloseIdle unpublished it but has not closed it yet: take it back
      // (CloseIdle closes only what is still in idle_closing_).
      it->second = std::move(closing->second);
      idle_closing_.erase(closing);
    } else {
      std::unique_ptr<FlatTable> reopened;
      FLATKV_RETURN_IF_ERROR(OpenTable(seg, false, &reopened));
      it->second = std::move(reopened);
      if (auto live = closed_live_.find(seg); live != closed_live_.end()) {
        closed_live_total_.fetch_sub(live->second);
        closed_live_.erase(live);
      }
      open_tables_.fetch_add(1);
      counters_->segment_opens.fetch_add(1, std::memory_order_relaxed);
    }
    PublishTablesLocked();
  }
  it->second->MarkUsed();
  *table = it->second.get();
  return Status::OK();
}

Status Store::GetOrCreateTable(int64_t key, FlatTable** table) {
  FLATKV_RETURN_IF_ERROR(FindTable(key, table));
  if (*table != nullptr) return Status::OK();
  std::lock_guard<std::mutex> lock(tables_mu_);
  if (closed_.load()) return Status::IOError("store " + options_.path + " is closed");
  const uint64_t seg = SegmentId(key);
  if (tables_.count(seg) > 0) return OpenSegmentLocked(seg, table);
  std::unique_ptr<FlatTable> created;
  Status st = OpenTable(seg, true, &created);
  if (!st.ok()) {
    // A half-made segment (a full disk) would make the next start-up try
    // to finish it, and fail again: it holds nothing yet, so remove it.
    std::error_code ec;
    std::filesystem::remove_all(SegmentDir(seg), ec);
    return st;
  }
  *table = created.get();
  tables_.emplace(seg, std::move(created));
  open_tables_.fetch_add(1);
  PublishTablesLocked();
  return Status::OK();
}

void Store::NoteClosedLocked(uint64_t seg, const FlatTable* table) {
  const uint64_t total = table->TotalBytes();
  const uint64_t live = total - std::min(total, table->DeadBytes());
  closed_live_total_.fetch_add(live - std::exchange(closed_live_[seg], live));
}

// A CLOCK sweep: tables whose bit is set get a second chance (the bit is
// cleared), the others are unpublished together, readers drain once for all
// of them, and then they close. Closing a batch (down to 7/8 of the budget)
// amortizes the wait for readers over several tables.
void Store::CloseIdle() const {
  Store* self = const_cast<Store*>(this);  // a cache eviction; contents are unchanged
  std::unique_lock<std::mutex> one(self->close_idle_mu_, std::try_to_lock);
  if (!one.owns_lock()) return;  // another thread is closing tables already
  std::vector<uint64_t> victims;
  std::vector<std::unique_ptr<const TableArray>> retired;
  {
    std::lock_guard<std::mutex> lock(self->tables_mu_);
    if (closed_.load()) return;
    const size_t open = open_tables_.load();
    if (open <= table_budget_) return;
    const size_t target = table_budget_ - table_budget_ / 8;
    const size_t want = open - target;
    auto closable = [&](uint64_t seg, const FlatTable* t) {
      return t != nullptr && seg != compacting_ && pending_.count(seg) == 0 &&
             t->successor() == nullptr;
    };
    // Two turns of the hand: the first may only clear bits.
    auto it = self->tables_.lower_bound(clock_hand_);
    for (size_t step = 0; step < 2 * tables_.size() && victims.size() < want; ++step, ++it) {
      if (it == self->tables_.end()) it = self->tables_.begin();
      if (!closable(it->first, it->second.get()) || it->second->TakeUsed()) continue;
      victims.push_back(it->first);
      self->idle_closing_[it->first] = std::move(it->second);
    }
    if (it != self->tables_.end()) self->clock_hand_ = it->first;
    if (victims.empty()) return;
    self->PublishTablesLocked();
    retired = self->RetireArraysLocked();
  }
  SynchronizeReaders();  // nobody holds a pointer to the victims any more
  retired.clear();       // nor to the arrays published before this one
  std::lock_guard<std::mutex> lock(self->tables_mu_);
  for (uint64_t seg : victims) {
    auto it = self->idle_closing_.find(seg);
    if (it == self->idle_closing_.end()) continue;  // taken back by a reader
    self->NoteClosedLocked(seg, it->second.get());
    Status st = it->second->Close();
    if (!st.ok()) spdlog::error("closing idle table {}: {}", it->second->dir(), st.ToString());
    self->idle_closing_.erase(it);
    open_tables_.fetch_sub(1);
    counters_->segment_closes.fetch_add(1, std::memory_order_relaxed);
  }
}

Status Store::CheckKey(int64_t key) const {
  if (closed_.load(std::memory_order_relaxed)) {
    return Status::IOError("store " + options_.path + " is closed");
  }
  if (key < options_.key_min || key >= options_.key_max) {
    return Status::KeyOutOfRange("key " + std::to_string(key) + " is outside [" +
                                 std::to_string(options_.key_min) + ", " +
                                 std::to_string(options_.key_max) + ")");
  }
  return Status::OK();
}

Status Store::CheckValue(size_t size) const {
  if (size > options_.max_value_bytes) {
    return Status::ValueTooLarge("value of " + std::to_string(size) +
                                 " bytes exceeds storage.max_value_bytes " +
                                 std::to_string(options_.max_value_bytes));
  }
  return Status::OK();
}

Status Store::Put(int64_t key, std::string_view value) {
  WaitForCompactor(RecordSize(value.size()));  // before any Guard: it may wait
  return NoteWrite([&]() -> Status {
    CloseIdleAfter close_idle(this);  // after the Guard has ended
    Guard guard(this);
    FLATKV_RETURN_IF_ERROR(CheckKey(key));
    FLATKV_RETURN_IF_ERROR(CheckValue(value.size()));
    return RouteWrite(
        key, true, [&](FlatTable* table) { return table->Put(key, value); },
        [&] { return sparse_->Put(key, value); });
  }());
}

Status Store::RouteWrite(int64_t key, bool create, const std::function<Status(FlatTable*)>& flat,
                         const std::function<Status()>& sparse) {
  FlatTable* table;
  if (sparse_ == nullptr) {
    if (create) {
      FLATKV_RETURN_IF_ERROR(GetOrCreateTable(key, &table));
    } else {
      FLATKV_RETURN_IF_ERROR(FindTable(key, &table));
    }
    return table == nullptr ? sparse() : flat(table);
  }
  FLATKV_RETURN_IF_ERROR(FindTable(key, &table));
  if (table != nullptr) return flat(table);
  {
    std::shared_lock<std::shared_mutex> segment(SegmentMutex(SegmentId(key)));
    FLATKV_RETURN_IF_ERROR(FindTable(key, &table));  // promoted meanwhile?
    if (table != nullptr) return flat(table);
    std::lock_guard<std::mutex> one_key(SparseKeyMutex(key));
    FLATKV_RETURN_IF_ERROR(sparse());
  }
  if (create) MaybePromote(key);
  return Status::OK();
}

Status Store::PutBatch(const std::vector<KeyValueRef>& pairs) {
  uint64_t batch_bytes = 0;
  for (const KeyValueRef& p : pairs) batch_bytes += RecordSize(p.value.size());
  WaitForCompactor(batch_bytes);  // before any Guard: it may wait
  return NoteWrite([&]() -> Status {
    for (const KeyValueRef& p : pairs) {
      FLATKV_RETURN_IF_ERROR(CheckKey(p.key));
      FLATKV_RETURN_IF_ERROR(CheckValue(p.value.size()));
    }
    // Items per segment, in request order; a batch rarely spans many segments.
    std::vector<std::pair<uint64_t, std::vector<uint32_t>>> groups;
    for (uint32_t i = 0; i < pairs.size(); ++i) {
      const uint64_t seg = SegmentId(pairs[i].key);
      auto it = std::find_if(groups.begin(), groups.end(),
                             [&](const auto& g) { return g.first == seg; });
      if (it == groups.end()) it = groups.insert(groups.end(), {seg, {}});
      it->second.push_back(i);
    }
    if (sparse_ != nullptr) {
      // Every segment of the batch stays where it is (flat table or tier)
      // while the batch writes: its stripe is held shared throughout.
      std::vector<size_t> stripes;
      for (const auto& g : groups) {
        stripes.push_back(static_cast<size_t>(&SegmentMutex(g.first) - segment_mu_));
      }
      std::sort(stripes.begin(), stripes.end());
      stripes.erase(std::unique(stripes.begin(), stripes.end()), stripes.end());
      std::vector<std::shared_lock<std::shared_mutex>> held;
      for (size_t i : stripes) held.emplace_back(segment_mu_[i]);
      std::vector<uint32_t> sparse_items;
      std::vector<int64_t> sparse_keys;
      {
        CloseIdleAfter close_idle(this);
        Guard guard(this);
        for (const auto& g : groups) {
          FlatTable* table;
          FLATKV_RETURN_IF_ERROR(FindTable(pairs[g.second[0]].key, &table));
          if (table != nullptr) {
            FLATKV_RETURN_IF_ERROR(table->PutBatch(pairs, g.second));
          } else {
            sparse_items.insert(sparse_items.end(), g.second.begin(), g.second.end());
            sparse_keys.push_back(pairs[g.second[0]].key);
          }
        }
        if (!sparse_items.empty()) {
          std::vector<size_t> key_stripes;
          for (uint32_t i : sparse_items) {
            key_stripes.push_back(static_cast<size_t>(&SparseKeyMutex(pairs[i].key) - sparse_key_mu_));
          }
          std::sort(key_stripes.begin(), key_stripes.end());
          key_stripes.erase(std::unique(key_stripes.begin(), key_stripes.end()), key_stripes.end());
          std::vector<std::unique_lock<std::mutex>> keys_held;
          for (size_t i : key_stripes) keys_held.emplace_back(sparse_key_mu_[i]);
          // In request order: a key given twice keeps its last value.
          std::sort(sparse_items.begin(), sparse_items.end());
          FLATKV_RETURN_IF_ERROR(sparse_->PutBatch(pairs, sparse_items));
        }
      }
      held.clear();
      Guard guard(this);
      for (int64_t key : sparse_keys) MaybePromote(key);
      return Status::OK();
    }
    // A batch over more segments than the open-table budget goes in rounds of
    // at most half the budget, closing idle tables between rounds, so a batch
    // never needs more descriptors than max_open_files allows.
    const size_t round = std::max<size_t>(1, table_budget_ / 2);
    for (size_t first = 0; first < groups.size(); first += round) {
      CloseIdleAfter close_idle(this);
      Guard guard(this);
      const size_t last = std::min(groups.size(), first + round);
      std::vector<FlatTable*> tables(last - first);
      for (size_t g = first; g < last; ++g) {
        FLATKV_RETURN_IF_ERROR(GetOrCreateTable(pairs[groups[g].second[0]].key, &tables[g - first]));
      }
      for (size_t g = first; g < last; ++g) {
        FLATKV_RETURN_IF_ERROR(tables[g - first]->PutBatch(pairs, groups[g].second));
      }
    }
    return Status::OK();
  }());
}

Status Store::Get(int64_t key, std::string* value) const {
  CloseIdleAfter close_idle(this);  // after the Guard has ended
  Guard guard(this);
  FLATKV_RETURN_IF_ERROR(CheckKey(key));
  FlatTable* table;
  FLATKV_RETURN_IF_ERROR(FindTable(key, &table));
  if (table != nullptr) return table->Get(key, value);
  if (sparse_ == nullptr) return Status::NotFound("key " + std::to_string(key));
  std::shared_lock<std::shared_mutex> segment(SegmentMutex(SegmentId(key)));
  FLATKV_RETURN_IF_ERROR(FindTable(key, &table));  // promoted meanwhile?
  if (table != nullptr) return table->Get(key, value);
  return sparse_->Get(key, value);
}

Status Store::Exists(int64_t key) const {
  CloseIdleAfter close_idle(this);  // after the Guard has ended
  Guard guard(this);
  FLATKV_RETURN_IF_ERROR(CheckKey(key));
  FlatTable* table;
  FLATKV_RETURN_IF_ERROR(FindTable(key, &table));
  if (table == nullptr && sparse_ != nullptr) {
    std::shared_lock<std::shared_mutex> segment(SegmentMutex(SegmentId(key)));
    FLATKV_RETURN_IF_ERROR(FindTable(key, &table));
    if (table == nullptr) {
      std::string value;
      return sparse_->Get(key, &value);
    }
  }
  if (table == nullptr || !table->Contains(key)) {
    return Status::NotFound("key " + std::to_string(key));
  }
  return Status::OK();
}

Status Store::Remove(int64_t key, bool* existed) {
  return NoteWrite([&]() -> Status {
    CloseIdleAfter close_idle(this);  // after the Guard has ended
    Guard guard(this);
    FLATKV_RETURN_IF_ERROR(CheckKey(key));
    return RouteWrite(
        key, false, [&](FlatTable* table) { return table->Remove(key, existed); },
        [&]() -> Status {
          if (existed != nullptr) *existed = false;
          if (sparse_ == nullptr) return Status::OK();  // no such segment
          if (existed == nullptr) return sparse_->Delete(key);  // no need to look first
          std::string old;
          Status st = sparse_->Get(key, &old);
          if (st.IsNotFound()) return Status::OK();
          FLATKV_RETURN_IF_ERROR(st);
          FLATKV_RETURN_IF_ERROR(sparse_->Delete(key));
          if (existed != nullptr) *existed = true;
          return Status::OK();
        });
  }());
}

Status Store::Append(int64_t key, std::string_view value) {
  WaitForCompactor(RecordSize(value.size()));  // before any Guard: it may wait
  return NoteWrite([&]() -> Status {
    CloseIdleAfter close_idle(this);  // after the Guard has ended
    Guard guard(this);
    FLATKV_RETURN_IF_ERROR(CheckKey(key));
    FLATKV_RETURN_IF_ERROR(CheckValue(value.size()));
    return RouteWrite(
        key, true, [&](FlatTable* table) { return table->Append(key, value); },
        [&]() -> Status {
          // The tier rewrites the value whole: its keys are few per segment.
          std::string whole;
          Status st = sparse_->Get(key, &whole);
          if (!st.ok() && !st.IsNotFound()) return st;
          if (whole.size() + value.size() > options_.max_value_bytes) {
            return Status::ValueTooLarge("appending to key " + std::to_string(key) +
                                         " would exceed max_value_bytes");
          }
          whole.append(value);
          return sparse_->Put(key, whole);
        });
  }());
}

Status Store::Scan(int64_t from, bool reverse, size_t limit, std::vector<KeyValue>* out,
                   int64_t* next, bool* done) const {
  return Scan(from, reverse, limit, std::numeric_limits<int64_t>::min(),
              std::numeric_limits<int64_t>::max(), out, next, done);
}

Status Store::Scan(int64_t from, bool reverse, size_t limit, int64_t lo, int64_t hi,
                   std::vector<KeyValue>* out, int64_t* next, bool* done,
                   std::vector<int64_t>* corrupt) const {
  out->clear();
  *done = true;
  *next = from;
  if (limit == 0) return Status::InvalidArgument("scan limit must be positive");
  if (lo > hi) return Status::InvalidArgument("scan bounds: lo must not exceed hi");
  if (closed_.load()) return Status::IOError("store " + options_.path + " is closed");
  // The keys that can exist: [key_min, key_max - 1] (key_max > key_min, so
  // neither bound overflows), intersected with [lo, hi].
  lo = std::max(lo, options_.key_min);
  hi = std::min(hi, options_.key_max - 1);
  if (lo > hi) return Status::OK();
  if (!reverse) {
    if (from > hi) return Status::OK();
    from = std::max(from, lo);
  } else {
    if (from < lo) return Status::OK();
    from = std::min(from, hi);
  }
  if (sparse_ == nullptr) return FlatScan(from, reverse, limit, lo, hi, out, next, done, corrupt);
  // Both sides are read with no promotion between them; each side is
  // complete up to its own bound, and the merge up to the nearer one.
  auto segments = LockAllSegments();
  Guard guard(this);
  std::vector<KeyValue> sparse;
  bool sparse_more = false;
  // A tier key whose bucket fails its checksum is skipped and named, as a
  // flat table's bad record is.
  int64_t sparse_resume = 0;
  std::vector<int64_t> sparse_corrupt;
  FLATKV_RETURN_IF_ERROR(sparse_->Collect(from, reverse ? lo : hi, reverse, limit, &sparse,
                                          &sparse_more, &sparse_resume, &sparse_corrupt));
  std::vector<KeyValue> flat;
  int64_t flat_next = from;
  bool flat_done = true;
  std::vector<int64_t> flat_corrupt;
  FLATKV_RETURN_IF_ERROR(
      FlatScan(from, reverse, limit, lo, hi, &flat, &flat_next, &flat_done, &flat_corrupt));
  // Forward: keys at or past "bound" were not looked at by one side;
  // reverse: keys at or below it.
  bool bounded = !flat_done;
  int64_t bound = flat_next;
  if (sparse_more) {
    const int64_t b = sparse_resume;
    if (!bounded || (reverse ? b > bound : b < bound)) bound = b;
    bounded = true;
  }
  auto before = [&](int64_t a, int64_t b) { return reverse ? a > b : a < b; };
  auto inside = [&](int64_t k) { return !bounded || before(k, bound); };
  // A key of the tier inside a segment with a flat table is a stale copy
  // (its promotion could not drop it yet): the table is the truth.
  size_t i = 0;
  size_t j = 0;
  auto skip_stale = [&] {
    while (j < sparse.size() && HasFlatTable(SegmentId(sparse[j].key))) ++j;
  };
  skip_stale();
  bool more = false;
  for (;;) {
    const bool has_flat = i < flat.size() && inside(flat[i].key);
    const bool has_sparse = j < sparse.size() && inside(sparse[j].key);
    if (!has_flat && !has_sparse) break;
    if (out->size() == limit) {
      more = true;
      break;
    }
    if (has_flat && (!has_sparse || !before(sparse[j].key, flat[i].key))) {
      if (has_sparse && sparse[j].key == flat[i].key) {
        ++j;
        skip_stale();
      }
      out->push_back(std::move(flat[i++]));
    } else {
      out->push_back(std::move(sparse[j++]));
      skip_stale();
    }
  }
  if (more) {
    *next = reverse ? out->back().key - 1 : out->back().key + 1;
    *done = false;
  } else if (bounded) {
    *next = bound;
    *done = false;
  }
  // Bad records are named by the call whose range holds them (a later
  // page would meet them again), a stale tier copy's not at all.
  if (corrupt != nullptr) {
    auto covered = [&](int64_t k) { return *done || before(k, *next); };
    for (int64_t k : flat_corrupt) {
      if (covered(k)) corrupt->push_back(k);
    }
    for (int64_t k : sparse_corrupt) {
      if (covered(k) && !HasFlatTable(SegmentId(k))) corrupt->push_back(k);
    }
  }
  return Status::OK();
}

std::vector<std::shared_lock<std::shared_mutex>> Store::LockAllSegments() const {
  std::vector<std::shared_lock<std::shared_mutex>> held;
  held.reserve(kSegmentStripes);
  for (auto& mu : segment_mu_) held.emplace_back(mu);
  return held;
}

bool Store::HasFlatTable(uint64_t seg) const {
  const TableArray& tables = Tables();
  auto it = std::lower_bound(tables.begin(), tables.end(), seg,
                             [](const TableRef& r, uint64_t s) { return r.segment < s; });
  return it != tables.end() && it->segment == seg;
}

Status Store::FlatScan(int64_t from, bool reverse, size_t limit, int64_t lo, int64_t hi,
                       std::vector<KeyValue>* out, int64_t* next, bool* done,
                       std::vector<int64_t>* corrupt) const {
  out->clear();
  *done = true;
  *next = from;
  CloseIdleAfter close_idle(this);  // after the Guard has ended
  Guard guard(this);
  const TableArray& tables = Tables();
  const uint64_t seg = SegmentId(from);
  // One call reopens at most one table closed by the open-table budget: it
  // stops at the next closed one (done = false), so a scan never holds more
  // tables open than the budget allows plus one.
  bool reopened = false;
  auto table_of = [&](const TableRef& ref, FlatTable** t) -> Status {
    *t = ref.table;
    if (*t != nullptr) return Status::OK();
    if (reopened) return Status::OK();
    reopened = true;
    return OpenSegment(ref.segment, t);
  };
  uint64_t work = std::max<uint64_t>(1, scan_work_.load(std::memory_order_relaxed));
  // Each table clamps "from" to its own range, so passing the original one
  // to every table in scan order is right; segments that do not exist cost
  // nothing, and one without a live key costs one unit.
  if (!reverse) {
    const uint64_t last_seg = SegmentId(hi);
    auto it = std::lower_bound(tables.begin(), tables.end(), seg,
                               [](const TableRef& r, uint64_t s) { return r.segment < s; });
    for (; it != tables.end() && it->segment <= last_seg; ++it) {
      FlatTable* table;
      FLATKV_RETURN_IF_ERROR(table_of(*it, &table));
      if (table == nullptr) {
        if (!reopened) continue;  // gone meanwhile (cannot happen: segments stay)
        *next = std::max(from, SegmentFirstKey(it->segment));
        *done = false;
        return Status::OK();
      }
      bool table_done = true;
      FLATKV_RETURN_IF_ERROR(
          table->Scan(from, hi, false, limit, &work, out, next, &table_done, corrupt));
      if (!table_done) {
        *done = false;
        return Status::OK();
      }
    }
  } else {
    const uint64_t first_seg = SegmentId(lo);
    auto it = std::upper_bound(tables.begin(), tables.end(), seg,
                               [](uint64_t s, const TableRef& r) { return s < r.segment; });
    while (it != tables.begin() && std::prev(it)->segment >= first_seg) {
      --it;
      FlatTable* table;
      FLATKV_RETURN_IF_ERROR(table_of(*it, &table));
      if (table == nullptr) {
        if (!reopened) continue;
        *next = std::min(from, SegmentLastKey(it->segment));
        *done = false;
        return Status::OK();
      }
      bool table_done = true;
      FLATKV_RETURN_IF_ERROR(
          table->Scan(from, lo, true, limit, &work, out, next, &table_done, corrupt));
      if (!table_done) {
        *done = false;
        return Status::OK();
      }
    }
  }
  return Status::OK();
}

Status Store::Verify(VerifyReport* report, const std::function<bool()>& keep_going) const {
  *report = VerifyReport();
  constexpr size_t kPage = 1024;
  std::vector<KeyValue> out;
  auto count = [&] {
    report->records += out.size();
    for (const KeyValue& kv : out) report->bytes += kv.value.size();
  };
  // Integer keys: the key-order scan, which skips and names bad records.
  int64_t from = options_.key_min;
  for (bool done = false; !done;) {
    if (keep_going && !keep_going()) return Status::Unavailable("verify stopped");
    int64_t next = from;
    FLATKV_RETURN_IF_ERROR(Scan(from, false, kPage, options_.key_min, options_.key_max - 1, &out,
                                &next, &done, &report->corrupt_keys));
    count();
    from = next;
  }
  // String keys: their buckets, one record each, in slot order.
  Guard guard(this);
  const FlatTable* strings = strings_.load(std::memory_order_acquire);
  if (strings == nullptr) return Status::OK();
  const int64_t last = static_cast<int64_t>(static_cast<uint64_t>(strings->kmin()) +
                                            strings->slots() - 1);
  from = strings->kmin();
  for (bool done = false; !done;) {
    if (keep_going && !keep_going()) return Status::Unavailable("verify stopped");
    out.clear();
    uint64_t work = kScanWork;
    int64_t next = from;
    FLATKV_RETURN_IF_ERROR(strings->Scan(from, last, false, kPage, &work, &out, &next, &done,
                                         &report->corrupt_buckets));
    for (const KeyValue& kv : out) {
      if (BucketDamaged(kv.value)) report->corrupt_buckets.push_back(kv.key);
    }
    count();
    from = next;
  }
  return Status::OK();
}

Status Store::ScanLog(std::string_view cursor, size_t limit, std::vector<KeyValue>* out,
                      std::string* next_cursor, bool* done) const {
  out->clear();
  *done = true;
  if (limit == 0) return Status::InvalidArgument("scan limit must be positive");
  if (closed_.load()) return Status::IOError("store " + options_.path + " is closed");
  if (sparse_ != nullptr &&
      (cursor.empty() || static_cast<uint8_t>(cursor[0]) == kSparseCursorVersion)) {
    return SparseLogScan(cursor, limit, out, next_cursor, done);
  }
  uint64_t seg = 0;
  uint32_t file = 0;
  uint64_t offset = 0;
  uint64_t generation = 0;
  if (!cursor.empty()) {
    if (cursor.size() != kCursorBytes || static_cast<uint8_t>(cursor[0]) != kCursorVersion) {
      return Status::InvalidArgument("malformed log scan cursor (" +
                                     std::to_string(cursor.size()) + " bytes)");
    }
    std::memcpy(&seg, cursor.data() + 1, 8);
    std::memcpy(&file, cursor.data() + 9, 4);
    std::memcpy(&offset, cursor.data() + 13, 8);
    std::memcpy(&generation, cursor.data() + 21, 8);
  }
  CloseIdleAfter close_idle(this);  // after the Guard has ended
  Guard guard(this);
  const TableArray& tables = Tables();
  bool reopened = false;  // at most one closed table reopened per call (see Scan)
  auto it = std::lower_bound(tables.begin(), tables.end(), seg,
                             [](const TableRef& r, uint64_t s) { return r.segment < s; });
  for (; it != tables.end(); ++it) {
    // A later table starts at its beginning; so does the cursor's own table
    // if a compaction replaced its files since (keys may then come twice).
    if (it->segment != seg || it->generation != generation) {
      file = 0;
      offset = 0;
    }

    int next_file = static_cast<int>(file);
    uint64_t next_offset = offset;
    bool table_done = true;
    FlatTable* table = it->table;
    if (table == nullptr && !reopened) {
      reopened = true;
      FLATKV_RETURN_IF_ERROR(OpenSegment(it->segment, &table));
      if (table == nullptr) continue;
    }
    if (table == nullptr) {
      table_done = false;  // resume at this table in the next call
    } else {
      FLATKV_RETURN_IF_ERROR(table->ScanLog(static_cast<int>(file), offset, limit, out,
                                            &next_file, &next_offset, &table_done));
    }
    if (!table_done) {
      next_cursor->clear();
      next_cursor->push_back(static_cast<char>(kCursorVersion));
      PutU64(next_cursor, it->segment);
      const auto f = static_cast<uint32_t>(next_file);
      next_cursor->append(reinterpret_cast<const char*>(&f), 4);
      PutU64(next_cursor, next_offset);
      PutU64(next_cursor, it->generation);
      *done = false;
      return Status::OK();
    }
  }
  next_cursor->clear();
  return Status::OK();
}


// The tier comes first in a log scan: a key promoted while the scan runs
// was either read from the tier already or lands in a table the flat
// phase, which starts at the first segment after it, still reaches.
Status Store::SparseLogScan(std::string_view cursor, size_t limit, std::vector<KeyValue>* out,
                            std::string* next_cursor, bool* done) const {
  int64_t from = options_.key_min;
  if (!cursor.empty()) {
    if (cursor.size() != kSparseCursorBytes) {
      return Status::InvalidArgument("malformed log scan cursor (" +
                                     std::to_string(cursor.size()) + " bytes)");
    }
    std::memcpy(&from, cursor.data() + 1, 8);
  }
  auto segments = LockAllSegments();
  Guard guard(this);
  std::vector<KeyValue> page;
  bool more = false;
  int64_t resume = 0;
  FLATKV_RETURN_IF_ERROR(
      sparse_->Collect(from, options_.key_max - 1, false, limit, &page, &more, &resume));
  for (KeyValue& kv : page) {
    if (!HasFlatTable(SegmentId(kv.key))) out->push_back(std::move(kv));
  }
  next_cursor->clear();
  if (more) {
    next_cursor->push_back(static_cast<char>(kSparseCursorVersion));
    next_cursor->append(reinterpret_cast<const char*>(&resume), 8);
    *done = false;
  } else if (!Tables().empty()) {
    // The flat phase, from its first segment.
    next_cursor->push_back(static_cast<char>(kCursorVersion));
    PutU64(next_cursor, 0);
    const uint32_t file = 0;
    next_cursor->append(reinterpret_cast<const char*>(&file), 4);
    PutU64(next_cursor, 0);
    PutU64(next_cursor, ~uint64_t{0});
    *done = false;
  }
  return Status::OK();
}

Status Store::OpenSparseTier() {
  const std::string dir = options_.path + "/sparse";
  if (!options_.sparse_tier && access(dir.c_str(), F_OK) != 0) return Status::OK();
  const int files = static_cast<int>(std::max<uint32_t>(64, options_.max_open_files / 4));
  FLATKV_RETURN_IF_ERROR(SparseTier::Open(dir, options_, files, &sparse_));
  if (options_.sparse_tier) {
    // A flat table with keys of its range in the tier: a promotion cut
    // short (the tier's keys are the truth) or one that could not drop
    // them (stale copies): PromoteLocked tells them apart by the mark.
    std::vector<uint64_t> segs;
    {
      std::lock_guard<std::mutex> lock(tables_mu_);
      for (const auto& [seg, table] : tables_) segs.push_back(seg);
    }
    for (uint64_t seg : segs) {
      uint64_t n = 0;
      FLATKV_RETURN_IF_ERROR(sparse_->Count(SegmentFirstKey(seg), SegmentLastKey(seg), 1, &n));
      if (n == 0) continue;
      std::unique_lock<std::shared_mutex> lock(SegmentMutex(seg));
      Guard guard(this);
      FlatTable* table;
      FLATKV_RETURN_IF_ERROR(OpenSegment(seg, &table));
      FLATKV_RETURN_IF_ERROR(PromoteLocked(seg, table));
    }
    return Status::OK();
  }
  // The tier is off: every key it holds moves to a flat table, then it goes.
  // Not with a bucket that fails its checksum: its keys are not known, and
  // removing the tier would turn them from errors into absent keys.
  if (sparse_->BadBucketsAtOpen() > 0) {
    return Status::Corruption(
        "sparse tier " + dir + ": " + std::to_string(sparse_->BadBucketsAtOpen()) +
        " bucket(s) fail their checksum, and their keys are not known: turning "
        "storage.sparse_tier off would lose them; open with it on until the keys are "
        "repaired or rewritten (engine.buckets_damaged, flatkv admin verify)");
  }
  for (;;) {
    std::vector<KeyValue> first;
    bool more = false;
    int64_t resume = 0;
    FLATKV_RETURN_IF_ERROR(sparse_->Collect(options_.key_min, options_.key_max - 1, false, 1,
                                            &first, &more, &resume));
    if (first.empty()) break;
    const uint64_t seg = SegmentId(first[0].key);
    std::unique_lock<std::shared_mutex> lock(SegmentMutex(seg));
    Guard guard(this);
    FlatTable* table;
    FLATKV_RETURN_IF_ERROR(OpenSegment(seg, &table));
    FLATKV_RETURN_IF_ERROR(PromoteLocked(seg, table));
  }
  if (sparse_->KeysEstimate() != 0) {
    return Status::Corruption("sparse tier " + dir + ": " +
                              std::to_string(sparse_->KeysEstimate()) +
                              " key(s) listed but not readable; the tier is kept");
  }
  FLATKV_RETURN_IF_ERROR(sparse_->Close());
  sparse_.reset();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (ec) return Status::IOError("removing the emptied sparse tier " + dir + ": " + ec.message());
  spdlog::info("storage.sparse_tier is off: its keys moved to flat tables, {} removed", dir);
  return Status::OK();
}

void Store::MaybePromote(int64_t key) {
  if (sparse_writes_.fetch_add(1, std::memory_order_relaxed) % kPromoteSample != 0) return;
  const int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
  if (now < promote_after_.load(std::memory_order_relaxed)) return;
  const uint64_t seg = SegmentId(key);
  const int64_t first = SegmentFirstKey(seg);
  const int64_t last = SegmentLastKey(seg);
  const uint64_t half = kDenseWindow / 2;
  const int64_t lo = static_cast<uint64_t>(key) - static_cast<uint64_t>(first) > half
                         ? key - static_cast<int64_t>(half)
                         : first;
  const int64_t hi = static_cast<uint64_t>(last) - static_cast<uint64_t>(key) > half - 1
                         ? key + static_cast<int64_t>(half - 1)
                         : last;
  // The folded count: this runs every kPromoteSample writes, and an exact
  // count would fold the tier's pending writes each time. A segment that
  // has just become dense is promoted at a later check.
  if (sparse_->CountFolded(lo, hi, kDenseKeys) < kDenseKeys) return;
  std::unique_lock<std::shared_mutex> lock(SegmentMutex(seg));
  FlatTable* table = nullptr;
  if (!FindTable(key, &table).ok() || table != nullptr) return;  // promoted meanwhile
  Status st = PromoteLocked(seg, nullptr);
  if (!st.ok()) {
    spdlog::warn("promoting segment {} from the sparse tier: {} (its keys stay there)", seg,
                 st.ToString());
    if (st.IsNoSpace()) {
      const auto after = std::chrono::steady_clock::now() + kNoSpaceBackoff;
      promote_after_.store(after.time_since_epoch().count(), std::memory_order_relaxed);
    }
  }
}

Status Store::CopySparseKeys(uint64_t seg, FlatTable* table) {
  constexpr size_t kPage = 1024;
  const int64_t last = SegmentLastKey(seg);
  int64_t from = SegmentFirstKey(seg);
  for (;;) {
    std::vector<KeyValue> page;
    bool more = false;
    int64_t resume = 0;
    FLATKV_RETURN_IF_ERROR(sparse_->Collect(from, last, false, kPage, &page, &more, &resume));
    std::vector<KeyValueRef> refs;
    std::vector<uint32_t> items;
    refs.reserve(page.size());
    items.reserve(page.size());
    for (uint32_t i = 0; i < page.size(); ++i) {
      refs.push_back(KeyValueRef{page[i].key, page[i].value});
      items.push_back(i);
    }
    if (!refs.empty()) FLATKV_RETURN_IF_ERROR(table->PutBatch(refs, items));
    if (!more) break;
    from = resume;
  }
  return table->Sync();
}

Status Store::PromoteLocked(uint64_t seg, FlatTable* table) {
  const int64_t first = SegmentFirstKey(seg);
  const int64_t last = SegmentLastKey(seg);
  const std::string mark = HomeDir(seg) + "/" + kMovedMark;
  if (table != nullptr && access(mark.c_str(), F_OK) == 0) {
    return sparse_->DeleteRange(first, last);  // stale copies of a finished move
  }
  std::unique_ptr<FlatTable> created;
  if (table == nullptr) {
    std::lock_guard<std::mutex> lock(tables_mu_);
    if (closed_.load()) return Status::IOError("store " + options_.path + " is closed");
    Status st = OpenTable(seg, true, &created);
    if (!st.ok()) {
      std::error_code ec;
      std::filesystem::remove_all(SegmentDir(seg), ec);
      return st;
    }
    table = created.get();
  }
  Status st = CopySparseKeys(seg, table);
  MaybeKillAt(1);
  if (st.ok()) {
    // The mark is durable before the table takes a write of its own: from
    // then on the tier's copies of the segment are stale.
    st = WriteFileDurably(mark, "moved from the sparse tier\n");
  }
  if (!st.ok()) {
    if (created != nullptr) {
      (void)created->Close();
      created.reset();
      std::error_code ec;
      std::filesystem::remove_all(SegmentDir(seg), ec);
    }
    return st;
  }
  MaybeKillAt(2);
  if (created != nullptr) {
    std::lock_guard<std::mutex> lock(tables_mu_);
    tables_.emplace(seg, std::move(created));
    open_tables_.fetch_add(1);
    PublishTablesLocked();
  }
  MaybeKillAt(3);
  promotions_.fetch_add(1, std::memory_order_relaxed);
  if (test_kill_stage_.load(std::memory_order_relaxed) == 4) {
    return Status::IOError("the sparse tier's copies of segment " + std::to_string(seg) +
                           " were kept (test)");
  }
  return sparse_->DeleteRange(first, last);
}

void Store::MaybeKillAt(int stage) const {
  if (test_kill_stage_.load(std::memory_order_relaxed) == stage) raise(SIGKILL);
}

// ---------------------------------------------------------------------------
// String keys

Status Store::OpenStringTable(bool create, std::unique_ptr<FlatTable>* table) {
  return OpenHome(kStringsSegment, ParamsFor(kStringsSegment), create, table);
}

Status Store::GetOrCreateStringTable(FlatTable** table) {
  *table = strings_.load(std::memory_order_acquire);
  if (*table != nullptr) return Status::OK();
  std::lock_guard<std::mutex> lock(tables_mu_);
  if (closed_.load()) return Status::IOError("store " + options_.path + " is closed");
  if (strings_owner_ == nullptr) {
    Status st = OpenStringTable(true, &strings_owner_);
    if (!st.ok()) {
      std::error_code ec;  // as for a half-made segment (GetOrCreateTable)
      std::filesystem::remove_all(options_.path + "/strings", ec);
      return st;
    }
    strings_.store(strings_owner_.get(), std::memory_order_release);
    open_tables_.fetch_add(1);
  }
  *table = strings_owner_.get();
  return Status::OK();
}

int64_t Store::StringSlot(std::string_view key) const {
  return static_cast<int64_t>(SlotOfHash(HashStringKey(key)));
}

bool Store::FilterSaysAbsent(uint8_t filter, uint64_t hash) {
  return (filter & kFilterKnown) && !(filter & BucketFilterBit(hash));
}

void Store::FilterBeforeWrite(uint64_t slot, uint8_t bits) {
  const uint8_t f = FilterLoad(slot);
  FilterStore(slot, (f & kFilterKnown) ? static_cast<uint8_t>(f | bits) : kFilterBlocked);
}

void Store::FilterLearn(uint64_t slot, uint8_t exact) const {
  exact = KnownOrBlocked(exact);
  uint8_t expected = 0;
  // Fails if a writer came first: what this get read may be stale now.
  std::atomic_ref<uint8_t>(filter_[slot]).compare_exchange_strong(
      expected, exact, std::memory_order_acq_rel, std::memory_order_relaxed);
}

Status Store::AppendToBucket(FlatTable* table, int64_t ikey, std::string_view entry) {
  FlatTable::AppendInfo info;
  // Append reads the bucket too (its newest record's part list; the whole
  // value when a compaction must move it first): a bad record found there
  // makes a damaged bucket like one found by the read before, and the write
  // is kept: the Corruption must not go back to the caller, for a chain
  // member applying a replicated sput would stop (exit 3).
  Status appended = table->Append(ikey, entry, &info);
  if (appended.IsCorruption()) return MarkDamaged(table, ikey, entry, appended);
  FLATKV_RETURN_IF_ERROR(appended);
  // Rewrite when the appends since the last whole write outgrow it, or when
  // Append's part merging has just folded everything into one record (that
  // happens after about half the base's size was appended): either way at
  // least a constant share of the bucket arrived since the last rewrite.
  const bool folded = info.base == info.total && info.total > kSmallBucket;
  if (!folded && info.total <= 2 * info.base + 4096) return Status::OK();
  // Rewrite with the live entries only: this happens after at least "base"
  // bytes of appends, so each byte is rewritten O(1) times on average.
  std::string bucket;
  Status st = table->Get(ikey, &bucket);
  if (st.IsCorruption()) return MarkDamaged(table, ikey, entry, st);
  FLATKV_RETURN_IF_ERROR(st);
  const std::string compacted = CompactBucket(bucket);
  st = compacted.empty() ? table->Remove(ikey, nullptr) : table->Put(ikey, compacted);
  if (st.ok()) FilterStore(static_cast<uint64_t>(ikey), KnownOrBlocked(BucketFilter(compacted)));
  return st;
}

Status Store::MarkDamaged(FlatTable* table, int64_t ikey, std::string_view entry,
                          const Status& bad) {
  // The bucket's other entries are lost here; the write is not: it starts
  // a new record after a damaged mark, so the keys it does not name read
  // as Corruption (not as absent) until the bucket is written whole again.
  damaged_buckets_.fetch_add(1, std::memory_order_relaxed);
  // Its lost keys are unknown from now on, not absent.
  FilterStore(static_cast<uint64_t>(ikey), kFilterBlocked);
  spdlog::error("string-key bucket {}: {}; rewritten with a damaged mark and the new entry "
                "(its other keys read as bad until repaired)", ikey, bad.message());
  std::string bucket;
  AppendBucketDamaged(&bucket);
  // What survives: the entries appended after the bad part (a put acked
  // after the damage, before any read found it, is not lost).
  std::string suffix;
  if (table->ReadGoodSuffix(ikey, &suffix).ok()) bucket += suffix;
  bucket.append(entry);
  return table->Put(ikey, CompactBucket(bucket));
}

Status Store::CheckStringKey(std::string_view key) const {
  if (closed_.load(std::memory_order_relaxed)) {
    return Status::IOError("store " + options_.path + " is closed");
  }
  if (key.size() > options_.max_key_bytes) {
    return Status::InvalidArgument("string key of " + std::to_string(key.size()) +
                                   " bytes exceeds storage.max_key_bytes " +
                                   std::to_string(options_.max_key_bytes));
  }
  return Status::OK();
}

Status Store::SPut(std::string_view key, std::string_view value, bool* replaced) {
  if (replaced != nullptr) *replaced = false;
  WaitForCompactor(RecordSize(key.size() + value.size()));  // before any Guard: it may wait
  return NoteWrite([&]() -> Status {
    Guard guard(this);
    FLATKV_RETURN_IF_ERROR(CheckStringKey(key));
    FLATKV_RETURN_IF_ERROR(CheckValue(value.size()));
    FlatTable* table;
    FLATKV_RETURN_IF_ERROR(GetOrCreateStringTable(&table));
    const uint64_t hash = HashStringKey(key);
    const int64_t ikey = static_cast<int64_t>(SlotOfHash(hash));
    const auto slot = static_cast<uint64_t>(ikey);
    // Reused by the thread, as the buckets below are: a put allocates
    // nothing once warm. A large value does not pin its memory there.
    thread_local std::string entry;
    struct Release {
      ~Release() {
        if (entry.capacity() > (1u << 20)) std::string().swap(entry);
      }
    } release;
    entry.clear();
    AppendBucketPut(&entry, key, value);
    std::lock_guard<std::mutex> lock(string_mu_[slot % kStringStripes]);
    FilterBeforeWrite(slot, BucketFilterBit(hash));
    // A small bucket (the common case: about one key per slot) is rewritten
    // whole, so it stays one record and a get stays one read. Larger ones take
    // appended entries (amortized O(entry) bytes per put, whatever the size).
    // "Small" = a few entries' worth, so a rewrite costs a few times the entry.
    const size_t limit = std::min<size_t>(4 * entry.size() + 256, 64u << 10);
    thread_local std::string bucket, rewritten;
    bool small = false;
    Status st = table->ReadIfSmall(ikey, limit, &bucket, &small);
    if (st.IsNotFound()) {
      st = table->Put(ikey, entry);
      if (st.ok()) FilterStore(slot, kFilterKnown | BucketFilterBit(hash));
      return st;
    }
    if (st.IsCorruption()) return MarkDamaged(table, ikey, entry, st);
    FLATKV_RETURN_IF_ERROR(st);
    if (small) {
      // Almost always compact already (this path writes it so): one pass.
      bool found = false;
      if (!PutInCompactBucket(bucket, key, value, &rewritten, &found)) {
        bucket += entry;
        rewritten = CompactBucket(bucket);
      }
      Status put = table->Put(ikey, rewritten);
      if (put.ok() && replaced != nullptr) *replaced = found;
      // A known filter has the key's bit already; an unknown one (blocked
      // above) is learnt here, where the whole bucket is at hand.
      if (put.ok() && !(FilterLoad(slot) & kFilterKnown)) {
        FilterStore(slot, KnownOrBlocked(BucketFilter(rewritten)));
      }
      // A large value put beside a small bucket should not pin its memory
      // in the thread (the bucket read itself is at most 64 KiB).
      if (rewritten.capacity() > (1u << 20)) std::string().swap(rewritten);
      return put;
    }
    return AppendToBucket(table, ikey, entry);
  }());
}

namespace {

Status UnknownInBucket(int64_t slot) {
  return Status::Corruption("string key: its bucket (slot " + std::to_string(slot) +
                            " of the string-key table) lost entries to a bad record and is "
                            "not repaired yet (flatkv admin verify repairs it from the chain)");
}

// SGet's answer from the bucket of "slot".
Status AnswerFromBucket(std::string_view bucket, std::string_view key, std::string* value,
                        int64_t slot) {
  switch (FindInBucket(bucket, key, value)) {
    case BucketLookup::kFound:
      return Status::OK();
    case BucketLookup::kAbsent:
      return Status::NotFound("string key");
    case BucketLookup::kUnknown:
      break;
  }
  return UnknownInBucket(slot);
}

}  // namespace

Status Store::SGet(std::string_view key, std::string* value) const {
  Guard guard(this);
  if (closed_.load(std::memory_order_relaxed)) {
    return Status::IOError("store " + options_.path + " is closed");
  }
  FlatTable* table = strings_.load(std::memory_order_acquire);
  if (table == nullptr || key.size() > options_.max_key_bytes) {
    return Status::NotFound("string key");
  }
  const uint64_t hash = HashStringKey(key);
  const int64_t slot = static_cast<int64_t>(SlotOfHash(hash));
  const uint8_t filter = FilterLoad(static_cast<uint64_t>(slot));
  if (FilterSaysAbsent(filter, hash)) {
    filter_skips_.fetch_add(1, std::memory_order_relaxed);
    return Status::NotFound("string key");
  }
  thread_local std::string bucket;  // a get allocates nothing once warm
  Status st = table->Get(slot, &bucket);
  if (st.IsNotFound()) {
    if (filter == 0) FilterLearn(static_cast<uint64_t>(slot), kFilterKnown);
    return Status::NotFound("string key");
  }
  FLATKV_RETURN_IF_ERROR(st);
  if (filter == 0) FilterLearn(static_cast<uint64_t>(slot), BucketFilter(bucket));
  st = AnswerFromBucket(bucket, key, value, slot);
  // A huge bucket read once should not pin its memory in the thread.
  if (bucket.capacity() > (1u << 20)) std::string().swap(bucket);
  return st;
}

Status Store::SRemove(std::string_view key, bool* existed) {
  return NoteWrite([&]() -> Status {
    Guard guard(this);
    if (existed != nullptr) *existed = false;
    if (closed_.load(std::memory_order_relaxed)) {
      return Status::IOError("store " + options_.path + " is closed");
    }
    FlatTable* table = strings_.load(std::memory_order_acquire);
    if (table == nullptr || key.size() > options_.max_key_bytes) return Status::OK();
    const uint64_t hash = HashStringKey(key);
    const int64_t ikey = static_cast<int64_t>(SlotOfHash(hash));
    const auto slot = static_cast<uint64_t>(ikey);
    std::lock_guard<std::mutex> lock(string_mu_[slot % kStringStripes]);
    if (FilterSaysAbsent(FilterLoad(slot), hash)) {
      filter_skips_.fetch_add(1, std::memory_order_relaxed);
      return Status::OK();
    }
    std::string ignored;
    std::string entry;
    AppendBucketRemove(&entry, key);
    // Nothing to add; blocks gets from filling in an unknown filter while
    // this remove may write.
    FilterBeforeWrite(slot, 0);
    // A small bucket (the common case) is rewritten whole without the key,
    // as SPut does: it stays one record (a get stays one read, the
    // compactor copies it verbatim) and its filter loses the key's bit.
    // Before, every remove from a shared bucket appended a remove entry
    // (an append chain until the next whole write).
    thread_local std::string bucket, rewritten;
    struct Release {  // a huge bucket read the general way is not kept
      ~Release() {
        if (bucket.capacity() > (1u << 20)) std::string().swap(bucket);
      }
    } release;
    bool small = false;
    Status st = table->ReadIfSmall(ikey, kSmallBucket, &bucket, &small);
    if (st.ok() && small) {
      bool found = false;
      if (RemoveFromCompactBucket(bucket, key, &rewritten, &found)) {
        if (found) {
          st = rewritten.empty() ? table->Remove(ikey, nullptr) : table->Put(ikey, rewritten);
          FLATKV_RETURN_IF_ERROR(st);
          if (existed != nullptr) *existed = true;
        }
        FilterStore(slot, KnownOrBlocked(BucketFilter(found ? rewritten : bucket)));
        return Status::OK();
      }
      // Damaged or not compact: the general way below, with the bucket
      // ReadIfSmall read whole (what Get would have read).
    } else if (st.ok()) {
      st = table->Get(ikey, &bucket);
    }
    if (st.IsNotFound()) {
      FilterStore(slot, kFilterKnown);
      return Status::OK();
    }
    if (st.IsCorruption()) return MarkDamaged(table, ikey, entry, st);
    FLATKV_RETURN_IF_ERROR(st);
    const BucketLookup found = FindInBucket(bucket, key, &ignored);
    if (found == BucketLookup::kAbsent) {
      FilterStore(slot, KnownOrBlocked(BucketFilter(bucket)));  // the stripe holds it still
      return Status::OK();
    }
    // Present, or unknown in a damaged bucket: a remove entry makes it absent.
    if (found == BucketLookup::kFound && LiveBucketEntries(bucket).size() == 1 &&
        !BucketDamaged(bucket)) {
      FLATKV_RETURN_IF_ERROR(table->Remove(ikey, nullptr));  // its last key: drop the bucket
      FilterStore(slot, kFilterKnown);
    } else {
      // The key's bit stays (other keys may share it) until the bucket is
      // next written whole.
      FLATKV_RETURN_IF_ERROR(AppendToBucket(table, ikey, entry));
    }
    if (existed != nullptr) *existed = found == BucketLookup::kFound;
    return Status::OK();
  }());
}

Status Store::SReadBucket(int64_t slot, std::vector<StringKeyValue>* live) const {
  live->clear();
  Guard guard(this);
  if (closed_.load(std::memory_order_relaxed)) {
    return Status::IOError("store " + options_.path + " is closed");
  }
  if (slot < 0 || static_cast<uint64_t>(slot) >= options_.string_slots) {
    return Status::InvalidArgument("string-key slot " + std::to_string(slot) + " outside [0, " +
                                   std::to_string(options_.string_slots) + ")");
  }
  FlatTable* table = strings_.load(std::memory_order_acquire);
  if (table == nullptr) return Status::OK();
  std::string bucket;
  Status st = table->Get(slot, &bucket);
  if (st.IsNotFound()) return Status::OK();
  FLATKV_RETURN_IF_ERROR(st);
  if (BucketDamaged(bucket)) return UnknownInBucket(slot);
  for (auto& [k, v] : LiveBucketEntries(bucket)) live->push_back({std::move(k), std::move(v)});
  return Status::OK();
}

Status Store::SWriteBucket(int64_t slot, const std::vector<StringKeyValue>& live) {
  if (slot < 0 || static_cast<uint64_t>(slot) >= options_.string_slots) {
    return Status::InvalidArgument("string-key slot " + std::to_string(slot) + " outside [0, " +
                                   std::to_string(options_.string_slots) + ")");
  }
  std::string bucket;
  for (const StringKeyValue& kv : live) {
    FLATKV_RETURN_IF_ERROR(CheckStringKey(kv.key));
    FLATKV_RETURN_IF_ERROR(CheckValue(kv.value.size()));
    if (StringSlot(kv.key) != slot) {
      return Status::InvalidArgument("string key of " + std::to_string(kv.key.size()) +
                                     " bytes is not in slot " + std::to_string(slot));
    }
    AppendBucketPut(&bucket, kv.key, kv.value);
  }
  bucket = CompactBucket(bucket);  // one entry per key, the last given wins
  WaitForCompactor(RecordSize(bucket.size()));
  return NoteWrite([&]() -> Status {
    Guard guard(this);
    if (closed_.load(std::memory_order_relaxed)) {
      return Status::IOError("store " + options_.path + " is closed");
    }
    FlatTable* table;
    FLATKV_RETURN_IF_ERROR(GetOrCreateStringTable(&table));
    const auto s = static_cast<uint64_t>(slot);
    std::lock_guard<std::mutex> lock(string_mu_[s % kStringStripes]);
    const uint8_t exact = BucketFilter(bucket);  // a whole compact bucket: known
    FilterBeforeWrite(s, exact);
    Status st = bucket.empty() ? table->Remove(slot, nullptr) : table->Put(slot, bucket);
    if (st.ok()) FilterStore(s, exact);
    return st;
  }());
}

Status Store::SScan(std::string_view cursor, size_t limit, std::vector<StringKeyValue>* out,
                    std::string* next_cursor, bool* done, std::vector<int64_t>* corrupt) const {
  // Cursor: version u8 | next bucket u64 | has_last u8 | last key emitted.
  out->clear();
  *done = true;
  if (limit == 0) return Status::InvalidArgument("scan limit must be positive");
  uint64_t from = 0;
  bool has_last = false;
  std::string_view last;
  if (!cursor.empty()) {
    if (cursor.size() < 10 || static_cast<uint8_t>(cursor[0]) != kCursorVersion) {
      return Status::InvalidArgument("malformed string scan cursor");
    }
    std::memcpy(&from, cursor.data() + 1, 8);
    has_last = cursor[9] != 0;
    last = cursor.substr(10);
  }
  Guard guard(this);
  FlatTable* table = strings_.load(std::memory_order_acquire);
  if (table == nullptr) return Status::OK();
  auto make_cursor = [&](uint64_t bucket, const std::string* last_key) {
    next_cursor->clear();
    next_cursor->push_back(static_cast<char>(kCursorVersion));
    PutU64(next_cursor, bucket);
    next_cursor->push_back(last_key != nullptr ? 1 : 0);
    if (last_key != nullptr) next_cursor->append(*last_key);
    *done = false;
  };
  std::vector<KeyValue> buckets;
  while (from < options_.string_slots) {
    buckets.clear();
    int64_t next = 0;
    bool table_done = true;
    uint64_t work = kScanWork;
    FLATKV_RETURN_IF_ERROR(table->Scan(static_cast<int64_t>(from),
                                       static_cast<int64_t>(options_.string_slots - 1), false, 16,
                                       &work, &buckets, &next, &table_done, corrupt));
    for (const KeyValue& b : buckets) {
      const auto ikey = static_cast<uint64_t>(b.key);
      if (corrupt != nullptr && (!has_last || ikey != from) && BucketDamaged(b.value)) {
        corrupt->push_back(b.key);
      }
      bool emitted_here = false;
      for (auto& [k, v] : LiveBucketEntries(b.value)) {
        if (has_last && ikey == from && k <= last) continue;
        if (out->size() == limit) {
          make_cursor(ikey, emitted_here ? &out->back().key : nullptr);
          return Status::OK();
        }
        out->push_back({std::move(k), std::move(v)});
        emitted_here = true;
      }
      has_last = false;
    }
    if (table_done) break;
    from = static_cast<uint64_t>(next);
  }
  return Status::OK();
}

Status Store::Sync() {
  Guard guard(this);
  // A closed table was made durable when it closed.
  for (const TableRef& t : Tables()) {
    if (t.table != nullptr) FLATKV_RETURN_IF_ERROR(t.table->Sync());
  }
  if (FlatTable* s = strings_.load(std::memory_order_acquire)) FLATKV_RETURN_IF_ERROR(s->Sync());
  if (sparse_ != nullptr) FLATKV_RETURN_IF_ERROR(sparse_->Sync());
  return Status::OK();
}

Status Store::Checkpoint() {
  Guard guard(this);
  for (const TableRef& t : Tables()) {
    if (t.table != nullptr) FLATKV_RETURN_IF_ERROR(t.table->Checkpoint());
  }
  if (FlatTable* s = strings_.load(std::memory_order_acquire)) {
    FLATKV_RETURN_IF_ERROR(s->Checkpoint());
  }
  if (sparse_ != nullptr) FLATKV_RETURN_IF_ERROR(sparse_->Checkpoint());
  return Status::OK();
}

// Without wakeup preemption: a compaction's removal of a table's files
// waits for one discard per freed extent on a file system mounted with
// "discard", and each completion woke the compactor ahead of the I/O
// thread it shares a core with (about 800 forced switches a second under
// overwrites). Best effort: a refusal leaves the thread as it was.
void Store::RunAsBackground() {
  sched_param param{};
  (void)sched_setscheduler(static_cast<pid_t>(gettid()), SCHED_BATCH, &param);
}

void Store::BackgroundLoop() {
  RunAsBackground();
  using Clock = std::chrono::steady_clock;
  const auto sync_every = std::chrono::milliseconds(options_.sync_interval_ms);
  const auto checkpoint_every = std::chrono::milliseconds(options_.checkpoint_interval_ms);
  const bool interval = options_.sync == SyncMode::kInterval;
  auto next_sync = Clock::now() + sync_every;
  auto next_checkpoint = Clock::now() + checkpoint_every;
  std::unique_lock<std::mutex> lock(bg_mu_);
  while (!closing_) {
    auto wake = options_.checkpoint_interval_ms > 0 ? next_checkpoint : Clock::time_point::max();
    if (interval) wake = std::min(wake, next_sync);
    bg_cv_.wait_until(lock, wake, [this] { return closing_; });
    if (closing_) break;
    lock.unlock();
    const auto now = Clock::now();
    if (interval && now >= next_sync) {
      Status st = Sync();
      if (!st.ok()) spdlog::error("periodic sync: {}", st.ToString());
      next_sync = now + sync_every;
    }
    if (options_.checkpoint_interval_ms > 0 && now >= next_checkpoint) {
      Status st = Checkpoint();
      if (!st.ok()) spdlog::error("periodic checkpoint: {}", st.ToString());
      next_checkpoint = now + checkpoint_every;
    }
    lock.lock();
  }
}

Status Store::Close() {
  {
    std::lock_guard<std::mutex> lock(bg_mu_);
    closing_ = true;
  }
  {
    std::lock_guard<std::mutex> lock(compact_mu_);  // the compactor waits on this
    stopping_.store(true);
  }
  bg_cv_.notify_all();
  compact_cv_.notify_all();
  if (compactor_thread_.joinable()) compactor_thread_.join();
  if (bg_thread_.joinable()) bg_thread_.join();
  std::lock_guard<std::mutex> lock(tables_mu_);
  if (closed_.exchange(true)) return Status::OK();
  Status result;
  for (auto* map : {&tables_, &idle_closing_}) {
    for (auto& [seg, table] : *map) {
      if (table == nullptr) continue;  // closed by the open-table budget
      Status st = table->Close();
      if (!st.ok() && result.ok()) result = st;
    }
  }
  if (strings_owner_ != nullptr) {
    Status st = strings_owner_->Close();
    if (!st.ok() && result.ok()) result = st;
  }
  for (auto& [seg, table] : pending_) {  // an unfinished compaction resumes on open
    Status st = table->Close();
    if (!st.ok() && result.ok()) result = st;
  }
  if (sparse_ != nullptr) {
    Status st = sparse_->Close();
    if (!st.ok() && result.ok()) result = st;
  }
  return result;
}

uint64_t Store::LiveBytesEstimate() const {
  Guard guard(this);
  uint64_t live = 0;
  auto add = [&](const FlatTable* t) {
    const uint64_t total = t->TotalBytes();
    live += total - std::min(total, t->DeadBytes());
  };
  // Closed tables count with the live bytes they had when they closed (a
  // table being closed right now may be missed: it is an estimate).
  for (const TableRef& ref : Tables()) {
    if (ref.table != nullptr) add(ref.table);
  }
  live += closed_live_total_.load();
  if (const FlatTable* strings = strings_.load(std::memory_order_acquire)) add(strings);
  if (sparse_ != nullptr && !closed_.load()) live += sparse_->LiveBytes();
  return live;
}

uint64_t Store::LiveBytesEstimate(int64_t lo, int64_t hi, double string_share) const {
  // The share of segment "seg"'s key span inside [lo, hi].
  auto share = [&](uint64_t seg) -> long double {
    const int64_t first = SegmentFirstKey(seg);
    const int64_t last = SegmentLastKey(seg);
    const int64_t a = std::max(lo, first);
    const int64_t b = std::min(hi, last);
    if (a > b) return 0;
    return (static_cast<long double>(b) - a + 1) / (static_cast<long double>(last) - first + 1);
  };
  long double live = 0;
  {
    std::lock_guard<std::mutex> lock(tables_mu_);
    for (const auto& [seg, bytes] : closed_live_) live += share(seg) * bytes;
  }
  Guard guard(this);
  auto live_of = [](const FlatTable* t) {
    const uint64_t total = t->TotalBytes();
    return static_cast<long double>(total - std::min(total, t->DeadBytes()));
  };
  constexpr uint64_t kBudget = uint64_t{1} << 22;  // slots looked at per table, at most
  for (const TableRef& ref : Tables()) {
    const FlatTable* t = ref.table;
    if (t == nullptr || share(ref.segment) == 0) continue;
    const uint64_t keys = t->LiveKeys();
    if (keys == 0) continue;
    live += live_of(t) * std::min<long double>(1, static_cast<long double>(
                                                      t->LiveKeysIn(lo, hi, kBudget)) / keys);
  }
  if (const FlatTable* strings = strings_.load(std::memory_order_acquire)) {
    live += std::clamp(static_cast<long double>(string_share), 0.0L, 1.0L) * live_of(strings);
  }
  if (sparse_ != nullptr && !closed_.load()) live += sparse_->LiveBytes(lo, hi);
  return static_cast<uint64_t>(live);
}

uint64_t Store::WriteProgress() const {
  return counters_->bytes_appended.load() + sparse_writes_.load();
}

Status Store::NoteWrite(Status st) const {
  if (st.ok()) {
    // Cleared only by a write that appended (a remove of an absent key
    // writes nothing and proves no room).
    // A nearly full disk takes some writes (into space a data file had
    // reserved) and refuses others: cleared only a second after the last
    // refusal, so the state does not flap under load.
    if (counters_->disk_full.load(std::memory_order_relaxed) &&
        WriteProgress() != counters_->appended_when_full.load() &&
        NowMicros() - counters_->no_space_at_us.load() >= 1000000 &&
        counters_->disk_full.exchange(false)) {
      spdlog::info("{}: writes succeed again (the disk has room)", options_.path);
    }
  } else if (st.IsNoSpace()) {
    counters_->no_space_errors.fetch_add(1, std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> lock(counters_->no_space_mu);
      counters_->no_space_reason = st.message();
    }
    counters_->appended_when_full.store(WriteProgress());
    const uint64_t now = NowMicros();
    counters_->no_space_at_us.store(now);
    // Logged when the state begins, at most every 10 s.
    if (!counters_->disk_full.exchange(true) &&
        now - counters_->no_space_logged_us.exchange(now) >= 10000000) {
      spdlog::error("{}; writes fail until space is freed (reads go on)", st.ToString());
    }
  }
  return st;
}

std::string Store::DiskFull() const {
  if (!counters_->disk_full.load(std::memory_order_relaxed)) return "";
  std::lock_guard<std::mutex> lock(counters_->no_space_mu);
  return counters_->no_space_reason;
}

EngineStats Store::GetStats() const {
  Guard guard(this);  // Tables(): arrays are freed once their readers drain
  EngineStats s;
  s.no_space_errors = counters_->no_space_errors.load();
  s.disk_full = counters_->disk_full.load() ? 1 : 0;
  s.segments = Tables().size();
  s.segments_open = open_tables_.load();
  s.segment_opens = counters_->segment_opens.load();
  s.segment_closes = counters_->segment_closes.load();
  s.data_files_open = counters_->data_files_open.load();
  s.bytes_appended = counters_->bytes_appended.load();
  s.fdatasyncs = counters_->fdatasyncs.load();
  s.recovery_bytes_scanned = counters_->recovery_bytes_scanned.load();
  s.recovery_records = counters_->recovery_records.load();
  s.corrupt_records = counters_->corrupt_records.load();
  s.buckets_damaged = damaged_buckets_.load();
  s.string_filter_skips = filter_skips_.load();
  s.index_rebuilds = counters_->index_rebuilds.load();
  s.scan_slots_visited = counters_->scan_slots_visited.load();
  s.scan_regions_skipped = counters_->scan_regions_skipped.load();
  s.write_stalls = counters_->write_stalls.load();
  s.write_stall_us = counters_->write_stall_us.load();
  if (sparse_ != nullptr && !closed_.load()) {
    s.sparse_keys = sparse_->KeysEstimate();
    // The tier's own table: its appends, syncs, recovery and bad records
    // are the store's (its full-disk errors reach NoteWrite already).
    const EngineStats t = sparse_->Stats();
    s.bytes_appended += t.bytes_appended;
    s.fdatasyncs += t.fdatasyncs;
    s.recovery_bytes_scanned += t.recovery_bytes_scanned;
    s.recovery_records += t.recovery_records;
    s.corrupt_records += t.corrupt_records;
    s.buckets_damaged += t.buckets_damaged;
    s.index_rebuilds += t.index_rebuilds;
    s.write_stalls += t.write_stalls;
    s.write_stall_us += t.write_stall_us;
  }
  s.sparse_promotions = promotions_.load();
  return s;
}

}  // namespace flatkv::engine
