#include "micro_batch_overlap.hpp"

#include <algorithm>
#include <cstdio>
#include <tuple>

#include "counter_rng.hpp"
#include "errors.hpp"
#include "gemm_overlap.hpp"

namespace moe_ep_tool {

namespace {

enum Phase : int { kStep, kFused, kComm, kCompute, kPhases };

// The inputs of the timed loop, and the other ones the step's check runs on.
constexpr uint64_t kTimedInputs = 0xA0, kCheckInputs = 0xC0;

// The host loop's bound: multiply-adds of one GEMM (about a second).
constexpr double kHostMaxMacs = double(1 << 30);

// Picks of every rank's tokens that rank `me`'s experts own: the rows of a
// grouped GEMM over its local experts (a received row once per local expert).
int64_t local_picks(const WorkloadSpec& w, const std::vector<RankRouting>& all, int me) {
  int64_t n = 0;
  for (const RankRouting& r : all) {
    for (int32_t id : r.topk_ids) n += w.owner(id) == me ? 1 : 0;
  }
  return n;
}

// The rows rank `me` receives: once each, whatever number of its experts they go to.
int64_t received_rows(const Traffic& t, int me) {
  int64_t n = 0;
  for (int s = 0; s < t.world; ++s) n += t.rows_between(s, me);
  return n;
}

}  // namespace

// One GEMM of a micro-batch: cuBLAS on a GPU, a plain fp32 loop on the host;
// nothing when M is 0 (no picks for this rank).
class MicroBatchOverlap::Gemm {
 public:
  Gemm(const Session& s, const GemmShape& shape, int sm_target, uint64_t seed) : shape_(shape) {
    if (shape.m == 0) return;
    if (s.on_gpu()) {
      blas_ = std::make_unique<BlasGemm>(shape, sm_target, seed);
      return;
    }
    a_.resize(size_t(shape.m) * shape.k);
    b_.resize(size_t(shape.k) * shape.n);
    c_.resize(size_t(shape.m) * shape.n);
    for (size_t i = 0; i < a_.size(); ++i) a_[i] = float(int((i + seed) % 13) - 6) / 8;
    for (size_t i = 0; i < b_.size(); ++i) b_[i] = float(int((i + seed) % 11) - 5) / 8;
  }

  void run(void* stream) {
    if (blas_) {
      blas_->run(static_cast<cudaStream_t>(stream));
      return;
    }
    const int M = shape_.m, N = shape_.n, K = shape_.k;  // column-major, as cuBLAS
    std::fill(c_.begin(), c_.end(), 0.0f);
    for (int j = 0; j < N; ++j) {
      for (int k = 0; k < K; ++k) {
        const float bkj = b_[size_t(j) * K + k];
        for (int i = 0; i < M; ++i) c_[size_t(j) * M + i] += a_[size_t(k) * M + i] * bkj;
      }
    }
  }

