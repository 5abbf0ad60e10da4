#include "store/store_exchange.hpp"

#include <algorithm>
#include <cstring>

#include "checked_math.hpp"
#include "error.hpp"
#include "store/frame.hpp"
#include "store/rank_failure.hpp"

namespace moe_ep {

namespace {

constexpr uint8_t kVerdictOk = 'o';
constexpr uint8_t kVerdictFailed = 'f';

std::string ranks_text(const std::vector<uint8_t>& mask, uint8_t value) {
  std::string text;
  for (size_t r = 0; r < mask.size(); ++r) {
    if (mask[r] == value) text += (text.empty() ? "" : ", ") + std::to_string(r);
  }
  return text.empty() ? "none" : text;
}

std::string mask_text(const std::vector<uint8_t>& mask) {
  std::string text = "{";
  for (size_t r = 0; r < mask.size(); ++r) text += (r ? "," : "") + std::to_string(mask[r]);
  return text + "}";
}

int64_t ms_left(store::Deadline deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - store::Clock::now()).count();
  return left > 0 ? left : 0;
}

std::vector<uint8_t> encode_membership(const Membership& m) {
  std::vector<uint8_t> bytes = store::encode_i64(static_cast<int64_t>(m.epoch));
  bytes.insert(bytes.end(), m.active.begin(), m.active.end());
  return bytes;
}

}  // namespace

StoreExchange::StoreExchange(std::shared_ptr<store::StoreClient> client, std::string group, int32_t rank,
                             int32_t world_size, int32_t timeout_ms, Membership membership)
    : client_(std::move(client)),
      group_(std::move(group)),
      rank_(rank),
      world_(world_size),
      timeout_ms_(timeout_ms),
      membership_(std::move(membership)) {
  participants_ = membership_.active;
  space_ = "e" + std::to_string(membership_.epoch);
}

std::string StoreExchange::key(uint64_t k, const std::string& leaf) const {
  return group_ + "/" + space_ + "/k" + std::to_string(k) + "/" + leaf;
}

void StoreExchange::begin_change(const std::vector<uint8_t>& participants) {
  participants_ = participants;
  space_ = "e" + std::to_string(membership_.epoch) + "/join";
  seq_ = 0;
}

void StoreExchange::end_change(const std::vector<uint8_t>& active) {
  ++membership_.epoch;
  membership_.active = active;
  participants_ = active;
  space_ = "e" + std::to_string(membership_.epoch);
  seq_ = 0;
  publish_latest();
}

void StoreExchange::adopt(const Membership& latest) {
  membership_ = latest;
  participants_ = latest.active;
  space_ = "e" + std::to_string(membership_.epoch);
  seq_ = 0;
}

void StoreExchange::publish_latest() const {
  const std::string latest = group_ + "/latest";
  const std::vector<uint8_t> mine = encode_membership(membership_);
  for (int attempt = 0; attempt < 64; ++attempt) {
    std::optional<std::vector<uint8_t>> current = client_->get(latest, 0);
    if (current && current->size() >= 8) {
      int64_t epoch = 0;
      store::decode_i64(std::vector<uint8_t>(current->begin(), current->begin() + 8), &epoch);
      if (static_cast<uint64_t>(epoch) >= membership_.epoch) return;  // someone published this or a newer one
    }
    bool swapped = false;
    client_->compare_set(latest, current, mine, &swapped);
    if (swapped) return;
  }
}

Membership StoreExchange::read_latest(store::StoreClient& client, const std::string& group, int32_t world_size,
                                      int64_t wait_ms) {
  const std::optional<std::vector<uint8_t>> bytes = client.get(group + "/latest", wait_ms);
  if (!bytes) {
    fail(MOE_EP_ERROR_TIMEOUT, "rejoin: the store at ", client.address(), " holds no membership for group \"", group,
         "\" after ", wait_ms, " ms (no handle of that group was created with failure_policy MASK)");
  }
  const size_t expected = 8 + static_cast<size_t>(world_size);
  if (bytes->size() != expected) {
    fail(MOE_EP_ERROR_INVALID_INPUT, "rejoin: the group's membership record holds ", bytes->size(), " bytes, expected ",
         expected, " (8 + world_size ", world_size, ": a group of another size?)");
  }
  Membership m;
  int64_t epoch = 0;
  store::decode_i64(std::vector<uint8_t>(bytes->begin(), bytes->begin() + 8), &epoch);
  m.epoch = static_cast<uint64_t>(epoch);
  m.active.assign(bytes->begin() + 8, bytes->end());
  for (size_t r = 0; r < m.active.size(); ++r) {
    if (m.active[r] > 1) {
      fail(MOE_EP_ERROR_INVALID_INPUT, "rejoin: the group's membership record marks rank ", r, " with ",
           int(m.active[r]), ", expected 0 or 1");
    }
  }
  return m;
}

void StoreExchange::do_allgather(const void* send, void* recv, size_t bytes, const char* step) const {
  gather_all(send, recv, bytes, step, nullptr);
}

