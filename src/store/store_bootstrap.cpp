#include "store/store_bootstrap.hpp"

#include <cstring>
#include <memory>

#include "error.hpp"
#include "store/store_client.hpp"

namespace moe_ep {

namespace {

struct StoreBootstrap {
  std::unique_ptr<store::StoreClient> client;
  std::string prefix;
  int32_t rank = 0, world = 0, timeout_ms = 0;
  uint64_t calls = 0;
};

std::string key(const StoreBootstrap& b, uint64_t k, int32_t r) {
  return b.prefix + "/b" + std::to_string(k) + "/r" + std::to_string(r);
}

void gather(StoreBootstrap& b, const void* send, void* recv, size_t bytes) {
  const uint64_t k = b.calls++;
  const auto* data = static_cast<const uint8_t*>(send);
  b.client->set(key(b, k, b.rank), std::vector<uint8_t>(data, data + bytes));
  const store::Deadline deadline = store::deadline_after_ms(b.timeout_ms);
  for (int32_t r = 0; r < b.world; ++r) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - store::Clock::now()).count();
    const auto v = b.client->get(key(b, k, r), left > 0 ? left : 0);
    if (!v)
      fail(MOE_EP_ERROR_TIMEOUT, "store bootstrap: rank ", r, " did not post allgather #", k, " within ", b.timeout_ms,
           " ms");
    if (v->size() != bytes) {
      fail(MOE_EP_ERROR_INVALID_INPUT, "store bootstrap: rank ", r, " posted ", v->size(), " bytes for allgather #", k,
           ", this rank ", bytes);
    }
    if (bytes != 0) std::memcpy(static_cast<uint8_t*>(recv) + bytes * static_cast<size_t>(r), v->data(), bytes);
  }
  if (k > 0) b.client->erase(key(b, k - 1, b.rank));
}

// The callbacks: nothing crosses back into the library but a status and the message.
int32_t store_allgather(void* ctx, const void* send, void* recv, size_t bytes_per_rank) {
  try {
    gather(*static_cast<StoreBootstrap*>(ctx), send, recv, bytes_per_rank);
    return 0;
  } catch (const std::exception& e) {
    set_last_error(e.what());
    return -1;
  }
}

int32_t store_barrier(void* ctx) {
  const uint8_t mine = 1;
  std::vector<uint8_t> all(static_cast<size_t>(static_cast<StoreBootstrap*>(ctx)->world));
  return store_allgather(ctx, &mine, all.data(), 1);
}

}  // namespace

moe_ep_bootstrap_t make_store_bootstrap(const std::string& address, const std::string& prefix, int32_t rank,
                                        int32_t world_size, int32_t timeout_ms) {
  if (world_size <= 0) fail_argument("world_size", "> 0", world_size);
  if (rank < 0 || rank >= world_size) fail_argument("rank", "in [0, " + std::to_string(world_size) + ")", rank);
  if (timeout_ms <= 0) fail_argument("timeout_ms", "> 0", timeout_ms);
  if (prefix.empty() || prefix.size() > 512) fail_argument("prefix", "1..512 characters", prefix.size());
  auto b = std::make_unique<StoreBootstrap>();
  b->client = std::make_unique<store::StoreClient>(address, timeout_ms, "address");
  b->prefix = prefix;
  b->rank = rank;
  b->world = world_size;
  b->timeout_ms = timeout_ms;
  moe_ep_bootstrap_t out{};
  out.struct_size = sizeof out;
  out.rank = rank;
  out.world_size = world_size;
  out.ctx = b.release();
  out.allgather = store_allgather;
  out.barrier = store_barrier;
  return out;
}

bool release_store_bootstrap(moe_ep_bootstrap_t* b) {
  if (b->ctx == nullptr) return true;
  if (b->allgather != store_allgather) return false;
  delete static_cast<StoreBootstrap*>(b->ctx);
  b->ctx = nullptr;
  b->allgather = nullptr;
  b->barrier = nullptr;
  return true;
}

}  // namespace moe_ep
