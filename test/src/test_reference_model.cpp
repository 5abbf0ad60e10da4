// The reference model against hand-computed cases (docs/semantics.md §4): layout, order,
// masked picks, ownership rewrite, counts, padding, and combine order.
#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include "dtype.hpp"
#include "params.hpp"
#include "reference_model.hpp"
#include "test_params.hpp"

using namespace moe_ep;

namespace {
// 2 ranks, 4 experts (rank 0 owns 0-1, rank 1 owns 2-3), top-2, hidden 1 fp32
// payload (one float per row = the token's tag), invalid id -1.
// fp32 rows and fp32 combine over the library's other defaults.
moe_ep_params_t fp32_params(int32_t experts, int32_t top_k, int32_t max_tokens) {
  moe_ep_params_t p = moe_ep_test::make_params(experts, top_k, max_tokens, 1);
  p.hidden_dtype = dtype_fp32();
  p.combine_dtype = dtype_fp32();
  return p;
}

Layout small_layout(int rank) { return make_layout(fp32_params(4, 2, 4), 2, rank); }
}  // namespace

TEST_CASE("destination slots are running counts in ascending token order", "[model]") {
  const Layout l = small_layout(0);
  // token 0 -> ranks 0,1; token 1 -> rank 1 only; token 2 -> nowhere (all masked);
  // token 3 -> rank 0 twice (two picks on rank 0) = once.
  const int32_t ids[] = {0, 2, 3, 2, -1, -1, 1, 0};
  const std::vector<int32_t> slots = destination_slots(l, 4, ids);
  const std::vector<int32_t> expected = {0, 0,   -1, 1,   -1, -1,   1, -1};
  CHECK(slots == expected);
}

TEST_CASE("receive layout of rank 1: rank-major, ordered, rewritten, padded", "[model]") {
  const Layout l = small_layout(1);
  const int tpr = 3;
  const int32_t ids0[] = {0, 2, 3, 2, -1, -1};  // rank 0: tokens 0,1 go to rank 1
  const float w0[] = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f};
  const float h0[] = {10, 11, 12};
  const int32_t ids1[] = {1, 3};  // rank 1: token 0 goes to ranks 0 and 1
  const float w1[] = {0.7f, 0.8f};
  const float h1[] = {20};
  std::vector<SourceTokens> src(2);
  src[0] = {3, ids0, w0, reinterpret_cast<const uint8_t*>(h0), nullptr};
  src[1] = {1, ids1, w1, reinterpret_cast<const uint8_t*>(h1), nullptr};

  std::vector<float> hidden(6, -99), weights(12, -99);
  std::vector<int32_t> topk(12, 99), counts(2, 99), local(2, 99);
  ReceiveBuffers out{reinterpret_cast<uint8_t*>(hidden.data()), topk.data(), weights.data(), nullptr,
                     counts.data(), local.data()};
  reference_receive(l, tpr, src, out);

  CHECK(counts == std::vector<int32_t>{2, 1});
  // rows 0,1 from rank 0 (tokens 0 and 1), row 2 padding; row 3 from rank 1, rows 4,5 padding.
  CHECK(hidden[0] == 10);
  CHECK(hidden[1] == 11);
  CHECK(hidden[3] == 20);
  CHECK(topk == std::vector<int32_t>{-1, 2, 3, 2, -1, -1, -1, 3, -1, -1, -1, -1});
  CHECK(weights == std::vector<float>{0.1f, 0.2f, 0.3f, 0.4f, 0, 0, 0.7f, 0.8f, 0, 0, 0, 0});
  // local experts of rank 1 are 2 and 3: picks received: 2 (row 0), 3 and 2 (row 1), 3 (row 3)
  CHECK(local == std::vector<int32_t>{2, 2});
}

TEST_CASE("bad ids are counted and never routed", "[model]") {
  const Layout l = small_layout(0);
  const int32_t ids[] = {0, 7, -5, -1, 4, 1};
  int32_t token = -1, pick = -1;
  CHECK(count_bad_ids(l, 3, ids, &token, &pick) == 3);
  CHECK(token == 0);
  CHECK(pick == 1);
  CHECK_FALSE(token_goes_to(l, ids + 2, 0));
  CHECK_FALSE(token_goes_to(l, ids + 2, 1));
  CHECK(token_goes_to(l, ids + 4, 0));  // 4 is bad, 1 is rank 0's
}

TEST_CASE("combine sums partials in ascending rank order with fp32 accumulation", "[model]") {
  // Three ranks contribute 1, 1e8 and -1e8.  In ascending order (1 + 1e8) - 1e8 = 0 in fp32,
  // because 1 is below half an ulp of 1e8; any other order gives 1.
  const Layout l = make_layout(fp32_params(3, 3, 1), 3, 0);
  const int32_t ids[] = {2, 0, 1};  // the token goes to all three ranks, slot 0 on each
  // Each rank's expert output has world * tpr = 3 rows; source 0's row is row 0.
  const float out0[] = {1.0f, 0, 0};
  const float out1[] = {1e8f, 0, 0};
  const float out2[] = {-1e8f, 0, 0};
  float result = -1;
  reference_combine(l, 1, 1, ids,
                    {reinterpret_cast<const uint8_t*>(out0), reinterpret_cast<const uint8_t*>(out1),
                     reinterpret_cast<const uint8_t*>(out2)},
                    reinterpret_cast<uint8_t*>(&result));
  CHECK(result == 0.0f);
}

TEST_CASE("default EPLB stats count valid picks per expert", "[model]") {
  const Layout l = small_layout(0);
  const int32_t ids[] = {0, 2, 3, 2, -1, 9};
  CHECK(count_picks_per_expert(l, 3, ids) == std::vector<int32_t>{1, 0, 2, 1});
}
