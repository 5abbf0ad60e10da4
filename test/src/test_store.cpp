// The store (src/store/): its frames refuse every malformed field by name,
// its operations (set, blocking get with a deadline, add, compare-and-set,
// erase) do what they say, a hostile or stalled client loses only its own
// connection, a client never hangs on a dead server, the C entry points check
// their arguments, and the store's bootstrap runs a HOST case.  Ranks are
// threads.
#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "error.hpp"
#include "host_case_runner.hpp"
#include "loopback_store.hpp"
#include "masked_round.hpp"
#include "moe_ep_c.h"
#include "rank_checks.hpp"
#include "store/frame.hpp"
#include "store/rank_failure.hpp"
#include "store/socket_io.hpp"
#include "store/store_client.hpp"
#include "store/store_exchange.hpp"
#include "store/store_server.hpp"
#include "thread_bootstrap.hpp"

using namespace moe_ep::store;
using namespace moe_ep_test;
using Catch::Matchers::Contains;

namespace {

std::vector<uint8_t> bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

std::string address_of(const StoreServer& s) { return "127.0.0.1:" + std::to_string(s.port()); }

double ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

RequestHeader header(Op op, uint32_t key_len, uint64_t value_len = 0, uint64_t arg = 0, uint16_t flags = 0) {
  RequestHeader h;
  h.op = op;
  h.key_len = key_len;
  h.value_len = value_len;
  h.arg = arg;
  h.flags = flags;
  return h;
}

RequestHeader header_of_set() { return header(Op::set, 3, 5); }

std::string refusal(const std::vector<uint8_t>& frame) {
  RequestHeader out;
  std::string error;
  if (decode_request_header(frame.data(), &out, &error)) return "";
  return error;
}

}  // namespace

TEST_CASE("store frames: a header round-trips, and every bad field is refused by name", "[store]") {
  const RequestHeader h = header(Op::compare_set, 5, 12, 4, 0);
  RequestHeader back;
  std::string error;
  REQUIRE(decode_request_header(encode_request_header(h).data(), &back, &error));
  CHECK(back.op == Op::compare_set);
  CHECK(back.key_len == 5);
  CHECK(back.value_len == 12);
  CHECK(back.arg == 4);

  std::vector<uint8_t> f = encode_request_header(header(Op::get, 3));
  f[0] ^= 1;
  CHECK_THAT(refusal(f), Contains("magic"));
  f = encode_request_header(header(Op::get, 3));
  f[4] = 9;
  CHECK_THAT(refusal(f), Contains("version"));
  f[4] = kVersion;
  f[5] = 0;
  CHECK_THAT(refusal(f), Contains("op"));
  f[5] = 77;
  CHECK_THAT(refusal(f), Contains("op"));
  CHECK_THAT(refusal(encode_request_header(header(Op::get, 0))), Contains("key_len"));
  CHECK_THAT(refusal(encode_request_header(header(Op::get, kMaxKeyBytes + 1))), Contains("key_len"));
  CHECK_THAT(refusal(encode_request_header(header(Op::get, 3, 1))), Contains("value_len"));
  CHECK_THAT(refusal(encode_request_header(header(Op::set, 3, kMaxValueBytes + 1))), Contains("value_len"));
  CHECK_THAT(refusal(encode_request_header(header(Op::set, 3, UINT64_MAX))), Contains("value_len"));
  CHECK_THAT(refusal(encode_request_header(header(Op::get, 3, 0, kMaxWaitMs + 1))), Contains("wait_ms"));
  CHECK_THAT(refusal(encode_request_header(header(Op::compare_set, 3, 4, 5))), Contains("expected_len"));
  CHECK_THAT(refusal(encode_request_header(header(Op::compare_set, 3, 4, 1, kExpectAbsent))),
             Contains("expect absent"));
  CHECK_THAT(refusal(encode_request_header(header(Op::set, 3, 0, 0, kExpectAbsent))), Contains("flags"));
  CHECK_THAT(refusal(encode_request_header(header(Op::erase, 3, 0, 7))), Contains("arg"));

  ResponseHeader r;
  std::vector<uint8_t> rf = encode_response_header(ResponseHeader{Code::mismatch, 3});
  REQUIRE(decode_response_header(rf.data(), &r, &error));
  CHECK(r.code == Code::mismatch);
  CHECK(r.value_len == 3);
  rf[5] = 9;
  CHECK_FALSE(decode_response_header(rf.data(), &r, &error));
  CHECK_THAT(error, Contains("code"));
  rf = encode_response_header(ResponseHeader{Code::ok, kMaxValueBytes + 1});
  CHECK_FALSE(decode_response_header(rf.data(), &r, &error));
  CHECK_THAT(error, Contains("value_len"));
}

