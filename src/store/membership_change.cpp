#include "store/membership_change.hpp"

#include <cstring>

#include "common/host_identity.hpp"
#include "error.hpp"
#include "mask_agreement.hpp"

namespace moe_ep {

namespace {

// The fixed part of each participant's record; its mask (world_size bytes)
// and its fingerprint values (int32 each) follow.
struct ChangeHead {
  int32_t status;
  int32_t joining;  // 1 when the rank is not in the current mask
  uint64_t dispatch_sequence;
  uint64_t mask_epoch;
  char message[200];
};

struct ChangeRecord {
  ChangeHead head;
  std::vector<uint8_t> mask;
  std::vector<int32_t> values;
};

bool is_error_status(int32_t s) { return s >= MOE_EP_ERROR_INVALID_ARGUMENT && s <= MOE_EP_ERROR_INTERNAL; }

std::vector<uint8_t> pack(const ChangeHead& head, const std::vector<uint8_t>& mask,
                          const std::vector<RankValue>& fingerprint) {
  std::vector<uint8_t> bytes(sizeof head + mask.size() + fingerprint.size() * sizeof(int32_t));
  std::memcpy(bytes.data(), &head, sizeof head);
  std::memcpy(bytes.data() + sizeof head, mask.data(), mask.size());
  for (size_t i = 0; i < fingerprint.size(); ++i) {
    std::memcpy(bytes.data() + sizeof head + mask.size() + i * sizeof(int32_t), &fingerprint[i].value, sizeof(int32_t));
  }
  return bytes;
}

ChangeRecord unpack(const uint8_t* bytes, size_t world, size_t values) {
  ChangeRecord r;
  std::memcpy(&r.head, bytes, sizeof r.head);
  r.mask.assign(bytes + sizeof r.head, bytes + sizeof r.head + world);
  r.values.resize(values);
  if (values != 0) std::memcpy(r.values.data(), bytes + sizeof r.head + world, values * sizeof(int32_t));
  return r;
}

// The checks every participant runs on the same records, in the same order.
MembershipState check_records(const std::vector<ChangeRecord>& all, const std::vector<uint8_t>& participants,
                              const std::vector<RankValue>& fingerprint, int32_t me) {
  const size_t world = participants.size();
  int32_t lead = -1;  // the lowest participant that is not joining: its mask and sequence count
  for (size_t p = 0; p < world; ++p) {
    if (!participants[p]) continue;
    const ChangeHead& h = all[p].head;
    const std::string text = peer_text(h.message, sizeof h.message);
    if (h.status != MOE_EP_SUCCESS) {
      if (!is_error_status(h.status)) fail(MOE_EP_ERROR_INVALID_INPUT, "rank ", p, " sent unknown status ", h.status);
      fail(h.status, static_cast<int32_t>(p) == me ? text : "rank " + std::to_string(p) + " refused: " + text);
    }
    if (lead < 0 && h.joining == 0) lead = static_cast<int32_t>(p);
  }
  if (lead < 0) fail(MOE_EP_ERROR_INVALID_STATE, "mask change: no active rank of the group took part");
  const ChangeRecord& L = all[static_cast<size_t>(lead)];
  for (size_t p = 0; p < world; ++p) {
    if (!participants[p]) continue;
    const ChangeRecord& r = all[p];
    if (r.head.joining == 0 && r.mask != L.mask) {
      fail(MOE_EP_ERROR_INVALID_ARGUMENT, "moe_ep_set_active_ranks: active: every rank must pass the same mask; rank ",
           p, " passed ", mask_text(r.mask), ", rank ", lead, " ", mask_text(L.mask));
    }
    if (r.head.joining == 0 &&
        (r.head.dispatch_sequence != L.head.dispatch_sequence || r.head.mask_epoch != L.head.mask_epoch)) {
      fail(MOE_EP_ERROR_INVALID_INPUT, "mask change: rank ", p, " is at dispatch #", r.head.dispatch_sequence,
           " and mask #", r.head.mask_epoch, ", rank ", lead, " at #", L.head.dispatch_sequence, " and #",
           L.head.mask_epoch, " (the ranks did not make the same calls)");
    }
    if (r.head.joining != 0 && (L.mask[p] == 0)) {
      fail(MOE_EP_ERROR_INVALID_ARGUMENT, "rejoin: rank ", p, " asked to join, but the survivors' mask ",
           mask_text(L.mask), " leaves it inactive (pass it active to moe_ep_set_active_ranks)");
    }
    for (size_t i = 0; i < fingerprint.size(); ++i) {
      if (r.values[i] != all[static_cast<size_t>(me)].values[i]) {
        fail(MOE_EP_ERROR_INVALID_ARGUMENT, fingerprint[i].name, ": expected the same value on every rank, got ",
             all[static_cast<size_t>(me)].values[i], " on rank ", me, " and ", r.values[i], " on rank ", p,
             " (a rejoining process must be created with the group's parameters)");
      }
    }
  }
  MembershipState next;
  next.active = L.mask;
  next.dispatch_sequence = L.head.dispatch_sequence;
  next.mask_epoch = L.head.mask_epoch + 1;
  return next;
}

}  // namespace

moe_ep_status_t check_one_newcomer(const std::vector<uint8_t>& current, const std::vector<uint8_t>& proposed,
                                   std::string* message) {
  std::string newcomers;
  int32_t count = 0;
  for (size_t r = 0; r < proposed.size() && r < current.size(); ++r) {
    if (proposed[r] && !current[r]) newcomers += (count++ ? ", " : "") + std::to_string(r);
  }
  if (count <= 1) return MOE_EP_SUCCESS;
  *message =
      "moe_ep_set_active_ranks: active: under failure_policy MASK at most one rank becomes active per "
      "call, got ranks " +
      newcomers + " (make one call per rank)";
  return MOE_EP_ERROR_INVALID_ARGUMENT;
}

MembershipState change_membership(StoreExchange& exchange, const MembershipState& current,
                                  const std::vector<uint8_t>& proposed, moe_ep_status_t status,
                                  const std::string& message, const std::vector<RankValue>& fingerprint) {
  const int32_t me = exchange.rank();
  const size_t world = current.active.size();
  std::vector<uint8_t> participants(world);
  for (size_t r = 0; r < world; ++r) participants[r] = current.active[r] || proposed[r] ? 1 : 0;
  ChangeHead head{};
  head.status = status;
  head.joining = current.active[static_cast<size_t>(me)] ? 0 : 1;
  head.dispatch_sequence = current.dispatch_sequence;
  head.mask_epoch = current.mask_epoch;
  std::strncpy(head.message, message.c_str(), sizeof head.message - 1);
  const std::vector<uint8_t> mine = pack(head, proposed, fingerprint);
  std::vector<uint8_t> gathered(mine.size() * world);
  exchange.begin_change(participants);
  exchange.allgather(mine.data(), gathered.data(), mine.size(), "mask change: records");  // RankFailure ends the epoch
  std::vector<ChangeRecord> all;
  for (size_t p = 0; p < world; ++p)
    all.push_back(unpack(gathered.data() + p * mine.size(), world, fingerprint.size()));
  try {
    const MembershipState next = check_records(all, participants, fingerprint, me);
    exchange.end_change(next.active);
    return next;
  } catch (...) {
    exchange.end_change(exchange.membership().active);  // refused: the old mask, in a fresh epoch
    throw;
  }
}

}  // namespace moe_ep
