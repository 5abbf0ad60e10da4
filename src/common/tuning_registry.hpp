// The library's environment knobs, declared once each (MOE_EP_KNOBS below:
// name, type, default, range, one line saying what it does and what it
// trades) and read by one parser.  create validates every knob before it
// allocates anything (validate_tuning_environment): a malformed or
// out-of-range value is INVALID_ARGUMENT naming the variable, the expected
// range and the value.  docs/api.md's table of environment variables is
// checked against these declarations by test/src/test_tuning_registry.cpp.
//
// Knobs are read at each create (not cached for the process), so that one
// process may create handles with different settings.  None changes results.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <optional>
#include <string>

namespace moe_ep {

enum class KnobType : int32_t {
  kBool,    // 0 or 1 (also true/false, on/off, yes/no; any case)
  kSwitch,  // auto, or a forced 0 or 1 (spelled as kBool)
  kInt,     // a decimal integer in [min, max]
  kChoice,  // one of the words of `choices` (any case); the value is its index
  kPath,    // any text; empty or unset: the default text
};

struct KnobSpec {
  const char* name;         // the environment variable
  KnobType type;
  int64_t default_value;    // kBool 0/1, kSwitch -1 (auto), kInt the number, kChoice the index
  int64_t min;              // kInt only
  int64_t max;              // kInt only
  const char* choices;      // kChoice: the words, separated by '|'; kPath: the default text
  const char* doc;          // one line: what it does and what it trades
};

// X(Id, "MOE_EP_NAME", type, default, min, max, choices or default path, doc)
// clang-format off
#define MOE_EP_KNOBS(X)                                                                                             \
  X(Log, "MOE_EP_LOG", kChoice, 0, 0, 0, "off|info|debug",                                                         \
    "info (or debug): per rank, what create chose and why, every knob taken from the environment, and each "      \
    "path the calls take (once per path); a few lines on stderr, nothing per call")                               \
  X(Fabric, "MOE_EP_FABRIC", kBool, 1, 0, 1, nullptr,                                                              \
    "NVLink: try FABRIC memory handles before POSIX file descriptors; 0 skips the attempt where the driver "      \
    "refuses FABRIC (no IMEX channel) and a tool would report the refused allocation; one rank saying 0 is enough") \
  X(Pdl, "MOE_EP_PDL", kBool, 1, 0, 1, nullptr,                                                                    \
    "NVLink, compute capability 9.0 and newer: Programmatic Dependent Launch, a kernel scheduled while the "       \
    "previous one of the stream finishes; 0 trades that overlap for launches a profiler shows one by one")        \
  X(StreamWait, "MOE_EP_STREAM_WAIT", kBool, 1, 0, 1, nullptr,                                                     \
    "NVLink split phases: a receive half waits for the peers with a stream memory operation, holding no SM, "    \
    "before its kernel; 0 makes the kernel wait instead (it then holds its SMs while the rows travel)")           \
  X(SmallBatch, "MOE_EP_SMALL_BATCH", kBool, 1, 0, 1, nullptr,                                                     \
    "NVLink: the small-batch kernels (a shorter chain of dependent steps) for calls within the two bounds "       \
    "below; 0 runs every call on the general kernels, slower for small calls")                                    \
  X(SmallDispatchTokens, "MOE_EP_SMALL_DISPATCH_TOKENS", kInt, 512, 1, 512, nullptr,                                \
    "NVLink: dispatches of at most this many tokens per rank run the small-batch kernel; lower it where the "     \
    "general kernel's parallel routing beats the small kernel's one routing round")                               \
  X(SmallCombineTokens, "MOE_EP_SMALL_COMBINE_TOKENS", kInt, 384, 1, 512, nullptr,                                  \
    "NVLink: serial-schedule combines of at most this many tokens per rank run the small-batch kernel; its "      \
    "static push items grow with tokens_per_rank, so above the bound the general kernel is faster")              \
  X(DispatchBulk, "MOE_EP_DISPATCH_BULK", kSwitch, -1, 0, 0, nullptr,                                              \
    "NVLink, compute capability 9.0 and newer: dispatch rows through shared memory by bulk copies (each row "     \
    "read once for every destination) instead of registers; auto takes them on SM budgets of at most 8, where "   \
    "they save SM time, and keeps registers above, where the copies' latency costs more than they save")          \
  X(DispatchLookback, "MOE_EP_DISPATCH_LOOKBACK", kSwitch, -1, 0, 0, nullptr,                                      \
    "NVLink general dispatch: route by look-back (each block its own tokens, then the earlier blocks' counts) "  \
    "or by scan (early blocks send sooner, late ones route longer); auto looks back for calls of more than 2048 " \
    "tokens on at most 32 blocks")                                                                               \
  X(QuantizeInSend, "MOE_EP_QUANTIZE_IN_SEND", kBool, 0, 0, 1, nullptr,                                          \
    "NVLink FP8 dispatch wire: 1 encodes the rows in the dispatch kernel's send loop where they allow it "       \
    "(16-byte aligned, hidden size a multiple of 16), saving a pass over the rows and a launch; 0 quantizes "    \
    "every call in a separate kernel first, the path with published figures")                                                                         \
  X(CombineSchedule, "MOE_EP_COMBINE_SCHEDULE", kChoice, 2, 0, 0, "serial|overlapped|auto",                        \
    "NVLink push combine: overlapped reduces while the rows arrive (pays on many SMs and large calls), serial "   \
    "pushes, waits, then reduces (shorter for small calls); auto chooses per call; the same on every rank")       \
  X(CombinePhases, "MOE_EP_COMBINE_PHASES", kInt, 16, 1, 65535, nullptr,                                          \
    "NVLink overlapped combine: publication phases (at most max_tokens_per_rank); more phases start the "         \
    "reduction sooner, each costs every push block a fence; the same on every rank")                              \
  X(PullRows, "MOE_EP_PULL_ROWS", kBool, 1, 0, 1, nullptr,                                                         \
    "NVLink zero-copy combine: whole rows (up to 16 KiB) per bulk copy with producer and consumer warps; 0 "     \
    "pulls 2 KiB segments, fewer bytes in flight per block")                                                      \
  X(PullProducers, "MOE_EP_PULL_PRODUCERS", kInt, 2, 1, 4, nullptr,                                                \
    "NVLink whole-row pull: producer warps per block, each with its own stream of copies; more keeps more "       \
    "bytes in flight, fewer leaves more warps to sum")                                                            \
  X(PullDiagnostic, "MOE_EP_PULL_DIAGNOSTIC", kInt, 0, 0, 7, nullptr,                                             \
    "builds with MOE_EP_DIAGNOSTICS only (ignored otherwise): bits 1, 2, 4 switch off the whole-row pull's "      \
    "adds, stores, copies to time the rest; results are wrong")                                                   \
  X(DispatchDiagnostic, "MOE_EP_DISPATCH_DIAGNOSTIC", kInt, 0, 0, 7, nullptr,                                     \
    "builds with MOE_EP_DIAGNOSTICS only (ignored otherwise): 1 or 2 leave the rows to this rank or to the "     \
    "peers unwritten (results are wrong), 4 prints per-block phase times")                                        \
  X(NcclLibrary, "MOE_EP_NCCL_LIBRARY", kPath, 0, 0, 0, "libnccl.so.2",                                            \
    "NCCL: the library to load (by the loader's search path unless a path); read at every create")                \
  X(NcclDispatchChunks, "MOE_EP_NCCL_DISPATCH_CHUNKS", kInt, 1, 1, 16, nullptr,                                   \
    "NCCL dispatch: row ranges (NCCL groups) packed while the previous range is in flight; more overlap, more "   \
    "NCCL calls; the same on every rank")                                                                         \
  X(NcclCombineChunks, "MOE_EP_NCCL_COMBINE_CHUNKS", kInt, 1, 1, 16, nullptr,                                     \
    "NCCL combine: row ranges (NCCL groups) summed while the next range is in flight; more overlap, more NCCL "   \
    "calls; the same on every rank")                                                                              \
  X(NcclRegister, "MOE_EP_NCCL_REGISTER", kBool, 1, 0, 1, nullptr,                                                \
    "NCCL with zero_copy_combine: the workspace from ncclMemAlloc, registered with NCCL so that NVLink "          \
    "transfers copy between the ranks' buffers directly; 0 keeps cudaMalloc memory and NCCL's staging")          \
  X(NcclProfile, "MOE_EP_NCCL_PROFILE", kBool, 0, 0, 1, nullptr,                                                  \
    "NCCL: time the stages of eager calls with CUDA events and log their means at destroy (MOE_EP_LOG=info); "   \
    "costs an event record per stage")
// clang-format on

enum class Knob : int32_t {
#define MOE_EP_KNOB_ID(id, ...) k##id,
  MOE_EP_KNOBS(MOE_EP_KNOB_ID)
#undef MOE_EP_KNOB_ID
      kCount
};

constexpr size_t kKnobCount = static_cast<size_t>(Knob::kCount);

// Every declaration, in MOE_EP_KNOBS order.
const KnobSpec& knob_spec(Knob knob);
const KnobSpec* find_knob(const std::string& name);  // NULL if no knob has that name

// The one parser: `text` (the variable's value) as the knob's value, or the
// reason it is not one ("expected an integer in [1, 16], got \"12abc\"").
struct KnobParse {
  bool ok = false;
  int64_t value = 0;
  std::string error;
};
KnobParse parse_knob(const KnobSpec& spec, const char* text);

// The knob's value now: from the environment, parsed, or its default where
// unset.  Throws INVALID_ARGUMENT (the message names the variable, the range
// and the value) for a value the parser refuses.
int64_t knob_value(Knob knob);
// The same without throwing: a refused value reads as the default (for the
// log level, read before create has validated anything).
int64_t knob_value_or_default(Knob knob) noexcept;
inline bool knob_bool(Knob knob) { return knob_value(knob) != 0; }
int32_t knob_int(Knob knob);
std::optional<bool> knob_switch(Knob knob);  // kSwitch: none = auto
std::string knob_text(Knob knob);            // kPath: the value, or the default text

// How docs/api.md writes a knob's default and range.
std::string knob_default_text(const KnobSpec& spec);
std::string knob_range_text(const KnobSpec& spec);

// At create, before anything is allocated: parses every knob (the first one
// refused throws, as knob_value does), logs each one taken from the
// environment at MOE_EP_LOG=info (one line each, for `rank`), and notes
// MOE_EP_* variables that are no knob of this library (ignored).
void validate_tuning_environment(int32_t rank);

}  // namespace moe_ep
