#include "check.hpp"

#include <algorithm>

#include "errors.hpp"

namespace moe_ep_tool {

Fault parse_fault(const std::string& name) {
  if (name == "none") return Fault::none;
  if (name == "dispatch_payload") return Fault::dispatch_payload;
  if (name == "dispatch_order") return Fault::dispatch_order;
  if (name == "recv_counts") return Fault::recv_counts;
  if (name == "combine_output") return Fault::combine_output;
  if (name == "stalled_rank") return Fault::none;  // not a corruption: run_check stops the last rank
  fail("unknown fault '" + name + "'");
}

bool inject_fault(Fault fault, const WorkloadSpec& s, ReceivedDispatch& got) {
  const uint64_t hb = s.recv_hidden_row_bytes();  // the rows as received
  switch (fault) {
    case Fault::dispatch_payload:  // one flipped bit in the first received row
      for (int src = 0; src < s.world && src < int(got.recv_counts.size()); ++src) {
        if (got.recv_counts[src] > 0) {
          got.hidden[uint64_t(src) * s.tokens_per_rank() * hb] ^= 0x10;
          return true;
        }
      }
      return false;
    case Fault::dispatch_order:  // the first two rows of a source segment swapped
      for (int src = 0; src < s.world && src < int(got.recv_counts.size()); ++src) {
        if (got.recv_counts[src] > 1) {
          uint8_t* row = &got.hidden[uint64_t(src) * s.tokens_per_rank() * hb];
          std::swap_ranges(row, row + hb, row + hb);
          return true;
        }
      }
      return false;
    case Fault::recv_counts:
      if (got.recv_counts.empty()) return false;
      ++got.recv_counts[0];
      return true;
    default:
      return false;
  }
}

bool inject_fault(Fault fault, const WorkloadSpec&, std::vector<uint8_t>& output) {
  if (fault != Fault::combine_output || output.empty()) return false;
  output[0] ^= 0x01;  // one unit in the last place of element 0
  return true;
}

}  // namespace moe_ep_tool
