#include "server/methods.h"

#include <array>
#include <string>
#include <unordered_map>

namespace flatkv::server {
namespace {

using H = Handler;
constexpr auto kIn = Dispatch::kInline, kRo = Dispatch::kRouted, kFan = Dispatch::kFanOut,
               kAll = Dispatch::kWholeStore, kCh = Dispatch::kChainWait,
               kFr = Dispatch::kChainFrame;
constexpr auto kNo = KeyKind::kNone, kInt = KeyKind::kInt, kStr = KeyKind::kString;
constexpr auto kVoid = ResultKind::kVoid, kBool = ResultKind::kBool,
               kGetR = ResultKind::kGetResult, kOther = ResultKind::kOther;
constexpr bool kValue = true, kNoValue = false;
constexpr bool kWrite = true, kRead = false;
constexpr bool kOnce = false, kAgain = true;  // idempotent: may be sent twice

// In Handler::Method's order (checked below).
constexpr std::array<MethodTraits, H::kMethods> kTraits = {{
    {H::kGet, "get", kRo, kInt, kNoValue, kRead, kAgain, kGetR, H::kPeerGet},
    {H::kPut, "put", kRo, kInt, kValue, kWrite, kAgain, kVoid, H::kPeerPut},
    {H::kRemove, "remove", kRo, kInt, kNoValue, kWrite, kAgain, kBool, H::kPeerRemove},
    {H::kAppend, "append", kRo, kInt, kValue, kWrite, kOnce, kVoid, H::kPeerAppend},
    {H::kMultiGet, "multiGet", kFan, kNo, kNoValue, kRead, kAgain, kOther, H::kMethods},
    {H::kMultiPut, "multiPut", kFan, kNo, kNoValue, kWrite, kAgain, kOther, H::kMethods},
    {H::kScan, "scan", kFan, kNo, kNoValue, kRead, kAgain, kOther, H::kMethods},
    {H::kScanLog, "scanLog", kFan, kNo, kNoValue, kRead, kAgain, kOther, H::kMethods},
    {H::kSGet, "sget", kRo, kStr, kNoValue, kRead, kAgain, kGetR, H::kPeerSGet},
    {H::kSPut, "sput", kRo, kStr, kValue, kWrite, kAgain, kVoid, H::kPeerSPut},
    {H::kSRemove, "sremove", kRo, kStr, kNoValue, kWrite, kAgain, kBool, H::kPeerSRemove},
    {H::kSetWriteMode, "setWriteMode", kIn, kNo, kNoValue, kWrite, kAgain, kOther, H::kMethods},
    {H::kGetWriteMode, "getWriteMode", kIn, kNo, kNoValue, kRead, kAgain, kOther, H::kMethods},
    {H::kCompact, "compact", kIn, kNo, kNoValue, kWrite, kAgain, kOther, H::kMethods},
    {H::kCompactionStatus, "compactionStatus", kIn, kNo, kNoValue, kRead, kAgain, kOther,
     H::kMethods},
    {H::kInfo, "info", kIn, kNo, kNoValue, kRead, kAgain, kOther, H::kMethods},
    {H::kStats, "stats", kIn, kNo, kNoValue, kRead, kAgain, kOther, H::kMethods},
    {H::kRing, "ring", kIn, kNo, kNoValue, kRead, kAgain, kOther, H::kMethods},
    {H::kPeerGet, "peerGet", kIn, kInt, kNoValue, kRead, kAgain, kGetR, H::kGet},
    {H::kPeerPut, "peerPut", kCh, kInt, kValue, kWrite, kAgain, kVoid, H::kPut},
    {H::kPeerRemove, "peerRemove", kCh, kInt, kNoValue, kWrite, kAgain, kBool, H::kRemove},
    {H::kPeerAppend, "peerAppend", kCh, kInt, kValue, kWrite, kOnce, kVoid, H::kAppend},
    {H::kPeerMultiGet, "peerMultiGet", kIn, kNo, kNoValue, kRead, kAgain, kOther, H::kMethods},
    {H::kPeerMultiPut, "peerMultiPut", kCh, kNo, kNoValue, kWrite, kAgain, kOther, H::kMethods},
    {H::kPeerScan, "peerScan", kIn, kNo, kNoValue, kRead, kAgain, kOther, H::kMethods},
    {H::kPeerScanLog, "peerScanLog", kIn, kNo, kNoValue, kRead, kAgain, kOther, H::kMethods},
    {H::kPeerSGet, "peerSGet", kIn, kStr, kNoValue, kRead, kAgain, kGetR, H::kSGet},
    {H::kPeerSPut, "peerSPut", kCh, kStr, kValue, kWrite, kAgain, kVoid, H::kSPut},
    {H::kPeerSRemove, "peerSRemove", kCh, kStr, kNoValue, kWrite, kAgain, kBool, H::kSRemove},
    {H::kPeerChain, "peerChain", kFr, kNo, kNoValue, kWrite, kAgain, kOther, H::kMethods},
    {H::kPeerSnapshot, "peerSnapshot", kCh, kNo, kNoValue, kWrite, kAgain, kOther, H::kMethods},
    {H::kDigest, "digest", kCh, kNo, kNoValue, kRead, kAgain, kOther, H::kMethods},
    {H::kPeerRepair, "peerRepair", kCh, kNo, kNoValue, kWrite, kAgain, kOther, H::kMethods},
    {H::kVerify, "verify", kAll, kNo, kNoValue, kRead, kAgain, kOther, H::kMethods},
    {H::kPeerExport, "peerExport", kCh, kNo, kNoValue, kRead, kAgain, kOther, H::kMethods},
    {H::kPeerFence, "peerFence", kCh, kNo, kNoValue, kWrite, kAgain, kOther, H::kMethods},
    {H::kPeerDrop, "peerDrop", kCh, kNo, kNoValue, kWrite, kAgain, kOther, H::kMethods},
    {H::kRemoveMark, "removeMark", kFan, kNo, kNoValue, kWrite, kAgain, kOther, H::kMethods},
    {H::kAbortChange, "abortChange", kFan, kNo, kNoValue, kWrite, kAgain, kOther, H::kMethods},
    {H::kBackup, "backup", kAll, kNo, kNoValue, kRead, kAgain, kOther, H::kMethods},
    {H::kBackupStatus, "backupStatus", kIn, kNo, kNoValue, kRead, kAgain, kOther, H::kMethods},
    {H::kPeerTrack, "peerTrack", kCh, kNo, kNoValue, kWrite, kAgain, kOther, H::kMethods},
    {H::kPeerDelta, "peerDelta", kCh, kNo, kNoValue, kWrite, kAgain, kOther, H::kMethods},
    {H::kPeerBucket, "peerBucket", kCh, kNo, kNoValue, kRead, kAgain, kOther, H::kMethods},
}};

constexpr bool InOrder() {
  for (size_t i = 0; i < kTraits.size(); ++i) {
    if (kTraits[i].method != static_cast<H::Method>(i)) return false;
  }
  return true;
}
static_assert(InOrder(), "kTraits must list Handler::Method in its order");

}  // namespace

const MethodTraits& TraitsOf(Handler::Method method) { return kTraits[method]; }

const MethodTraits* FindMethod(std::string_view name) {
  static const auto* const by_name = [] {
    auto* map = new std::unordered_map<std::string_view, const MethodTraits*>();
    for (const MethodTraits& t : kTraits) map->emplace(t.name, &t);
    return map;
  }();
  const auto it = by_name->find(name);
  return it != by_name->end() ? it->second : nullptr;
}

}  // namespace flatkv::server
