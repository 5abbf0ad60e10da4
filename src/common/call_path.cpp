#include "common/call_path.hpp"

#include "common/log.hpp"
#include "moe_ep_c.h"

namespace moe_ep {

const char* path_name(int32_t path) noexcept {
  switch (path) {
    case MOE_EP_PATH_NONE:
      return "none";
    case MOE_EP_PATH_HOST:
      return "host";
    case MOE_EP_PATH_NCCL:
      return "nccl";
    case MOE_EP_PATH_DISPATCH_SMALL:
      return "dispatch_small";
    case MOE_EP_PATH_DISPATCH_SMALL_BULK:
      return "dispatch_small_bulk";
    case MOE_EP_PATH_DISPATCH_SCAN:
      return "dispatch_scan";
    case MOE_EP_PATH_DISPATCH_SCAN_BULK:
      return "dispatch_scan_bulk";
    case MOE_EP_PATH_DISPATCH_LOOKBACK:
      return "dispatch_lookback";
    case MOE_EP_PATH_DISPATCH_LOOKBACK_BULK:
      return "dispatch_lookback_bulk";
    case MOE_EP_PATH_DISPATCH_SMALL_QUANTIZE: return "dispatch_small_quantize";
    case MOE_EP_PATH_DISPATCH_SCAN_QUANTIZE: return "dispatch_scan_quantize";
    case MOE_EP_PATH_DISPATCH_LOOKBACK_QUANTIZE: return "dispatch_lookback_quantize";
    case MOE_EP_PATH_COMBINE_SMALL_PUSH:
      return "combine_small_push";
    case MOE_EP_PATH_COMBINE_SERIAL_PUSH:
      return "combine_serial_push";
    case MOE_EP_PATH_COMBINE_OVERLAPPED_PUSH:
      return "combine_overlapped_push";
    case MOE_EP_PATH_COMBINE_PULL_ROWS:
      return "combine_pull_rows";
    case MOE_EP_PATH_COMBINE_PULL_SEGMENTS:
      return "combine_pull_segments";
    case MOE_EP_PATH_COMBINE_PULL_REGISTERS:
      return "combine_pull_registers";
    case MOE_EP_PATH_COMBINE_PULL_UNALIGNED:
      return "combine_pull_unaligned";
    default:
      return "unknown";
  }
}

void CallPaths::note(int32_t phase, int32_t path, int32_t rank) {
  last_[phase == MOE_EP_PHASE_COMBINE ? 1 : 0] = path;
  const uint64_t bit = path >= 0 && path < 64 ? uint64_t{1} << path : 0;
  if ((logged_ & bit) != 0) return;
  logged_ |= bit;
  log_info("rank ", rank, ": ", phase == MOE_EP_PHASE_COMBINE ? "combine" : "dispatch", " takes path ",
           path_name(path));
}

int32_t CallPaths::last(int32_t phase) const noexcept { return last_[phase == MOE_EP_PHASE_COMBINE ? 1 : 0]; }

}  // namespace moe_ep
