// CRC32C (Castagnoli), the checksum of every log record and of the index
// header. Buffers of 256 bytes and more go to Intel ISA-L's crc32_iscsi
// (Debian's libisal-dev: carry-less multiply folding, AVX-512 where the CPU
// has it); shorter ones, where its setup costs more than it saves, to three
// interleaved streams of the SSE4.2 crc32 instruction here, with a
// table-driven fallback on CPUs without it. All give identical results
// (crc32c_test compares them with each other and with published vectors).
//
// Why not only a library: google's crc32c is not in bookworm, LevelDB and
// RocksDB keep theirs private, Boost.CRC is table-only (~10x slower than the
// instruction on 100 KiB values), and ISA-L is slower below ~200 bytes.
#pragma once

#include <cstddef>
#include <cstdint>

namespace flatkv::engine::crc32c {

// Returns the CRC32C of data[0, n) continuing from "init_crc" (the CRC of the
// bytes before it; 0 to start).
uint32_t Extend(uint32_t init_crc, const void* data, size_t n);

inline uint32_t Value(const void* data, size_t n) { return Extend(0, data, n); }

// A CRC stored next to the data it covers is masked (as LevelDB does) so that
// computing the CRC of a string that contains embedded CRCs stays robust.
constexpr uint32_t kMaskDelta = 0xa282ead8u;
inline uint32_t Mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + kMaskDelta; }
inline uint32_t Unmask(uint32_t masked) {
  uint32_t rot = masked - kMaskDelta;
  return (rot >> 17) | (rot << 15);
}

}  // namespace flatkv::engine::crc32c
