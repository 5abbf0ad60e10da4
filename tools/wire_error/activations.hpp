// Rows that look like a transformer's hidden states, in bf16: a Gaussian body
// times a per-token scale (lognormal), a few "massive activation" channels
// far above the rest, and rare single-element outliers.  Block scaling is
// hardest on exactly these: a 128-element block that holds a massive channel
// gets a scale that leaves its small elements few bits.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace moe_ep_wire_error {

struct ActivationModel {
  bool realistic = true;         // false: N(0, 1) per element, nothing else
  double token_sigma = 0.5;      // log of the per-token scale ~ N(0, token_sigma)
  int32_t massive_channels = 8;  // channels scaled by massive_gain
  double massive_gain = 40.0;
  double outlier_rate = 1e-3;  // elements scaled by outlier_gain
  double outlier_gain = 10.0;
};

class Activations {
 public:
  Activations(const ActivationModel& model, int32_t hidden, uint64_t seed);

  // One row of `hidden` bf16 values (as their 16-bit patterns).
  void row(std::mt19937_64& rng, uint16_t* out) const;

 private:
  ActivationModel model_;
  int32_t hidden_;
  std::vector<float> channel_gain_;
};

uint16_t float_to_bf16(float f);
float bf16_to_float(uint16_t b);

}  // namespace moe_ep_wire_error
