#include "activations.hpp"

#include <cmath>
#include <cstring>

namespace moe_ep_wire_error {

uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

float bf16_to_float(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

Activations::Activations(const ActivationModel& model, int32_t hidden, uint64_t seed)
    : model_(model), hidden_(hidden), channel_gain_(static_cast<size_t>(hidden), 1.0f) {
  if (!model_.realistic) return;
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> channel(0, hidden - 1);
  for (int32_t i = 0; i < model_.massive_channels; ++i) {
    channel_gain_[static_cast<size_t>(channel(rng))] = static_cast<float>(model_.massive_gain);
  }
}

void Activations::row(std::mt19937_64& rng, uint16_t* out) const {
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  const double token = model_.realistic ? std::exp(model_.token_sigma * normal(rng)) : 1.0;
  for (int32_t c = 0; c < hidden_; ++c) {
    double x = normal(rng) * token * channel_gain_[static_cast<size_t>(c)];
    if (model_.realistic && uniform(rng) < model_.outlier_rate) x *= model_.outlier_gain;
    out[c] = float_to_bf16(static_cast<float>(x));
  }
}

}  // namespace moe_ep_wire_error