void StoreExchange::allgather_suspecting(const void* send, void* recv, size_t bytes, const char* step,
                                         const std::vector<uint8_t>& suspects) const {
  if (suspects.size() != static_cast<size_t>(world_)) {
    fail(MOE_EP_ERROR_INTERNAL, step, ": a suspect mask of ", suspects.size(), " ranks for a group of ", world_);
  }
  gather_all(send, recv, bytes, step, &suspects);
}

void StoreExchange::gather_all(const void* send, void* recv, size_t bytes, const char* step,
                               const std::vector<uint8_t>* suspects) const {
  if (dropped_) {
    fail(MOE_EP_ERROR_TIMEOUT, step, " on rank ", rank_, ": not attempted, this rank was dropped from the group's ",
         "mask by its peers; destroy the handle (a replacement rejoins with config->rejoin = 1)");
  }
  const size_t total = checked_size(checked_mul(uint64_t{bytes}, static_cast<uint64_t>(world_), step), step);
  auto* out = static_cast<uint8_t*>(recv);
  if (total != 0) std::memset(out, 0, total);
  if (bytes != 0) std::memcpy(out + bytes * static_cast<size_t>(rank_), send, bytes);
  int32_t count = 0;
  for (uint8_t p : participants_) count += p;
  if (!participants_[static_cast<size_t>(rank_)] || count == 1) return;  // nobody to exchange with
  const uint64_t k = seq_++;
  try {
    const auto* data = static_cast<const uint8_t*>(send);
    client_->set(key(k, "r" + std::to_string(rank_)), std::vector<uint8_t>(data, data + bytes));
    const std::vector<uint8_t> missing = gather_peers(k, out, bytes, step, suspects);
    const std::vector<uint8_t> failed = decide(k, missing, step);
    if (failed.empty()) {
      reread_missing(k, missing, out, bytes, step);
      erase_previous(k);
      return;
    }
    adopt_failure(k, failed, step);
  } catch (const RankFailure&) {
    throw;
  } catch (const Error& e) {
    if (e.status() == MOE_EP_ERROR_TIMEOUT || e.status() == MOE_EP_ERROR_INVALID_INPUT) throw;
    // The store is gone or broke the protocol: no agreement is possible any more.
    dropped_ = true;
    fail(MOE_EP_ERROR_TIMEOUT, step, " on rank ", rank_, ": ", e.what(),
         "; without the store the ranks cannot agree, this handle is unusable");
  }
}

// Every participant but the suspects first, within timeout_ms of this
// rank's post; then the suspects, each within a short grace (a suspect that
// is alive is in the same recovery and posts at about the same time).
std::vector<uint8_t> StoreExchange::gather_peers(uint64_t k, uint8_t* out, size_t bytes, const char* step,
                                                 const std::vector<uint8_t>* suspects) const {
  constexpr int64_t kSuspectGraceMs = 250;
  const store::Deadline deadline = store::deadline_after_ms(timeout_ms_);
  std::vector<uint8_t> missing(static_cast<size_t>(world_), 0);
  for (int pass = 0; pass < 2; ++pass) {
    for (int32_t p = 0; p < world_; ++p) {
      if (p == rank_ || !participants_[static_cast<size_t>(p)]) continue;
      const bool suspect = suspects != nullptr && (*suspects)[static_cast<size_t>(p)] != 0;
      if (suspect != (pass == 1)) continue;
      const int64_t wait_ms = suspect ? std::min(ms_left(deadline), kSuspectGraceMs) : ms_left(deadline);
      const std::optional<std::vector<uint8_t>> v = client_->get(key(k, "r" + std::to_string(p)), wait_ms);
      if (!v) {
        missing[static_cast<size_t>(p)] = 1;
        continue;
      }
      if (v->size() != bytes) {
        fail(MOE_EP_ERROR_INVALID_INPUT, step, " on rank ", rank_, ": rank ", p, " posted ", v->size(),
             " bytes, this rank expects ", bytes, " (the ranks did not make the same calls)");
      }
      if (bytes != 0) std::memcpy(out + bytes * static_cast<size_t>(p), v->data(), bytes);
    }
  }
  return missing;
}

// The exchange's verdict: this rank's proposal if it is the first, else the
// one already written.  Returns the failed ranks' mask, empty for "ok".
std::vector<uint8_t> StoreExchange::decide(uint64_t k, const std::vector<uint8_t>& missing, const char* step) const {
  bool any = false;
  for (uint8_t m : missing) any = any || m;
  std::vector<uint8_t> proposal{any ? kVerdictFailed : kVerdictOk};
  std::optional<std::vector<uint8_t>> written;
  if (any && !membership_.active[static_cast<size_t>(rank_)]) {
    // A rank that is joining cannot tell a dead member from a late one: it
    // takes the members' verdict if one comes within another timeout_ms, and
    // otherwise withdraws itself, never dropping a member.
    written = client_->get(key(k, "v"), timeout_ms_);
    std::vector<uint8_t> me(static_cast<size_t>(world_), 0);
    me[static_cast<size_t>(rank_)] = 1;
    proposal.insert(proposal.end(), me.begin(), me.end());
  } else if (any) {
    proposal.insert(proposal.end(), missing.begin(), missing.end());
  }
  bool swapped = false;
  const std::vector<uint8_t> verdict =
      written ? *written : client_->compare_set(key(k, "v"), std::nullopt, proposal, &swapped);
  if (verdict.size() == 1 && verdict[0] == kVerdictOk) return {};
  bool well_formed = verdict.size() == static_cast<size_t>(world_) + 1 && verdict[0] == kVerdictFailed;
  std::vector<uint8_t> failed(verdict.begin() + (verdict.empty() ? 0 : 1), verdict.end());
  bool any_failed = false;
  for (size_t r = 0; well_formed && r < failed.size(); ++r) {
    well_formed = failed[r] <= 1 && (!failed[r] || participants_[r]);
    any_failed = any_failed || failed[r];
  }
  if (!well_formed || !any_failed) {
    dropped_ = true;
    fail(MOE_EP_ERROR_INVALID_INPUT, step, " on rank ", rank_, ": the store holds a malformed verdict of ",
         verdict.size(), " bytes for this exchange; this handle is unusable");
  }
  return failed;
}