TEST_CASE("store: set, get with a deadline, add, compare-and-set, erase", "[store]") {
  StoreServer server("127.0.0.1", 0);
  StoreClient c(address_of(server), 2000);
  c.set("a", bytes("one"));
  REQUIRE(c.get("a", 0));
  CHECK(*c.get("a", 0) == bytes("one"));
  c.set("empty", {});
  REQUIRE(c.get("empty", 0));
  CHECK(c.get("empty", 0)->empty());

  // A get for a missing key waits its deadline, and no longer.
  auto t = std::chrono::steady_clock::now();
  CHECK_FALSE(c.get("missing", 150));
  const double waited = ms_since(t);
  CHECK(waited >= 140);
  CHECK(waited < 1500);
  // A get that waits returns as soon as another client sets the key.
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    StoreClient w(address_of(server), 2000);
    w.set("later", bytes("x"));
  });
  t = std::chrono::steady_clock::now();
  const auto later = c.get("later", 5000);
  writer.join();
  REQUIRE(later);
  CHECK(*later == bytes("x"));
  CHECK(ms_since(t) < 2000);

  CHECK(c.add("n", 5) == 5);
  CHECK(c.add("n", -2) == 3);
  CHECK_THROWS_WITH(c.add("a", 1), Contains("not an 8-byte counter"));

  bool swapped = false;
  CHECK(c.compare_set("v", std::nullopt, bytes("first"), &swapped) == bytes("first"));
  CHECK(swapped);
  CHECK(c.compare_set("v", std::nullopt, bytes("second"), &swapped) == bytes("first"));  // written once
  CHECK_FALSE(swapped);
  CHECK(c.compare_set("v", bytes("wrong"), bytes("third"), &swapped) == bytes("first"));
  CHECK_FALSE(swapped);
  CHECK(c.compare_set("v", bytes("first"), bytes("third"), &swapped) == bytes("third"));
  CHECK(swapped);
  CHECK(c.compare_set("nokey", bytes("x"), bytes("y"), &swapped).empty());
  CHECK_FALSE(swapped);

  c.set("p/1", bytes("1"));
  c.set("p/2", bytes("2"));
  c.set("q", bytes("3"));
  c.erase_prefix("p/");
  CHECK_FALSE(c.get("p/1", 0));
  CHECK_FALSE(c.get("p/2", 0));
  CHECK(c.get("q", 0));
  c.erase("q");
  CHECK_FALSE(c.get("q", 0));
  c.erase("q");  // absent: fine
}

TEST_CASE("store: a hostile client loses its own connection only", "[store]") {
  StoreServer server("127.0.0.1", 0);
  const Address a = parse_address(address_of(server), "address");
  auto raw_send = [&](const std::vector<uint8_t>& frame) {
    Socket s = connect_to(a, deadline_after_ms(2000), "raw client");
    write_exact(s, frame.data(), frame.size(), deadline_after_ms(2000), "raw client");
    // The server closes a connection whose header it refuses, before any body.
    uint8_t byte;
    bool closed = false;
    try {
      read_exact(s, &byte, 1, deadline_after_ms(3000), "raw client");
    } catch (const moe_ep::Error& e) {
      closed = e.status() == MOE_EP_ERROR_BOOTSTRAP;
    }
    return closed;
  };
  std::vector<uint8_t> garbage(kRequestHeaderBytes, 0x41);
  CHECK(raw_send(garbage));
  CHECK(raw_send(encode_request_header(header(Op::set, 3, UINT64_MAX))));  // a 16 EiB value announced
  CHECK(raw_send(encode_request_header(header(Op::get, 0xFFFFFFFFu))));
  // A good client is served all along.
  StoreClient c(address_of(server), 2000);
  c.set("k", bytes("v"));
  CHECK(*c.get("k", 0) == bytes("v"));
}

