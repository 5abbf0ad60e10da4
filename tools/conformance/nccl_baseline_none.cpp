// Built without NCCL: the baseline reports itself absent.
#include "nccl_baseline.hpp"

#include "errors.hpp"

namespace moe_ep_tool {

struct NcclBaseline::State {};

bool NcclBaseline::compiled() { return false; }
std::string NcclBaseline::version() { return ""; }
NcclBaseline::NcclBaseline(const Session&, int64_t, uint64_t) { fail("this build has no NCCL baseline"); }
NcclBaseline::~NcclBaseline() = default;
NcclDispatchTiming NcclBaseline::time_dispatch(const LoopOptions&, const Traffic&) { return {}; }
LoopResult NcclBaseline::time_combine(const LoopOptions&, const Traffic&) { return {}; }

}  // namespace moe_ep_tool