void StoreExchange::reread_missing(uint64_t k, const std::vector<uint8_t>& missing, uint8_t* out, size_t bytes,
                                   const char* step) const {
  for (int32_t p = 0; p < world_; ++p) {
    if (!missing[static_cast<size_t>(p)]) continue;
    // A peer saw this key, so it exists, unless the group has moved on without this rank.
    const std::optional<std::vector<uint8_t>> v = client_->get(key(k, "r" + std::to_string(p)), timeout_ms_);
    if (!v || v->size() != bytes) {
      dropped_ = true;
      fail(MOE_EP_ERROR_TIMEOUT, step, " on rank ", rank_, ": rank ", p, "'s data is gone from the store: ",
           "the group moved on without this rank (it was too late); destroy the handle and rejoin");
    }
    if (bytes != 0) std::memcpy(out + bytes * static_cast<size_t>(p), v->data(), bytes);
  }
}

// Exchange k completed: every participant posted k, so every one of them is
// done with k - 1: this rank's key of k - 1 (and, for the lowest
// participant, its verdict) can go.
void StoreExchange::erase_previous(uint64_t k) const {
  if (k == 0) return;
  client_->erase(key(k - 1, "r" + std::to_string(rank_)));
  int32_t lowest = 0;
  while (!participants_[static_cast<size_t>(lowest)]) ++lowest;
  if (lowest == rank_) client_->erase(key(k - 1, "v"));
}

void StoreExchange::adopt_failure(uint64_t k, const std::vector<uint8_t>& failed, const char* step) const {
  if (failed[static_cast<size_t>(rank_)] && !membership_.active[static_cast<size_t>(rank_)]) {
    dropped_ = true;
    fail(MOE_EP_ERROR_TIMEOUT, step, " on rank ", rank_,
         ": the group did not admit this rank within timeout_ms = ", timeout_ms_,
         " ms (the active ranks must call moe_ep_set_active_ranks with it active while it waits)");
  }
  if (failed[static_cast<size_t>(rank_)]) {
    dropped_ = true;
    fail(MOE_EP_ERROR_TIMEOUT, step, " on rank ", rank_, ": this rank's peers did not see its data within ",
         "timeout_ms = ", timeout_ms_, " ms and dropped it from the group (failed: ", ranks_text(failed, 1),
         "); destroy the handle (a replacement rejoins with config->rejoin = 1)");
  }
  std::vector<uint8_t> active = membership_.active;
  for (size_t r = 0; r < active.size(); ++r) active[r] = active[r] && !failed[r];
  const bool changing = space_.find("/join") != std::string::npos;
  for (uint64_t old : {k, k - 1}) {  // this rank's last keys of the space it leaves (best effort)
    if (old <= k) client_->erase(key(old, "r" + std::to_string(rank_)));
  }
  ++membership_.epoch;
  membership_.active = active;
  participants_ = active;
  space_ = "e" + std::to_string(membership_.epoch);
  seq_ = 0;
  std::vector<int32_t> failed_ranks;
  for (size_t r = 0; r < failed.size(); ++r) {
    if (failed[r]) failed_ranks.push_back(static_cast<int32_t>(r));
  }
  if (!active[static_cast<size_t>(rank_)]) {  // joining: the admission is abandoned
    dropped_ = true;
    fail(MOE_EP_ERROR_TIMEOUT, step, " on rank ", rank_, ": rank(s) ", ranks_text(failed, 1),
         " did not take part within timeout_ms = ", timeout_ms_, " ms, the admission was abandoned; try again");
  }
  publish_latest();
  const std::string message = std::string(step) + " on rank " + std::to_string(rank_) + ": rank(s) " +
                              ranks_text(failed, 1) +
                              " did not answer within timeout_ms = " + std::to_string(timeout_ms_) + " ms" +
                              (changing ? " during a mask change" : "") + "; the survivors dropped them: mask " +
                              mask_text(active) + ", epoch " + std::to_string(membership_.epoch) +
                              "; this call and every pair in flight are ended, the next dispatch runs masked";
  throw RankFailure(message, active, failed_ranks);
}

}  // namespace moe_ep
