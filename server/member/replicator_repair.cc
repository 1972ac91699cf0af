// Repair: the head's rewrite of a key (or a string-key bucket) that some
// member holds damaged, from the copy the caller fetched.
#include <map>

#include <spdlog/spdlog.h>

#include "engine/string_keys.h"
#include "server/member/replicator.h"
#include "server/member/replicator_internal.h"

namespace flatkv::server {
namespace {

using partition::ChainOutput;

}  // namespace

std::string Replicator::head() const {
  std::lock_guard<std::mutex> lock(mu_);
  const std::vector<std::string>& members = member_->members();
  return members.empty() ? "" : members.front();
}

Status Replicator::RepairRounds(const std::function<Status()>& fetch, const RewriteFn& rewrite) {
  for (int round = 0; round < 2; ++round) {
    const bool fetched = round == 1;
    if (fetched) FLATKV_RETURN_IF_ERROR(fetch());
    // Shared with the loop's event: a caller that stopped waiting leaves it.
    auto need_copy = std::make_shared<bool>(false);
    // Serial, as an append: the store holds every write sequenced before it.
    Status st = Wait(
        [&](WriteDone done) {
          Sequence(
              true, "repair",
              [rewrite, fetched, need_copy](uint64_t request, int64_t now, ChainOutput* out) {
                *need_copy = rewrite(fetched, request, now, out);
              },
              std::move(done));
        },
        nullptr);
    FLATKV_RETURN_IF_ERROR(st);
    if (!*need_copy) {
      repairs_.fetch_add(1, std::memory_order_relaxed);
      return Status::OK();
    }
  }
  return Status::Corruption("no good copy to repair from");
}

Status Replicator::Repair(int64_t key, const std::function<Status(rpc::GetResult*)>& fetch,
                          rpc::GetResult* result) {
  struct State {
    rpc::GetResult copy;   // another member's, once fetched
    rpc::GetResult value;  // what the rewrite writes
  };
  auto state = std::make_shared<State>();
  Status st = RepairRounds(
      [&] { return fetch(&state->copy); },
      [this, key, state](bool fetched, uint64_t request, int64_t now, ChainOutput* out) {
        std::string value;
        Status got = cache_->Get(key, &value);
        if (!got.ok() && !got.IsNotFound() && !got.IsCorruption()) {
          out->replies.push_back({request, got});
          return false;
        }
        // Bad here too: the newest write not yet committed, if it sets the key.
        rpc::GetResult pending;
        bool have = false;
        if (got.IsCorruption()) {
          if (const partition::ChainEntry* e =
                  member_->NewestUncommitted(static_cast<uint64_t>(key))) {
            std::vector<rpc::ChainOp> ops;
            if (DecodeChainOps(e->op, &ops).ok()) {
              for (const rpc::ChainOp& op : ops) {
                if (op.key != key) continue;
                if (op.kind == rpc::ChainOpKind::PUT) {
                  pending.found = true;
                  pending.value = op.value;
                  have = true;
                } else if (op.kind == rpc::ChainOpKind::REMOVE) {
                  pending.found = false;
                  pending.value.clear();
                  have = true;
                }
              }
            }
          }
        }
        switch (partition::ChainMember::ChooseRepair(!got.IsCorruption(), have, fetched)) {
          case partition::ChainMember::RepairFrom::kOwn:
            state->value = rpc::GetResult();
            state->value.found = got.ok();
            if (got.ok()) state->value.value = std::move(value);
            break;
          case partition::ChainMember::RepairFrom::kUncommitted:
            state->value = std::move(pending);
            break;
          case partition::ChainMember::RepairFrom::kFetch:
            out->replies.push_back({request, Status::OK()});
            return true;
          case partition::ChainMember::RepairFrom::kCopy:
            state->value = state->copy;
            break;
        }
        rpc::ChainOp op;
        op.kind = state->value.found ? rpc::ChainOpKind::PUT : rpc::ChainOpKind::REMOVE;
        op.__set_key(key);
        if (state->value.found) op.__set_value(state->value.value);
        std::string encoded = EncodeChainOps({op});
        Track({static_cast<uint64_t>(key)}, encoded);
        member_->OnWrite(request, {static_cast<uint64_t>(key)}, std::move(encoded), now, out);
        return false;
      });
  if (st.IsCorruption()) return Status::Corruption("key " + std::to_string(key) + ": " + st.message());
  FLATKV_RETURN_IF_ERROR(st);
  result->found = state->value.found;
  result->value = state->value.value;
  return Status::OK();
}

std::string EncodeBucket(const std::vector<engine::StringKeyValue>& live) {
  std::string bucket;
  for (const engine::StringKeyValue& kv : live) engine::AppendBucketPut(&bucket, kv.key, kv.value);
  return bucket;
}

std::vector<engine::StringKeyValue> DecodeBucket(std::string_view bucket) {
  std::vector<engine::StringKeyValue> live;
  for (auto& [k, v] : engine::LiveBucketEntries(bucket)) {
    live.push_back({std::move(k), std::move(v)});
  }
  return live;
}


Status Replicator::RepairBucket(int64_t slots, int64_t slot,
                                const std::function<Status(std::string*)>& fetch,
                                std::string* bucket) {
  struct State {
    std::string copy;    // another member's bucket, once fetched
    std::string bucket;  // what the rewrite writes
  };
  const engine::Store* store = cache_->store();
  if (slots <= 0 || slot < 0 || slot >= slots) {
    return Status::InvalidArgument("string-key slot " + std::to_string(slot) + " of " +
                                   std::to_string(slots));
  }
  if (static_cast<uint64_t>(slots) != store->options().string_slots) {
    return Status::InvalidArgument(
        "storage.string_slots differs: " + std::to_string(slots) + " on the member asking, " +
        std::to_string(store->options().string_slots) + " on the head " + options_.self +
        " (string keys are repaired by bucket: give the members of a mark the same value)");
  }
  // The event reads the bucket under mu_, after flushing the cache's dirty
  // entries (async write mode): most of them go here, first, each round.
  FLATKV_RETURN_IF_ERROR(cache_->Flush());
  auto state = std::make_shared<State>();
  Status st = RepairRounds(
      [&] {
        FLATKV_RETURN_IF_ERROR(fetch(&state->copy));
        return cache_->Flush();
      },
      [this, store, slots, slot, state](bool fetched, uint64_t request, int64_t now,
                                        ChainOutput* out) {
        std::vector<engine::StringKeyValue> live;
        Status got = cache_->SReadBucket(slot, &live);
        if (!got.ok() && !got.IsCorruption()) {
          out->replies.push_back({request, got});
          return false;
        }
        switch (partition::ChainMember::ChooseRepair(got.ok(), false, fetched)) {
          case partition::ChainMember::RepairFrom::kOwn:
          case partition::ChainMember::RepairFrom::kUncommitted:  // never asked for a bucket
            break;
          case partition::ChainMember::RepairFrom::kFetch:
            out->replies.push_back({request, Status::OK()});
            return true;
          case partition::ChainMember::RepairFrom::kCopy: {
            // Another member's copy holds every committed write; the ones
            // not committed yet go on top, oldest first (each sets its key:
            // applying one it holds changes nothing).
            std::map<std::string, std::string> pairs;
            for (auto& kv : DecodeBucket(state->copy)) pairs[kv.key] = std::move(kv.value);
            for (const partition::ChainEntry* e : member_->Uncommitted()) {
              std::vector<rpc::ChainOp> ops;
              if (!DecodeChainOps(e->op, &ops).ok()) continue;
              for (const rpc::ChainOp& op : ops) {
                if (op.kind == rpc::ChainOpKind::SBUCKET && op.key == slot && op.slots == slots) {
                  pairs.clear();
                  for (auto& kv : DecodeBucket(op.value)) pairs[kv.key] = std::move(kv.value);
                } else if ((op.kind == rpc::ChainOpKind::SPUT ||
                            op.kind == rpc::ChainOpKind::SREMOVE) &&
                           store->StringSlot(op.skey) == slot) {
                  if (op.kind == rpc::ChainOpKind::SPUT) {
                    pairs[op.skey] = op.value;
                  } else {
                    pairs.erase(op.skey);
                  }
                }
              }
            }
            live.clear();
            for (auto& [k, v] : pairs) live.push_back({k, std::move(v)});
            break;
          }
        }
        rpc::ChainOp op;
        op.kind = rpc::ChainOpKind::SBUCKET;
        op.__set_key(slot);
        op.__set_slots(slots);
        op.__set_value(EncodeBucket(live));
        state->bucket = op.value;
        // Tagged like each key's own writes (the ring's hash), so a read
        // gate that waits for a key's newest write waits for this one too,
        // and a ring change's record (Track) names its keys.
        std::vector<uint64_t> hashes;
        if (ring_ != nullptr) {
          for (const engine::StringKeyValue& kv : live) {
            hashes.push_back(static_cast<uint64_t>(
                partition::Ring::HashString(kv.key, ring_->settings().hash_bound)));
          }
        }
        std::string encoded = EncodeChainOps({op});
        Track(hashes, encoded);
        member_->OnWrite(request, std::move(hashes), std::move(encoded), now, out);
        return false;
      });
  if (st.IsCorruption()) {
    return Status::Corruption("string-key bucket " + std::to_string(slot) + ": " + st.message());
  }
  FLATKV_RETURN_IF_ERROR(st);
  *bucket = std::move(state->bucket);
  return Status::OK();
}

}  // namespace flatkv::server
