/* A program written the way an outside user of the installed library would:
 * only <moe_ep_c.h> and -lmoe_ep.  It checks the runtime version against the
 * header it was compiled with, that the library it loaded lives under the
 * install prefix given as argv[1] (not the build tree), and runs one
 * single-rank HOST create/dispatch/combine/destroy with known results, then
 * the same with the two grown structs as the first release declared them. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <moe_ep_c.h>

#define CHECK(call)                                                              \
  do {                                                                           \
    moe_ep_status_t s_ = (call);                                                 \
    if (s_ != MOE_EP_SUCCESS) {                                                  \
      fprintf(stderr, "FAIL %s: %s: %s\n", #call, moe_ep_status_string(s_),     \
              moe_ep_last_error());                                              \
      return 1;                                                                  \
    }                                                                            \
  } while (0)

#define EXPECT(cond)                                           \
  do {                                                         \
    if (!(cond)) {                                             \
      fprintf(stderr, "FAIL line %d: %s\n", __LINE__, #cond); \
      return 1;                                                \
    }                                                          \
  } while (0)

/* A group of one: allgather is a copy, barrier is nothing. */
static int32_t one_rank_allgather(void* ctx, const void* send, void* recv, size_t n) {
  (void)ctx;
  memcpy(recv, send, n);
  return 0;
}
static int32_t one_rank_barrier(void* ctx) {
  (void)ctx;
  return 0;
}

static moe_ep_tensor_t host_tensor(void* data, moe_ep_dtype_t dtype, int32_t ndim, int64_t* shape) {
  moe_ep_tensor_t t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = MOE_EP_DEVICE_CPU;
  t.ndim = ndim;
  t.dtype = dtype;
  t.shape = shape;
  return t;
}

/* The first release's layouts of the structs that grew since, as a program
 * compiled against that header declares them. */
typedef struct {
  uint32_t struct_size;
  int32_t backend, num_sms, timeout_ms, device;
} config_first_release;
typedef struct {
  uint32_t struct_size;
  int32_t tokens_per_rank;
  moe_ep_tensor_t hidden_states, topk_ids, topk_weights, hidden_states_scale, recv_counts, local_expert_counts,
      eplb_gathered_stats;
} dispatch_result_first_release;

static int canary_intact(const unsigned char* p, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != 0xA5) return 0;
  }
  return 1;
}

/* An older program on this library: the library writes nothing past its structs. */
static int run_first_release_structs(const moe_ep_bootstrap_t* bs, const moe_ep_params_t* params) {
  struct {
    config_first_release c;
    unsigned char canary[64];
  } config;
  struct {
    dispatch_result_first_release r;
    unsigned char canary[64];
  } result;
  memset(&config, 0xA5, sizeof config);
  memset(&result, 0xA5, sizeof result);
  CHECK(moe_ep_config_init((moe_ep_config_t*)&config.c, sizeof config.c));
  EXPECT(canary_intact(config.canary, sizeof config.canary));
  EXPECT(config.c.struct_size == 20 && config.c.timeout_ms == 30000 && config.c.device == -1);
  config.c.backend = MOE_EP_BACKEND_HOST;
  moe_ep_handle_t h = NULL;
  CHECK(moe_ep_create(bs, params, (const moe_ep_config_t*)&config.c, &h));

  float x[2] = {7, 8};
  int32_t ids[1] = {0};
  moe_ep_dtype_t i32 = {MOE_EP_DTYPE_INT, 32, 1};
  int64_t xs[2] = {1, 2}, is[2] = {1, 1};
  moe_ep_tensor_t tx = host_tensor(x, params->hidden_dtype, 2, xs);
  moe_ep_tensor_t ti = host_tensor(ids, i32, 2, is);
  moe_ep_dispatch_args_t args;
  CHECK(moe_ep_dispatch_args_init(&args, sizeof args));
  args.hidden_states = &tx;
  args.topk_ids = &ti;
  CHECK(moe_ep_dispatch_result_init((moe_ep_dispatch_result_t*)&result.r, sizeof result.r));
  EXPECT(canary_intact(result.canary, sizeof result.canary));
  CHECK(moe_ep_dispatch(h, &args, (moe_ep_dispatch_result_t*)&result.r, NULL));
  EXPECT(canary_intact(result.canary, sizeof result.canary));
  EXPECT(result.r.struct_size == sizeof result.r && result.r.tokens_per_rank == 4);
  EXPECT(((const float*)result.r.hidden_states.data)[1] == 8);

  float eo[8] = {1, 2, 0, 0, 0, 0, 0, 0};
  int64_t es[2] = {4, 2};
  moe_ep_tensor_t te = host_tensor(eo, params->combine_dtype, 2, es);
  moe_ep_combine_result_t c;
  CHECK(moe_ep_combine_result_init(&c, sizeof c));
  CHECK(moe_ep_combine(h, &te, NULL, &c, NULL));
  EXPECT(((const float*)c.output.data)[0] == 1 && ((const float*)c.output.data)[1] == 2);
  CHECK(moe_ep_destroy(&h));
  return 0;
}

