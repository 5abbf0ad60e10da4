#include "probe_options.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <sstream>

namespace moe_ep_probe {

namespace {

struct IntOption {
  const char* name;
  int ProbeOptions::*field;
  long min;
  long max;
  const char* help;
};

// Upper bounds keep every buffer the probe allocates small (a round trip
// stores two 8-byte samples; a chase load needs one 128-byte line of a 64 MiB
// ring) and every run short.
const IntOption kIntOptions[] = {
    {"--round-trips", &ProbeOptions::round_trips, 1, 1000000,
     "timed round trips per ping-pong or exchange-loop kernel"},
    {"--warmup-trips", &ProbeOptions::warmup_trips, 0, 100000, "untimed round trips before them"},
    {"--kernel-runs", &ProbeOptions::kernel_runs, 1, 100,
     "ping-pong, exchange-loop and chase kernels per variant (pooled)"},
    {"--graph-replays", &ProbeOptions::graph_replays, 1, 100000, "graph replays per timed block"},
    {"--graph-blocks", &ProbeOptions::graph_blocks, 1, 10000, "timed blocks per graph (one sample each)"},
    {"--chase-loads", &ProbeOptions::chase_loads, 100, 100000, "dependent loads per pointer chase"},
    {"--call-iterations", &ProbeOptions::call_iterations, 1, 100000, "timed calls per line of group call"},
    {"--call-batch", &ProbeOptions::call_batch, 1, 1000, "calls queued behind each gate (group call)"},
    {"--timeout-ms", &ProbeOptions::timeout_ms, 1, 60000, "bound of every device-side wait"},
};

long parse_int(const std::string& name, const std::string& text, long min, long max) {
  errno = 0;
  char* end = nullptr;
  const long value = std::strtol(text.c_str(), &end, 10);
  const bool whole = !text.empty() && end == text.c_str() + text.size();
  if (!whole || errno == ERANGE || value < min || value > max) {
    std::ostringstream msg;
    msg << name << ": expected an integer in [" << min << ", " << max << "], got '" << text << "'";
    throw OptionError(msg.str());
  }
  return value;
}

std::string group_list(const char* separator) {
  std::string out;
  for (const auto& g : all_groups()) out += (out.empty() ? "" : separator) + g;
  return out;
}

std::vector<std::string> parse_groups(const std::string& text) {
  std::vector<std::string> chosen;
  std::istringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    const auto& known = all_groups();
    if (std::find(known.begin(), known.end(), item) == known.end()) {
      throw OptionError("--only: expected a comma-separated list of " + group_list(", ") + "; got '" + text + "' ('" +
                        item + "' is not a group)");
    }
    if (std::find(chosen.begin(), chosen.end(), item) == chosen.end()) chosen.push_back(item);
  }
  if (chosen.empty()) throw OptionError("--only: expected at least one group, got '" + text + "'");
  // Run in the fixed order whatever order was typed.
  std::vector<std::string> ordered;
  for (const auto& g : all_groups()) {
    if (std::find(chosen.begin(), chosen.end(), g) != chosen.end()) ordered.push_back(g);
  }
  return ordered;
}

}  // namespace

ProbeOptions parse_options(const std::vector<std::string>& args) {
  ProbeOptions opt;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string name = args[i];
    std::string value;
    bool has_value = false;
    const size_t eq = name.find('=');
    if (name.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    auto take_value = [&]() -> std::string {
      if (has_value) return value;
      if (i + 1 >= args.size()) throw OptionError(name + ": expected a value after it, got the end of the line");
      return args[++i];
    };
    auto no_value = [&]() {
      if (has_value) throw OptionError(name + ": expected no value, got '" + value + "'");
    };
    if (name == "--help" || name == "-h") {
      no_value();
      opt.help = true;
    } else if (name == "--same-gpu") {
      no_value();
      opt.same_gpu = true;
    } else if (name == "--json") {
      opt.json_path = take_value();
      if (opt.json_path.empty()) throw OptionError("--json: expected a file name, got ''");
    } else if (name == "--only") {
      opt.groups = parse_groups(take_value());
    } else {
      const IntOption* found = nullptr;
      for (const auto& o : kIntOptions) {
        if (name == o.name) found = &o;
      }
      if (found == nullptr) throw OptionError("unknown argument '" + args[i] + "' (see --help)");
      opt.*(found->field) = static_cast<int>(parse_int(name, take_value(), found->min, found->max));
    }
  }
  return opt;
}

std::string usage_text() {
  const ProbeOptions defaults;
  std::ostringstream out;
  out << "usage: moe_ep_latency_probe [options]\n"
         "Measures, one at a time, the hardware and runtime costs on the critical path of a small\n"
         "moe_ep call (docs/latency_budget.md): graph launch, a flag one way over NVLink, a row\n"
         "plus system fence plus flag, a row with flags in the data, dependent remote loads; and\n"
         "(group call) empty kernels and a minimal two-sided exchange timed as the benchmark times a call;\n"
         "(group bw) the bandwidth per GPU and per SM of register and bulk-copy streams, local and over\n"
         "the peer link, for 1, 4, 8, 16, 24 and all SMs (lines marked GB/s: the columns are GB/s, not us).\n"
         "Uses GPUs 0 and 1 with peer access; with one GPU both sides run on GPU 0.\n\n"
         "  --json FILE          also write the results as JSON to FILE\n";
  out << "  --only LIST          groups to run, comma-separated: " << group_list(",") << " (default: all)\n";
  out << "  --same-gpu           both sides on GPU 0 (no NVLink) even where GPU 1 exists\n";
  for (const auto& o : kIntOptions) {
    std::string flag = std::string(o.name) + " N";
    flag.resize(21, ' ');
    out << "  " << flag << o.help << " (default " << defaults.*(o.field) << ", " << o.min << ".." << o.max << ")\n";
  }
  out << "  -h, --help           this text\n\n"
         "Exit status: 0 all measured; 1 a measurement failed (CUDA error or a wait timed out);\n"
         "2 bad arguments; 3 no CUDA device.\n";
  return out.str();
}

}  // namespace moe_ep_probe
