// An environment variable set (or unset) for the lifetime of an object, put
// back as it was however the scope ends: for the tests of settings that the
// library reads from the environment (create reads the tuning switches).
#pragma once

#include <cstdlib>
#include <string>

namespace moe_ep_test {

class ScopedEnvironment {
 public:
  // value NULL: the variable is unset for the lifetime of the object.
  ScopedEnvironment(const char* name, const char* value) : name_(name) {
    const char* before = std::getenv(name);
    had_ = before != nullptr;
    if (had_) before_ = before;
    if (value != nullptr) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnvironment() {
    if (had_) {
      setenv(name_.c_str(), before_.c_str(), 1);
    } else {
      unsetenv(name_.c_str());
    }
  }
  ScopedEnvironment(const ScopedEnvironment&) = delete;
  ScopedEnvironment& operator=(const ScopedEnvironment&) = delete;

 private:
  std::string name_;
  bool had_ = false;
  std::string before_;
};

}  // namespace moe_ep_test