TEST_CASE("store: a client that starts a frame and stalls loses its connection, others are served", "[store]") {
  StoreServer server("127.0.0.1", 0, /*frame_timeout_ms=*/200);
  Socket stalled = connect_to(parse_address(address_of(server), "address"), deadline_after_ms(2000), "raw client");
  const std::vector<uint8_t> header = encode_request_header(header_of_set());
  write_exact(stalled, header.data(), 10, deadline_after_ms(2000), "raw client");  // a third of a header
  StoreClient good(address_of(server), 2000);
  good.set("k", bytes("v"));  // served meanwhile
  const auto t = std::chrono::steady_clock::now();
  uint8_t byte;
  CHECK_THROWS_WITH(read_exact(stalled, &byte, 1, deadline_after_ms(5000), "raw client"), Contains("closed"));
  CHECK(ms_since(t) < 2000);
  CHECK(*good.get("k", 0) == bytes("v"));
}

TEST_CASE("store: a client never hangs on a server that is gone", "[store]") {
  auto server = std::make_unique<StoreServer>("127.0.0.1", 0);
  const std::string address = address_of(*server);
  StoreClient c(address, 2000);
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    server.reset();  // wakes the waiting get, closes the connection
  });
  const auto t = std::chrono::steady_clock::now();
  try {
    const auto v = c.get("never", 60000);
    CHECK_FALSE(v);
  } catch (const moe_ep::Error& e) {
    CHECK(e.status() == MOE_EP_ERROR_BOOTSTRAP);
  }
  stopper.join();
  CHECK(ms_since(t) < 5000);
  CHECK_THROWS_AS(c.set("k", bytes("v")), moe_ep::Error);
  CHECK_THROWS_WITH(StoreClient(address, 500), Contains(address));
  CHECK_THROWS_WITH(StoreClient("nohostport", 500), Contains("host:port"));
  CHECK_THROWS_WITH(StoreClient("127.0.0.1:99999", 500), Contains("port"));
}

