#include "common/tuning_registry.hpp"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/log.hpp"
#include "error.hpp"

extern char** environ;

namespace moe_ep {

namespace {

constexpr KnobSpec kSpecs[] = {
#define MOE_EP_KNOB_SPEC(id, name, type, deflt, lo, hi, choices, doc) \
  KnobSpec{name, KnobType::type, deflt, lo, hi, choices, doc},
    MOE_EP_KNOBS(MOE_EP_KNOB_SPEC)
#undef MOE_EP_KNOB_SPEC
};
static_assert(sizeof(kSpecs) / sizeof(kSpecs[0]) == kKnobCount, "one declaration per knob");

constexpr const char* kPrefix = "MOE_EP_";
constexpr const char* kTestPrefix = "MOE_EP_TEST_";  // the test suites' own variables, no knobs

bool same_ignoring_case(const char* a, size_t a_length, const char* b) {
  if (std::strlen(b) != a_length) return false;
  for (size_t i = 0; i < a_length; ++i) {
    const char x = a[i] >= 'A' && a[i] <= 'Z' ? static_cast<char>(a[i] - 'A' + 'a') : a[i];
    const char y = b[i] >= 'A' && b[i] <= 'Z' ? static_cast<char>(b[i] - 'A' + 'a') : b[i];
    if (x != y) return false;
  }
  return true;
}

// 1 or 0 for the spellings of a boolean, -1 for anything else.
int bool_word(const char* text) {
  const size_t n = std::strlen(text);
  for (const char* on : {"1", "true", "on", "yes"}) {
    if (same_ignoring_case(text, n, on)) return 1;
  }
  for (const char* off : {"0", "false", "off", "no"}) {
    if (same_ignoring_case(text, n, off)) return 0;
  }
  return -1;
}

// The index of `text` among the '|'-separated words, or -1.
int64_t choice_index(const char* choices, const char* text) {
  int64_t index = 0;
  for (const char* word = choices;; ++index) {
    const char* end = std::strchr(word, '|');
    const size_t length = end ? static_cast<size_t>(end - word) : std::strlen(word);
    if (same_ignoring_case(text, std::strlen(text), std::string(word, length).c_str())) return index;
    if (end == nullptr) return -1;
    word = end + 1;
  }
}

// The index-th '|'-separated word.
std::string choice_word(const char* choices, int64_t index) {
  const char* word = choices;
  for (int64_t i = 0; i < index && word != nullptr; ++i) {
    word = std::strchr(word, '|');
    if (word != nullptr) ++word;
  }
  if (word == nullptr) return std::string();
  const char* end = std::strchr(word, '|');
  return end ? std::string(word, end) : std::string(word);
}

std::string list_of(const char* choices) {
  std::string s;
  for (const char* c = choices; *c != '\0'; ++c) {
    if (*c == '|') {
      s += ", ";
    } else {
      s += *c;
    }
  }
  return s;
}

std::string expected_text(const KnobSpec& spec) {
  switch (spec.type) {
    case KnobType::kBool:
      return "0 or 1 (or true/false, on/off, yes/no)";
    case KnobType::kSwitch:
      return "auto, 0 or 1 (or true/false, on/off, yes/no)";
    case KnobType::kInt:
      return "an integer in [" + std::to_string(spec.min) + ", " + std::to_string(spec.max) + "]";
    case KnobType::kChoice:
      return "one of " + list_of(spec.choices);
    case KnobType::kPath:
      return "a file name or path";
  }
  return std::string();
}

KnobParse refused(const KnobSpec& spec, const char* text) {
  KnobParse p;
  p.error = "expected " + expected_text(spec) + ", got \"" + text + "\"";
  return p;
}

KnobParse accepted(int64_t value) {
  KnobParse p;
  p.ok = true;
  p.value = value;
  return p;
}

// A decimal integer, optionally signed, nothing before or after it; false
// where there is none or it does not fit in 64 bits.
bool parse_integer(const char* text, int64_t* value) {
  const char* digits = text[0] == '+' || text[0] == '-' ? text + 1 : text;
  if (*digits < '0' || *digits > '9') return false;  // also refuses "", " 1", "+"
  char* end = nullptr;
  errno = 0;
  const long long n = std::strtoll(text, &end, 10);
  if (errno != 0 || *end != '\0') return false;
  *value = n;
  return true;
}

const char* environment_value(const KnobSpec& spec) { return std::getenv(spec.name); }

}  // namespace

const KnobSpec& knob_spec(Knob knob) { return kSpecs[static_cast<size_t>(knob)]; }

const KnobSpec* find_knob(const std::string& name) {
  for (const KnobSpec& spec : kSpecs) {
    if (name == spec.name) return &spec;
  }
  return nullptr;
}

KnobParse parse_knob(const KnobSpec& spec, const char* text) {
  if (text == nullptr) return accepted(spec.default_value);
  switch (spec.type) {
    case KnobType::kBool: {
      const int b = bool_word(text);
      return b < 0 ? refused(spec, text) : accepted(b);
    }
    case KnobType::kSwitch: {
      if (same_ignoring_case(text, std::strlen(text), "auto")) return accepted(-1);
      const int b = bool_word(text);
      return b < 0 ? refused(spec, text) : accepted(b);
    }
    case KnobType::kInt: {
      int64_t n = 0;
      if (!parse_integer(text, &n) || n < spec.min || n > spec.max) return refused(spec, text);
      return accepted(n);
    }
    case KnobType::kChoice: {
      const int64_t i = choice_index(spec.choices, text);
      return i < 0 ? refused(spec, text) : accepted(i);
    }
    case KnobType::kPath:
      return accepted(0);
  }
  return refused(spec, text);
}

int64_t knob_value(Knob knob) {
  const KnobSpec& spec = knob_spec(knob);
  const KnobParse p = parse_knob(spec, environment_value(spec));
  if (!p.ok) fail(MOE_EP_ERROR_INVALID_ARGUMENT, spec.name, " (environment variable): ", p.error);
  return p.value;
}

int64_t knob_value_or_default(Knob knob) noexcept {
  const KnobSpec& spec = knob_spec(knob);
  try {
    const KnobParse p = parse_knob(spec, environment_value(spec));
    return p.ok ? p.value : spec.default_value;
  } catch (...) {
    return spec.default_value;
  }
}

int32_t knob_int(Knob knob) { return static_cast<int32_t>(knob_value(knob)); }

std::optional<bool> knob_switch(Knob knob) {
  const int64_t v = knob_value(knob);
  if (v < 0) return std::nullopt;
  return v != 0;
}

std::string knob_text(Knob knob) {
  const KnobSpec& spec = knob_spec(knob);
  const char* v = environment_value(spec);
  return v != nullptr && *v != '\0' ? std::string(v) : std::string(spec.choices);
}

std::string knob_default_text(const KnobSpec& spec) {
  switch (spec.type) {
    case KnobType::kBool:
    case KnobType::kInt:
      return std::to_string(spec.default_value);
    case KnobType::kSwitch:
      return "auto";
    case KnobType::kChoice:
      return choice_word(spec.choices, spec.default_value);
    case KnobType::kPath:
      return spec.choices;
  }
  return std::string();
}

std::string knob_range_text(const KnobSpec& spec) {
  switch (spec.type) {
    case KnobType::kBool:
      return "0, 1";
    case KnobType::kSwitch:
      return "auto, 0, 1";
    case KnobType::kInt:
      return std::to_string(spec.min) + ".." + std::to_string(spec.max);
    case KnobType::kChoice:
      return list_of(spec.choices);
    case KnobType::kPath:
      return "a file name or path";
  }
  return std::string();
}

void validate_tuning_environment(int32_t rank) {
  refresh_log_level();
  for (size_t i = 0; i < kKnobCount; ++i) {
    const KnobSpec& spec = kSpecs[i];
    const char* v = environment_value(spec);
    knob_value(static_cast<Knob>(i));  // throws for a refused value
    if (v != nullptr) {
      log_info("rank ", rank, ": ", spec.name, "=", v, " from the environment (default ", knob_default_text(spec),
               ")");
    }
  }
  if (!log_info_enabled() || environ == nullptr) return;
  for (char** e = environ; *e != nullptr; ++e) {
    const char* entry = *e;
    if (std::strncmp(entry, kPrefix, std::strlen(kPrefix)) != 0) continue;
    if (std::strncmp(entry, kTestPrefix, std::strlen(kTestPrefix)) == 0) continue;
    const char* equals = std::strchr(entry, '=');
    const std::string name = equals ? std::string(entry, equals) : std::string(entry);
    if (find_knob(name) == nullptr)
      log_info("rank ", rank, ": ", name, " is set but is no knob of the library (ignored)");
  }
}

}  // namespace moe_ep
