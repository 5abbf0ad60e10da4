#include "handle_failure.hpp"

#include <unistd.h>

#include <chrono>
#include <random>

#include "backend_table.hpp"
#include "common/host_identity.hpp"
#include "common/tuning_registry.hpp"
#include "error.hpp"
#include "handle.hpp"
#include "host_backend.hpp"
#include "nvlink/nvlink_backend.hpp"
#include "store/frame.hpp"
#include "store/store_client.hpp"
#include "store/store_exchange.hpp"
#include "versioned_struct.hpp"

namespace moe_ep {

namespace {

constexpr size_t kMaxPrefixBytes = 512;  // leaves room for the group's own keys under it

std::string checked_text(const char* text, const char* field, size_t limit) {
  std::string s(text);
  if (s.empty() || s.size() > limit) fail_argument(field, "1.." + std::to_string(limit) + " characters", s.size());
  for (unsigned char c : s) {
    if (c < 0x21 || c > 0x7e) fail_argument(field, "printable characters without spaces", "\"" + s + "\"");
  }
  return s;
}

// Every rank's group key starts the same: <prefix>/g<nonce>, the nonce drawn
// by rank 0, so a group never reads a previous group's keys.
uint64_t draw_nonce() {
  std::random_device device;
  const uint64_t t = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  return (uint64_t(device()) << 32) ^ device() ^ t ^ (uint64_t(::getpid()) << 17);
}

std::string hex(uint64_t v) {
  static const char* digits = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[static_cast<size_t>(i)] = digits[v & 15];
  return s;
}

HostExchange masking_exchange(std::shared_ptr<StoreExchange> store, const std::vector<RankValue>& fingerprint,
                              moe_ep_handle_s& h) {
  h.mask_state = std::make_shared<MembershipState>();
  HostExchange x;
  x.exchange = store;
  x.store = std::move(store);
  x.fingerprint = fingerprint;
  x.mirror = h.mask_state;
  return x;
}

}  // namespace

FailureConfig read_failure_config(const moe_ep_config_t& c) {
  FailureConfig f;
  if (c.failure_policy != MOE_EP_ON_FAILURE_FAIL_HANDLE && c.failure_policy != MOE_EP_ON_FAILURE_MASK) {
    fail_argument("config->failure_policy", "MOE_EP_ON_FAILURE_FAIL_HANDLE (0) or MOE_EP_ON_FAILURE_MASK (1)",
                  c.failure_policy);
  }
  if (c.rejoin != 0 && c.rejoin != 1) fail_argument("config->rejoin", "0 or 1", c.rejoin);
  f.policy = c.failure_policy;
  f.rejoin = c.rejoin != 0;
  if (c.store_address) f.store_address = checked_text(c.store_address, "config->store_address", 300);
  f.store_prefix = c.store_prefix ? checked_text(c.store_prefix, "config->store_prefix", kMaxPrefixBytes) : "moe_ep";
  if (f.policy == MOE_EP_ON_FAILURE_MASK && f.store_address.empty()) {
    fail_argument("config->store_address", "\"host:port\" of a moe_ep store (failure_policy is MASK)", "NULL");
  }
  if (f.rejoin && f.policy != MOE_EP_ON_FAILURE_MASK) {
    fail_argument("config->failure_policy", "MOE_EP_ON_FAILURE_MASK (1) with config->rejoin = 1", c.failure_policy);
  }
  if (f.policy == MOE_EP_ON_FAILURE_MASK && c.backend != MOE_EP_BACKEND_HOST && c.backend != MOE_EP_BACKEND_AUTO &&
      c.backend != MOE_EP_BACKEND_NVLINK_TWO_SIDED) {
    fail(MOE_EP_ERROR_UNSUPPORTED, "config->failure_policy: MOE_EP_ON_FAILURE_MASK is implemented by the HOST and ",
         "NVLINK_TWO_SIDED backends; got config->backend ", c.backend, " (NCCL keeps the handle broken on a failure)");
  }
  return f;
}

std::unique_ptr<Backend> make_masking_backend(const Bootstrap& bootstrap, const Exchange& exchange, moe_ep_handle_s& h,
                                              const FailureConfig& failure, const std::vector<RankValue>& fingerprint) {
  const bool nvlink = h.config.backend == MOE_EP_BACKEND_NVLINK_TWO_SIDED;
  if (h.config.backend != MOE_EP_BACKEND_HOST && !nvlink) {  // agreed: the same answer on every rank
    fail(MOE_EP_ERROR_UNSUPPORTED, "config->failure_policy: MOE_EP_ON_FAILURE_MASK is implemented by the HOST ",
         "and NVLINK_TWO_SIDED backends; the group runs ", backend_entry(h.config.backend).name,
         " (NCCL keeps the handle broken on a failure)");
  }
  const int32_t rank = h.layout.rank, world = h.layout.world_size, timeout = h.config.timeout_ms;
  std::shared_ptr<store::StoreClient> client;
  run_then_agree(exchange, [&] {
    client = std::make_shared<store::StoreClient>(failure.store_address, timeout, "config->store_address");
  });
  const std::vector<uint64_t> nonces = exchange.allgather_value(rank == 0 ? draw_nonce() : 0, "create: store group");
  const std::string group = failure.store_prefix + "/g" + hex(nonces[0]);
  auto store = std::make_shared<StoreExchange>(client, group, rank, world, timeout,
                                               Membership{0, std::vector<uint8_t>(static_cast<size_t>(world), 1)});
  std::unique_ptr<Backend> backend;
  run_then_agree(exchange, [&] {
    if (rank == 0) {  // where a replacement finds the group, and which backend it runs
      client->set(failure.store_prefix + "/group", std::vector<uint8_t>(group.begin(), group.end()));
      const std::string backend = std::to_string(h.config.backend);
      client->set(group + "/backend", std::vector<uint8_t>(backend.begin(), backend.end()));
      store->publish_latest();
    }
    if (!nvlink) backend = make_host_backend(h.layout, h.config.micro_batches, masking_exchange(store, fingerprint, h));
  });
  if (nvlink) {  // collective over the bootstrap (memory exchange), which is alive at create
    h.mask_state = std::make_shared<MembershipState>();
    h.mask_state->active.assign(static_cast<size_t>(world), 1);
    backend =
        make_masking_nvlink_backend(h.layout, h.config, bootstrap, NvlinkMasking{store, fingerprint, h.mask_state});
  }
  sync_mask(h);
  return backend;
}

namespace {

moe_ep_bootstrap_t read_rejoin_bootstrap(const moe_ep_bootstrap_t* user) {
  moe_ep_bootstrap_t defaults{};
  defaults.struct_size = sizeof defaults;
  const moe_ep_bootstrap_t b = read_versioned(user, defaults, "bootstrap");
  if (b.world_size <= 0) fail_argument("bootstrap->world_size", "> 0", b.world_size);
  if (b.rank < 0 || b.rank >= b.world_size) {
    fail_argument("bootstrap->rank", "in [0, " + std::to_string(b.world_size) + ")", b.rank);
  }
  return b;
}

std::string read_group(store::StoreClient& client, const std::string& prefix, int32_t timeout_ms) {
  const auto bytes = client.get(prefix + "/group", timeout_ms);
  if (!bytes) {
    fail(MOE_EP_ERROR_TIMEOUT, "rejoin: the store at ", client.address(), " names no group under config->store_prefix ",
         "\"", prefix, "\" after ", timeout_ms, " ms (no group with failure_policy MASK was created there)");
  }
  const std::string group(bytes->begin(), bytes->end());
  if (group.size() > kMaxPrefixBytes + 18 || group.compare(0, prefix.size() + 2, prefix + "/g") != 0) {
    fail(MOE_EP_ERROR_INVALID_INPUT, "rejoin: the store's group key under \"", prefix, "\" is malformed (",
         group.size(), " bytes)");
  }
  return group;
}

// The backend the group runs (published at create), which a replacement
// must run too; config->backend AUTO takes it.
int32_t read_group_backend(store::StoreClient& client, const std::string& group, int32_t requested,
                           int32_t timeout_ms) {
  const auto bytes = client.get(group + "/backend", timeout_ms);
  const std::string text = bytes ? std::string(bytes->begin(), bytes->end()) : std::string();
  const int32_t backend = text == std::to_string(MOE_EP_BACKEND_HOST)               ? MOE_EP_BACKEND_HOST
                          : text == std::to_string(MOE_EP_BACKEND_NVLINK_TWO_SIDED) ? MOE_EP_BACKEND_NVLINK_TWO_SIDED
                                                                                    : -1;
  if (backend < 0) {
    fail(MOE_EP_ERROR_INVALID_INPUT, "rejoin: the store names no backend this process can run for group \"", group,
         "\" (", bytes ? "\"" + peer_text(text.c_str(), text.size()) + "\"" : std::string("no key"), ")");
  }
  if (requested != MOE_EP_BACKEND_AUTO && requested != backend) {
    fail_argument("config->backend", "the group's backend " + std::to_string(backend) + " or AUTO (0)", requested);
  }
  return backend;
}

}  // namespace

moe_ep_handle_s* create_rejoining_handle(const moe_ep_bootstrap_t* bootstrap_arg, const moe_ep_params_t* params_arg,
                                         const moe_ep_config_t* config_arg) {
  const moe_ep_bootstrap_t b = read_rejoin_bootstrap(bootstrap_arg);
  validate_tuning_environment(b.rank);
  auto h = std::make_unique<moe_ep_handle_s>();
  h->config = read_config(config_arg);
  const FailureConfig failure = read_failure_config(h->config);
  h->store_address = failure.store_address;
  h->store_prefix = failure.store_prefix;
  h->config.store_address = nullptr;
  h->config.store_prefix = nullptr;
  h->layout = make_layout(read_params(params_arg), b.world_size, b.rank);
  h->layout.zero_copy_combine = h->config.zero_copy_combine != 0;
  const int32_t timeout = h->config.timeout_ms;
  auto client = std::make_shared<store::StoreClient>(failure.store_address, timeout, "config->store_address");
  const std::string group = read_group(*client, failure.store_prefix, timeout);
  h->config.backend = read_group_backend(*client, group, h->config.backend, timeout);
  check_backend_capabilities(h->config.backend, h->layout, h->config.micro_batches);
  h->slots.resize(static_cast<size_t>(h->config.micro_batches));
  const Membership latest = StoreExchange::read_latest(*client, group, b.world_size, timeout);
  if (latest.active[static_cast<size_t>(b.rank)]) {
    fail(MOE_EP_ERROR_INVALID_STATE, "rejoin: rank ", b.rank, " is still active in its group (the survivors have ",
         "not masked it out: they do after timeout_ms without it); try again once they have");
  }
  auto store = std::make_shared<StoreExchange>(client, group, b.rank, b.world_size, timeout, latest);
  if (h->config.backend == MOE_EP_BACKEND_NVLINK_TWO_SIDED) {
    h->mask_state = std::make_shared<MembershipState>();
    h->mask_state->active = latest.active;
    h->backend =
        make_rejoining_nvlink_backend(h->layout, h->config, NvlinkMasking{store, group_fingerprint(*h), h->mask_state});
  } else {
    MembershipState joined;
    h->backend = make_rejoining_host_backend(h->layout, h->config.micro_batches,
                                             masking_exchange(store, group_fingerprint(*h), *h), &joined);
  }
  sync_mask(*h);
  return h.release();
}

void sync_mask(moe_ep_handle_s& h) {
  if (!h.mask_state) return;
  h.active = h.mask_state->active;
  h.mask_epoch = h.mask_state->mask_epoch;
}

void end_pairs_after_failure(moe_ep_handle_s& h, const RankFailure& f) {
  for (PairSlot& s : h.slots) s.state = SlotState::idle;  // every survivor ends the same pairs
  h.last_failed_rank = f.failed().empty() ? -1 : f.failed().front();
  sync_mask(h);
}

}  // namespace moe_ep