TEST_CASE("store: the C entry points check their arguments", "[store]") {
  moe_ep_store_t store = nullptr;
  CHECK(moe_ep_store_serve("127.0.0.1", 0, nullptr) == MOE_EP_ERROR_INVALID_ARGUMENT);
  CHECK(moe_ep_store_serve("127.0.0.1", 70000, &store) == MOE_EP_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(moe_ep_last_error(), Contains("port"));
  CHECK(store == nullptr);
  REQUIRE(moe_ep_store_serve("127.0.0.1", 0, &store) == MOE_EP_SUCCESS);
  int32_t port = 0;
  REQUIRE(moe_ep_store_port(store, &port) == MOE_EP_SUCCESS);
  CHECK(port > 0);
  CHECK(moe_ep_store_port(nullptr, &port) == MOE_EP_ERROR_INVALID_ARGUMENT);
  CHECK(moe_ep_store_port(store, nullptr) == MOE_EP_ERROR_INVALID_ARGUMENT);
  const std::string address = "127.0.0.1:" + std::to_string(port);
  moe_ep_bootstrap_t b;
  moe_ep_bootstrap_init(&b, sizeof b);
  CHECK(moe_ep_bootstrap_from_store(nullptr, "p", 0, 1, 1000, &b) == MOE_EP_ERROR_INVALID_ARGUMENT);
  CHECK(moe_ep_bootstrap_from_store(address.c_str(), nullptr, 0, 1, 1000, &b) == MOE_EP_ERROR_INVALID_ARGUMENT);
  CHECK(moe_ep_bootstrap_from_store(address.c_str(), "p", 1, 1, 1000, &b) == MOE_EP_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(moe_ep_last_error(), Contains("rank"));
  CHECK(moe_ep_bootstrap_from_store(address.c_str(), "p", 0, 1, 0, &b) == MOE_EP_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(moe_ep_last_error(), Contains("timeout_ms"));
  moe_ep_bootstrap_t foreign = single_rank_bootstrap();
  int not_ours = 0;
  foreign.ctx = &not_ours;
  CHECK(moe_ep_bootstrap_release(&foreign) == MOE_EP_ERROR_INVALID_ARGUMENT);
  // A MASK config without a store, a rejoin without MASK, NCCL with MASK.
  moe_ep_config_t c = mask_config(nullptr, nullptr, 1000);
  moe_ep_params_t p;
  moe_ep_params_init(&p, sizeof p);
  p.num_experts = 2;
  p.top_k = 1;
  p.max_tokens_per_rank = 2;
  p.hidden_size = 4;
  moe_ep_bootstrap_t one = single_rank_bootstrap();
  moe_ep_handle_t h = nullptr;
  CHECK(moe_ep_create(&one, &p, &c, &h) == MOE_EP_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(moe_ep_last_error(), Contains("config->store_address"));
  c = mask_config(address.c_str(), "p", 1000);
  c.failure_policy = 7;
  CHECK(moe_ep_create(&one, &p, &c, &h) == MOE_EP_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(moe_ep_last_error(), Contains("config->failure_policy"));
  c.failure_policy = MOE_EP_ON_FAILURE_MASK;
  c.backend = MOE_EP_BACKEND_NCCL;
  CHECK(moe_ep_create(&one, &p, &c, &h) == MOE_EP_ERROR_UNSUPPORTED);
  CHECK_THAT(moe_ep_last_error(), Contains("HOST and NVLINK_TWO_SIDED"));
  c.backend = MOE_EP_BACKEND_NCCL;  // no MASK there, so no rejoin either
  c.rejoin = 1;
  CHECK(moe_ep_create(&one, &p, &c, &h) == MOE_EP_ERROR_UNSUPPORTED);
  CHECK_THAT(moe_ep_last_error(), Contains("config->failure_policy"));
  c = mask_config(address.c_str(), "p", 1000);
  c.store_prefix = "has space";
  CHECK(moe_ep_create(&one, &p, &c, &h) == MOE_EP_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(moe_ep_last_error(), Contains("config->store_prefix"));
  moe_ep_config_t plain;
  moe_ep_config_init(&plain, sizeof plain);
  plain.rejoin = 1;
  CHECK(moe_ep_create(&one, &p, &plain, &h) == MOE_EP_ERROR_INVALID_ARGUMENT);
  CHECK(h == nullptr);
  CHECK(moe_ep_store_destroy(&store) == MOE_EP_SUCCESS);
  CHECK(store == nullptr);
  CHECK(moe_ep_store_destroy(&store) == MOE_EP_SUCCESS);  // NULL: a no-op
  CHECK(moe_ep_store_destroy(nullptr) == MOE_EP_SUCCESS);
}

namespace {

// One rank's MASK handle over bootstrap `b`: six rounds under the masks
// all, {1,1,0}, all, each checked against the oracle; "" when all matched.
std::string run_masked_group(const moe_ep_bootstrap_t& b, const std::string& address, const std::string& prefix,
                             const moe_ep_verify::WorkloadSpec& w, int r) {
  std::string problems;
  const moe_ep_config_t c = mask_config(address.c_str(), prefix.c_str(), 10000);
  moe_ep_params_t p = w.params();
  moe_ep_handle_t h = nullptr;
  if (moe_ep_create(&b, &p, &c, &h) != MOE_EP_SUCCESS) return std::string("create: ") + moe_ep_last_error();
  const std::vector<std::vector<uint8_t>> masks = {{1, 1, 1}, {1, 1, 0}, {1, 1, 1}};
  for (int round = 0; round < 6; ++round) {
    if (round % 2 == 0 && moe_ep_set_active_ranks(h, masks[size_t(round / 2)].data(), 3) != MOE_EP_SUCCESS) {
      problems += std::string("set_active_ranks: ") + moe_ep_last_error();
      break;
    }
    const MaskedRound m = run_masked_round(h, round_spec(w, round), r);
    // An inactive rank hears nobody, the other ranks' EPLB statistics
    // included (docs/api.md): its gathered statistics differ from the
    // oracle's, which gives every rank the active ranks' rows.
    const bool inactive_with_eplb = w.eplb_stats && masks[size_t(round / 2)][size_t(r)] == 0;
    if (m.status != MOE_EP_SUCCESS || (m.wrong && !inactive_with_eplb)) {
      problems += w.describe() + ": " + m.error + m.details;
    }
  }
  const moe_ep_health_t health = poll_health(h);
  if (health.active_count != 3 || health.mask_epoch != 3 || health.status != MOE_EP_SUCCESS) {
    problems += "health after the mask changes: active " + std::to_string(health.active_count) + ", epoch " +
                std::to_string(health.mask_epoch);
  }
  moe_ep_destroy(&h);
  return problems;
}

}  // namespace

TEST_CASE("store: its bootstrap runs a HOST case, and MASK handles match the oracle", "[store]") {
  const LoopbackStore store;
  REQUIRE(store.serving());
  const std::string& address = store.address();
  moe_ep_verify::WorkloadSpec w;
  w.world = 3;
  w.num_experts = 6;
  w.top_k = 2;
  w.max_tokens_per_rank = 7;
  w.hidden_size = 10;
  w.seed = 41;
  moe_ep_verify::WorkloadSpec packed = w;
  packed.receive_layout = MOE_EP_LAYOUT_EXPERT_PACKED;
  packed.dispatch_wire = MOE_EP_WIRE_FP8_E4M3_BLOCK128;
  packed.combine_wire = MOE_EP_WIRE_FP8_E4M3_BLOCK128;
  packed.eplb_stats = true;
  packed.hidden_size = 136;  // two FP8 scale blocks, the second partial
  const std::vector<moe_ep_verify::WorkloadSpec> variants{w, packed};
  std::vector<std::string> problems(3);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 3; ++r) {
    ranks.emplace_back([&, r] {
      moe_ep_bootstrap_t b;
      moe_ep_bootstrap_init(&b, sizeof b);
      if (moe_ep_bootstrap_from_store(address.c_str(), "boot", r, 3, 10000, &b) != MOE_EP_SUCCESS) {
        problems[size_t(r)] = std::string("bootstrap: ") + moe_ep_last_error();
        return;
      }
      problems[size_t(r)] = run_host_case(w, b, 3).problems;
      // The same group with failure_policy MASK, rank-major and then an
      // expert layout with both FP8 wires and EPLB: every round, a mask
      // change that drops rank 2 and one that brings it back.  The inactive
      // rank's calls exchange with nobody: it receives nothing, its combine is zeros.
      for (size_t v = 0; v < variants.size(); ++v) {
        problems[size_t(r)] += run_masked_group(b, address, "threads" + std::to_string(v), variants[v], r);
      }
      moe_ep_bootstrap_release(&b);
      if (b.ctx != nullptr) problems[size_t(r)] += "release left ctx";
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 3; ++r) {
    INFO("rank " << r);
    CHECK(problems[size_t(r)] == "");
  }
}

// The NVLink backend's recovery (StoreExchange::allgather_suspecting): the
// ranks its device already waited timeout_ms for get a short grace once every
// other participant has posted, so a dead one costs one timeout, not two; a
// suspect that is alive and posts within the grace stays.
TEST_CASE("store exchange: a suspect that never posts is dropped after a short grace", "[store]") {
  const LoopbackStore store;
  REQUIRE(store.serving());
  constexpr int32_t kTimeout = 5000;
  for (const bool suspect_alive : {false, true}) {
    INFO((suspect_alive ? "rank 2 posts 100 ms late" : "rank 2 never posts"));
    const std::string group = suspect_alive ? "suspects/alive" : "suspects/dead";
    std::vector<std::string> outcome(3);
    std::vector<double> seconds(3, 0.0);
    std::vector<std::thread> ranks;
    for (int r = 0; r < (suspect_alive ? 3 : 2); ++r) {
      ranks.emplace_back([&, r] {
        auto client = std::make_shared<StoreClient>(store.address(), kTimeout);
        moe_ep::StoreExchange x(client, group, r, 3, kTimeout, moe_ep::Membership{0, {1, 1, 1}});
        if (r == 2) std::this_thread::sleep_for(std::chrono::milliseconds(100));
        const std::vector<uint8_t> suspects{0, 0, uint8_t(r == 2 ? 0 : 1)};
        const int32_t mine = r;
        std::vector<int32_t> all(3, -1);
        const auto t0 = std::chrono::steady_clock::now();
        try {
          x.allgather_suspecting(&mine, all.data(), sizeof mine, "recovery", suspects);
          outcome[size_t(r)] = "ok " + std::to_string(all[0]) + std::to_string(all[1]) + std::to_string(all[2]);
        } catch (const moe_ep::RankFailure& f) {
          outcome[size_t(r)] = "failed";
          for (int32_t q : f.failed()) outcome[size_t(r)] += " " + std::to_string(q);
        } catch (const std::exception& e) {
          outcome[size_t(r)] = std::string("error: ") + e.what();
        }
        seconds[size_t(r)] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      });
    }
    for (auto& t : ranks) t.join();
    for (int r = 0; r < (suspect_alive ? 3 : 2); ++r) {
      INFO("rank " << r << ": " << outcome[size_t(r)] << " after " << seconds[size_t(r)] << " s");
      CHECK(outcome[size_t(r)] == (suspect_alive ? "ok 012" : "failed 2"));
      CHECK(seconds[size_t(r)] < 0.4 * kTimeout / 1000.0);  // the grace, far from a whole timeout
    }
  }
}

TEST_CASE("rejoin: a group record in the store that names no usable backend is refused", "[store]") {
  StoreServer server("127.0.0.1", 0);
  const std::string address = address_of(server);
  StoreClient c(address, 2000);
  const std::string group = "rj/g0123456789abcdef";
  c.set("rj/group", bytes(group));
  moe_ep_params_t p;
  moe_ep_params_init(&p, sizeof p);
  p.num_experts = 4;
  p.top_k = 1;
  p.max_tokens_per_rank = 2;
  p.hidden_size = 4;
  moe_ep_bootstrap_t b;
  moe_ep_bootstrap_init(&b, sizeof b);
  b.rank = 1;
  b.world_size = 2;
  moe_ep_config_t config = mask_config(address.c_str(), "rj", 300);
  config.rejoin = 1;
  config.backend = MOE_EP_BACKEND_AUTO;
  moe_ep_handle_t h = nullptr;
  // No backend key (a group of an older library, or a forged group key): refused after the wait.
  CHECK(moe_ep_create(&b, &p, &config, &h) == MOE_EP_ERROR_INVALID_INPUT);
  CHECK_THAT(moe_ep_last_error(), Contains("names no backend") && Contains("no key"));
  for (const char* value : {"banana", "7", "3"}) {  // not a backend, or one without MASK (NCCL)
    INFO("backend key " << value);
    c.set(group + "/backend", bytes(value));
    CHECK(moe_ep_create(&b, &p, &config, &h) == MOE_EP_ERROR_INVALID_INPUT);
    CHECK_THAT(moe_ep_last_error(), Contains("names no backend"));
  }
  CHECK(h == nullptr);
}
