#include "bootstrap.hpp"

#include <cstring>

#include "common/host_identity.hpp"
#include "error.hpp"
#include "versioned_struct.hpp"

namespace moe_ep {

namespace {
moe_ep_bootstrap_t default_bootstrap() {
  moe_ep_bootstrap_t b{};
  b.struct_size = sizeof(b);
  return b;
}
}  // namespace

Bootstrap::Bootstrap(const moe_ep_bootstrap_t* user) {
  b_ = read_versioned(user, default_bootstrap(), "bootstrap");
  if (b_.world_size <= 0) fail_argument("bootstrap->world_size", "> 0", b_.world_size);
  if (b_.rank < 0 || b_.rank >= b_.world_size) {
    fail_argument("bootstrap->rank", "in [0, " + std::to_string(b_.world_size) + ")", b_.rank);
  }
  if (b_.allgather == nullptr) fail_argument("bootstrap->allgather", "a callback", "NULL");
  if (b_.barrier == nullptr) fail_argument("bootstrap->barrier", "a callback", "NULL");
}

namespace {

// Runs a user callback: nothing it throws crosses into us, and a message it
// left with moe_ep_set_last_error is returned for ours to quote.
template <typename Call>
int32_t run_callback(Call&& call, std::string* callback_message) {
  clear_last_error();
  int32_t rc = 0;
  try {
    rc = call();
  } catch (...) {
    rc = -1;
  }
  *callback_message = last_error();
  return rc;
}

std::string quoted(const std::string& callback_message) {
  return callback_message.empty() ? "" : ": " + callback_message;
}

}  // namespace

void Bootstrap::do_allgather(const void* send, void* recv, size_t bytes_per_rank, const char* step) const {
  std::string message;
  const int32_t rc = run_callback([&] { return b_.allgather(b_.ctx, send, recv, bytes_per_rank); }, &message);
  if (rc != 0) {
    fail(MOE_EP_ERROR_BOOTSTRAP, "bootstrap->allgather(", bytes_per_rank, " bytes per rank) returned ", rc,
         " on rank ", b_.rank, quoted(message), " (", step, ")");
  }
}

void Bootstrap::barrier() const {
  std::string message;
  const int32_t rc = run_callback([&] { return b_.barrier(b_.ctx); }, &message);
  if (rc != 0) fail(MOE_EP_ERROR_BOOTSTRAP, "bootstrap->barrier returned ", rc, " on rank ", b_.rank, quoted(message));
}

namespace {

bool is_error_status(int32_t status) {
  return status >= MOE_EP_ERROR_INVALID_ARGUMENT && status <= MOE_EP_ERROR_INTERNAL;
}

}  // namespace

void Exchange::agree(moe_ep_status_t local_status, const std::string& local_message) const {
  struct Outcome {
    int32_t status;
    char message[244];
  };
  Outcome mine{};
  mine.status = local_status;
  std::strncpy(mine.message, local_message.c_str(), sizeof(mine.message) - 1);
  const std::vector<Outcome> all = allgather_value(mine, "agreement on every rank's outcome");
  if (local_status != MOE_EP_SUCCESS) throw Error(local_status, local_message);
  for (int32_t r = 0; r < world_size(); ++r) {
    if (all[r].status == MOE_EP_SUCCESS) continue;
    // A peer's bytes: never read past the field, no control characters.
    const std::string message = peer_text(all[r].message, sizeof(all[r].message));
    if (!is_error_status(all[r].status)) {
      fail(MOE_EP_ERROR_INVALID_INPUT, "rank ", r, " reported an outcome with unknown status ", all[r].status,
           " (expected 0..", MOE_EP_ERROR_INTERNAL, "): ", message);
    }
    fail(all[r].status, "rank ", r, " failed: ", message);
  }
}

}  // namespace moe_ep