int main(int argc, char** argv) {
  int32_t major = -1, minor = -1, patch = -1;
  CHECK(moe_ep_get_version(&major, &minor, &patch));
  printf("moe_ep %d.%d.%d (header %d.%d.%d)\n", major, minor, patch, MOE_EP_VERSION_MAJOR,
         MOE_EP_VERSION_MINOR, MOE_EP_VERSION_PATCH);
  EXPECT(major == MOE_EP_VERSION_MAJOR && minor == MOE_EP_VERSION_MINOR && patch == MOE_EP_VERSION_PATCH);

  Dl_info info;
  EXPECT(dladdr((void*)&moe_ep_get_version, &info) != 0 && info.dli_fname != NULL);
  printf("loaded from %s\n", info.dli_fname);
  if (argc > 1) {
    char* real_lib = realpath(info.dli_fname, NULL);
    char* real_prefix = realpath(argv[1], NULL);
    EXPECT(real_lib != NULL && real_prefix != NULL);
    EXPECT(strncmp(real_lib, real_prefix, strlen(real_prefix)) == 0);
    free(real_lib);
    free(real_prefix);
  }

  moe_ep_bootstrap_t bs;
  CHECK(moe_ep_bootstrap_init(&bs, sizeof bs));
  bs.rank = 0;
  bs.world_size = 1;
  bs.allgather = one_rank_allgather;
  bs.barrier = one_rank_barrier;

  moe_ep_params_t params;
  CHECK(moe_ep_params_init(&params, sizeof params));
  params.num_experts = 2;
  params.top_k = 1;
  params.max_tokens_per_rank = 4;
  params.hidden_size = 2;
  params.hidden_dtype.code = MOE_EP_DTYPE_FLOAT;
  params.hidden_dtype.bits = 32;
  params.combine_dtype = params.hidden_dtype;
  moe_ep_config_t config;
  CHECK(moe_ep_config_init(&config, sizeof config));
  config.backend = MOE_EP_BACKEND_HOST;

  moe_ep_handle_t h = NULL;
  CHECK(moe_ep_create(&bs, &params, &config, &h));
  EXPECT(h != NULL);

  /* Three tokens; the middle one picks no expert and is not sent. */
  float x[6] = {1, 2, 3, 4, 5, 6};
  int32_t ids[3] = {1, -1, 0};
  moe_ep_dtype_t i32 = {MOE_EP_DTYPE_INT, 32, 1};
  int64_t xs[2] = {3, 2}, is[2] = {3, 1};
  moe_ep_tensor_t tx = host_tensor(x, params.hidden_dtype, 2, xs);
  moe_ep_tensor_t ti = host_tensor(ids, i32, 2, is);
  moe_ep_dispatch_args_t args;
  CHECK(moe_ep_dispatch_args_init(&args, sizeof args));
  args.hidden_states = &tx;
  args.topk_ids = &ti;
  moe_ep_dispatch_result_t r;
  CHECK(moe_ep_dispatch_result_init(&r, sizeof r));
  CHECK(moe_ep_dispatch(h, &args, &r, NULL));
  EXPECT(r.tokens_per_rank == 4 && r.hidden_states.shape[0] == 4);
  EXPECT(((const int32_t*)r.recv_counts.data)[0] == 2);
  const float* rows = (const float*)r.hidden_states.data;
  EXPECT(rows[0] == 1 && rows[1] == 2 && rows[2] == 5 && rows[3] == 6);

  /* Expert output = 10 * row; combine returns it to tokens 0 and 2. */
  float eo[8];
  for (int i = 0; i < 8; ++i) eo[i] = 10.0f * rows[i];
  int64_t es[2] = {4, 2};
  moe_ep_tensor_t te = host_tensor(eo, params.combine_dtype, 2, es);
  moe_ep_combine_result_t c;
  CHECK(moe_ep_combine_result_init(&c, sizeof c));
  CHECK(moe_ep_combine(h, &te, NULL, &c, NULL));
  const float* y = (const float*)c.output.data;
  EXPECT(c.output.shape[0] == 3 && c.output.shape[1] == 2);
  EXPECT(y[0] == 10 && y[1] == 20 && y[2] == 0 && y[3] == 0 && y[4] == 50 && y[5] == 60);

  CHECK(moe_ep_destroy(&h));
  EXPECT(h == NULL);
  CHECK(moe_ep_destroy(&h)); /* idempotent */
  if (run_first_release_structs(&bs, &params) != 0) return 1;
  printf("consumer OK\n");
  return 0;
}