 private:
  GemmShape shape_;
  std::unique_ptr<BlasGemm> blas_;
  std::vector<float> a_, b_, c_;
};

struct MicroBatchOverlap::Batch {
  Batch(const Session& s, const WorkloadSpec& largest) : calls(s, largest, false) {}
  MicroBatch calls;
  WorkloadSpec spec;
  std::vector<RankRouting> all;
  std::unique_ptr<Gemm> up, down;
  std::unique_ptr<GroupedExpert> grouped;  // --expert-gemm grouped: both projections
};

std::string micro_batch_refusal(const Session& s, const WorkloadSpec& w, int intermediate) {
  if (s.on_gpu()) return overlap_refusal(s, "--micro-batch-overlap");
  const double m = double(w.tokens_per_rank()) * w.world * std::min(w.top_k, w.experts_per_rank());
  const double macs = m * 2.0 * intermediate * w.hidden_size;
  if (macs <= kHostMaxMacs) return "";
  char why[320];
  std::snprintf(why, sizeof why,
                "--micro-batch-overlap on the %s backend runs its GEMMs on the host: up to %.0f x %d x %d "
                "multiply-adds, expected at most %.0f (fewer tokens, a smaller --hidden or --expert-intermediate)",
                s.backend_name().c_str(), m, 2 * intermediate, w.hidden_size, kHostMaxMacs);
  return why;
}

MicroBatchOverlap::MicroBatchOverlap(const Session& s, const WorkloadSpec& largest, int intermediate, bool m_rows,
                                     bool graph, bool grouped)
    : s_(s),
      intermediate_(intermediate),
      m_rows_(m_rows && !grouped),
      graph_(graph),
      grouped_(grouped),
      sm_target_(s.on_gpu() ? gemm_sm_target(s) : 0),
      streams_(s) {
  moe_ep_config_t config = s.config();
  config.micro_batches = 2;
  handle_ = std::make_unique<EpHandle>(s.bootstrap(), largest.params(), config, MOE_EP_ERROR_UNSUPPORTED, &created_);
  if (created_ == MOE_EP_ERROR_UNSUPPORTED) refusal_ = split_refusal(s, created_);
  for (auto& b : batches_) b = std::make_unique<Batch>(s, largest);
  if (grouped_) {  // the weights once, for every size
    for (int i = 0; i < 2; ++i) {
      batches_[i]->grouped = std::make_unique<GroupedExpert>(largest, intermediate, sm_target_,
                                                             derive(s.options().seed, 0x9e0 + uint64_t(i)));
    }
  }
}

MicroBatchOverlap::~MicroBatchOverlap() { drop(); }

std::string MicroBatchOverlap::probe(const WorkloadSpec& w) {
  if (!refusal_.empty()) return refusal_;
  load(w, kTimedInputs);
  MicroBatch& a = batches_[0]->calls;
  const moe_ep_handle_t h = handle_->get();
  void* const S = s_.stream();
  refusal_ = split_refusal(s_, a.dispatch_send(h, 0, S));
  if (!refusal_.empty()) return refusal_;
  TOOL_CHECK_MOE(a.dispatch_recv(h, 0, S));
  TOOL_CHECK_MOE(a.combine_send(h, 0, S));
  TOOL_CHECK_MOE(a.combine_recv(h, 0, S));
  return "";
}

void MicroBatchOverlap::load(const WorkloadSpec& w, uint64_t inputs) {
  for (int i = 0; i < 2; ++i) {
    Batch& b = *batches_[i];
    b.spec = w;
    b.spec.seed = derive(w.seed, inputs + uint64_t(i));
    b.all = make_all_routing(b.spec);
    b.calls.load(b.spec, b.all);
  }
}

void MicroBatchOverlap::run_gemms(int i, void* stream) {
  Batch& b = *batches_[i];
  if (b.grouped) {
    b.grouped->run(b.calls.dispatch_result(), static_cast<cudaStream_t>(stream));
    return;
  }
  b.up->run(stream);
  b.down->run(stream);
}

void MicroBatchOverlap::step(void* S) {
  MicroBatch &a = batches_[0]->calls, &b = batches_[1]->calls;
  const moe_ep_handle_t h = handle_->get();
  void* const C = streams_.comm();
  void* const G = streams_.compute();
  streams_.follow(C, S);
  streams_.follow(G, S);
  TOOL_CHECK_MOE(a.dispatch_send(h, 0, C));
  TOOL_CHECK_MOE(b.dispatch_send(h, 1, C));
  TOOL_CHECK_MOE(a.dispatch_recv(h, 0, C));
  streams_.follow(G, C);  // GEMM(A) on A's rows, while B's travel
  run_gemms(0, G);
  TOOL_CHECK_MOE(b.dispatch_recv(h, 1, C));
  streams_.follow(G, C);  // GEMM(B) after B's rows (recorded before C waits for GEMM(A))
  streams_.follow(C, G);  // A's combine after GEMM(A)
  TOOL_CHECK_MOE(a.combine_send(h, 0, C));
  run_gemms(1, G);  // while A's combine travels
  TOOL_CHECK_MOE(a.combine_recv(h, 0, C));
  streams_.follow(C, G);  // B's combine after GEMM(B)
  TOOL_CHECK_MOE(b.combine_send(h, 1, C));
  TOOL_CHECK_MOE(b.combine_recv(h, 1, C));
  streams_.follow(S, C);
  streams_.follow(S, G);
}

// The GEMMs stay on the compute stream in every phase: cuBLAS is bound to one stream.
void MicroBatchOverlap::fused(void* S) {
  const moe_ep_handle_t h = handle_->get();
  void* const G = streams_.compute();
  streams_.follow(G, S);
  for (int i = 0; i < 2; ++i) {
    MicroBatch& x = batches_[i]->calls;
    TOOL_CHECK_MOE(x.dispatch(h, G));
    run_gemms(i, G);
    TOOL_CHECK_MOE(x.combine(h, G));
  }
  streams_.follow(S, G);
}

void MicroBatchOverlap::comm(void* S) {
  MicroBatch &a = batches_[0]->calls, &b = batches_[1]->calls;
  const moe_ep_handle_t h = handle_->get();
  void* const C = streams_.comm();
  streams_.follow(C, S);
  TOOL_CHECK_MOE(a.dispatch_send(h, 0, C));
  TOOL_CHECK_MOE(b.dispatch_send(h, 1, C));
  TOOL_CHECK_MOE(a.dispatch_recv(h, 0, C));
  TOOL_CHECK_MOE(b.dispatch_recv(h, 1, C));
  TOOL_CHECK_MOE(a.combine_send(h, 0, C));
  TOOL_CHECK_MOE(a.combine_recv(h, 0, C));
  TOOL_CHECK_MOE(b.combine_send(h, 1, C));
  TOOL_CHECK_MOE(b.combine_recv(h, 1, C));
  streams_.follow(S, C);
}

void MicroBatchOverlap::compute(void* S) {
  void* const G = streams_.compute();
  streams_.follow(G, S);
  run_gemms(0, G);
  run_gemms(1, G);
  streams_.follow(S, G);
}

void MicroBatchOverlap::run_phase(int phase, void* S) {
  switch (phase) {
    case kStep: return step(S);
    case kFused: return fused(S);
    case kComm: return comm(S);
    default: return compute(S);
  }
}

void MicroBatchOverlap::launch(int phase, void* S) {
  if (graph_) {
    graphs_[phase]->launch(S);
  } else {
    run_phase(phase, S);
  }
}

// The step last: the combine results the step's check reads are those its capture returned.
void MicroBatchOverlap::capture() {
  if (!graph_) return;
  for (int p : {kFused, kComm, kCompute, kStep}) {
    graphs_[p] = std::make_unique<CapturedCall>(s_.stream(), [&](void* st) {
      run_phase(p, st);
      return MOE_EP_SUCCESS;
    });
  }
}

void MicroBatchOverlap::drop() {
  for (auto& g : graphs_) g.reset();
  for (auto& b : batches_) {
    if (!b) continue;
    b->up.reset();
    b->down.reset();
  }
}

// Eagerly, in the step's order, each result read back where it is live.
std::pair<int64_t, int64_t> MicroBatchOverlap::check_halves() {
  MicroBatch &a = batches_[0]->calls, &b = batches_[1]->calls;
  const moe_ep_handle_t h = handle_->get();
  void* const S = s_.stream();
  TOOL_CHECK_MOE(a.dispatch_send(h, 0, S));
  TOOL_CHECK_MOE(b.dispatch_send(h, 1, S));
  TOOL_CHECK_MOE(a.dispatch_recv(h, 0, S));
  Verdict d = a.verify_dispatch();
  TOOL_CHECK_MOE(b.dispatch_recv(h, 1, S));
  d.merge(b.verify_dispatch());
  TOOL_CHECK_MOE(a.combine_send(h, 0, S));
  TOOL_CHECK_MOE(a.combine_recv(h, 0, S));
  Verdict c = a.verify_combine();
  TOOL_CHECK_MOE(b.combine_send(h, 1, S));
  TOOL_CHECK_MOE(b.combine_recv(h, 1, S));
  c.merge(b.verify_combine());
  d.merge(verify_async(h));
  if (s_.world().is_root() && (d.wrong || c.wrong)) {
    std::fprintf(stderr, "micro-batch halves:\n%s%s", d.details.c_str(), c.details.c_str());
  }
  return {s_.world().sum(d.wrong), s_.world().sum(c.wrong)};
}

// The step as timed (its graph with -G) on other inputs, so that outputs left
// over from the check of the halves cannot pass for the step's.
int64_t MicroBatchOverlap::check_step(const WorkloadSpec& w) {
  load(w, kCheckInputs);
  launch(kStep, s_.stream());
  Verdict c = batches_[0]->calls.verify_combine();
  c.merge(batches_[1]->calls.verify_combine());
  c.merge(verify_async(handle_->get()));
  if (s_.world().is_root() && c.wrong) std::fprintf(stderr, "micro-batch step:\n%s", c.details.c_str());
  load(w, kTimedInputs);
  return s_.world().sum(c.wrong);
}

MicroBatchResult MicroBatchOverlap::measure(const WorkloadSpec& w, bool check, const LoopOptions& loop) {
  const World& world = s_.world();
  MicroBatchResult r;
  r.tokens = 2 * w.tokens_per_rank();
  load(w, kTimedInputs);
  for (int i = 0; i < 2; ++i) {
    Batch& b = *batches_[i];
    r.traffic[i] = measure_traffic(b.spec, b.all);
    const int m = int(m_rows_ ? received_rows(r.traffic[i], world.rank) : local_picks(b.spec, b.all, world.rank));
    r.m[i] = world.max(m);
    if (b.grouped) {  // one GEMM per local expert, sized by its rows
      b.grouped->set_rows(local_expert_rows(b.spec, b.all, world.rank));
      continue;
    }
    const uint64_t seed = derive(s_.options().seed, uint64_t(r.tokens) * 4 + uint64_t(i) * 2);
    b.up = std::make_unique<Gemm>(s_, GemmShape{m, 2 * intermediate_, w.hidden_size}, sm_target_, seed);
    b.down = std::make_unique<Gemm>(s_, GemmShape{m, w.hidden_size, intermediate_}, sm_target_, seed + 1);
  }
  // Each GEMM once on its stream before any capture: cuBLAS binds the stream
  // and sets up its workspace outside the graphs.  The grouped expert reads
  // a dispatch result: the fused calls give it one.
  if (grouped_) {
    fused(s_.stream());
    TOOL_CHECK_CUDA(cudaStreamSynchronize(static_cast<cudaStream_t>(s_.stream())));
  } else {
    for (int i = 0; i < 2; ++i) run_gemms(i, streams_.compute());
  }
  if (s_.on_gpu()) TOOL_CHECK_CUDA(cudaStreamSynchronize(static_cast<cudaStream_t>(streams_.compute())));
  if (check) std::tie(r.wrong_dispatch, r.wrong_combine) = check_halves();
  capture();
  if (check) r.wrong_step = check_step(w);
  const LoopResult t = time_loop(s_, loop, kPhases, [&](Marks& m) {
    m.mark();
    for (int p = 0; p < kPhases; ++p) {
      launch(p, s_.stream());
      m.mark();
    }
  });
  drop();
  reduce_phases(world, t, {{kStep, &r.step}, {kFused, &r.fused}, {kComm, &r.comm}, {kCompute, &r.compute}},
                &r.gate_expired);
  return r;
}

}  // namespace moe_ep_tool
