// The start-up check of offload.nvme_dir (docs/design.md §3.6, §3.8), before anything is
// allocated or written: the directory exists or can be created (its nearest existing ancestor is a
// writable directory), files can be created in it, it takes O_DIRECT, and its filesystem has room
// for the swap files of every rank on this host. Each is one line naming offload.nvme_dir and the
// fix. Creating the probe file is the only way to know (root passes every permission check, a
// read-only mount or a full quota does not show in mode bits); it is unnamed, like the swap files.
//
// Swap files have no name while a run uses them (offload/swap_file.h), so a named one in the
// directory was left by a process killed between creating and unlinking it, or by an earlier
// version of the program. Those of processes that no longer run on this host are removed first
// (their blocks count as free) and reported in one line; those of live processes or other hosts
// are left alone and named if the space then falls short.
#pragma once
#include <cstdint>
#include <string>

namespace zt::offload {

struct NvmeDir {
  bool direct = true;   // false: the filesystem refused O_DIRECT (tmpfs); buffered I/O instead
  uint64_t free_bytes = 0;
  std::string free_source;  // "statvfs" or "ZT_NVME_FREE_BYTES"
  std::string removed;      // one line on the stale swap files removed; "" = none
};

// need_bytes: the swap files of every rank on this host. ZT_NVME_FREE_BYTES replaces the free
// space statvfs reports before stale files are removed (tests fake a small disk with it, as
// ZT_MEM_AVAILABLE_BYTES a small machine); ZT_NVME_NO_DIRECT makes the directory refuse O_DIRECT
// (tests of the buffered fallback). Ranks of one host take turns (a lock on the directory), so one
// of them removes and reports what the others then no longer find (and counts with the fake free
// space: the others count it alone).
NvmeDir check_nvme_dir(const std::string& dir, uint64_t need_bytes, const std::string& need_detail);

// Refuses (one line) a ZT_NVME_FREE_BYTES that is set but not a number of bytes. check_nvme_dir
// refuses it too, but a caller that takes its refusals as "no offload here" (the planner) would
// otherwise drop the offload candidates over a typo.
void check_nvme_free_override();

}  // namespace zt::offload
