// A description of the machine and the software, for the benchmark's JSON:
// enough to tell two runs apart (GPUs, driver, runtime, NCCL, MPI, CPU, host).
#pragma once

#include "json_writer.hpp"
#include "session.hpp"

namespace moe_ep_tool {

// Collective (every rank describes itself); rank 0 writes the "machine" object.
void write_machine(JsonWriter& json, const Session& session);

}  // namespace moe_ep_tool
