// The HOST backend's exchanges through the store, among the active ranks
// only, for config->failure_policy = MASK (docs/reliability.md, "Surviving a
// dead rank").
//
// Keys live under the group's key (<store_prefix>/g<nonce>).  Exchange k of
// epoch E posts each participant's bytes at e<E>/k<k>/r<rank>; each
// participant then waits for every other participant's key, all waits
// together bounded by timeout_ms from its own post.  Then it writes the
// exchange's verdict once with compare-and-set at e<E>/k<k>/v: "ok" when it
// saw every key, else "failed: these ranks".  The first verdict written is
// the verdict of every participant, so the survivors agree on one mask
// without the user's bootstrap and without any rank deciding alone:
//   - ok: a rank that timed out re-reads the keys it missed (they exist);
//   - failed: the failed ranks leave the mask, the epoch advances, every
//     survivor throws RankFailure (the handle stays usable), and a failed
//     rank that is in fact alive reads the verdict and knows it was dropped
//     (TIMEOUT, sticky: it must rejoin with a new handle).
// Non-participants' slots of the result are zeros.  A membership change
// (set_active_ranks, rejoin) runs in its own space e<E>/join and always ends
// the epoch.  <group>/latest holds the newest {epoch, mask}, for ranks that
// come back.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bootstrap.hpp"
#include "store/store_client.hpp"

namespace moe_ep {

struct Membership {
  uint64_t epoch = 0;
  std::vector<uint8_t> active;  // 1 = takes part
};

class StoreExchange final : public Exchange {
 public:
  StoreExchange(std::shared_ptr<store::StoreClient> client, std::string group, int32_t rank, int32_t world_size,
                int32_t timeout_ms, Membership membership);

  int32_t rank() const override { return rank_; }
  int32_t world_size() const override { return world_; }
  int32_t timeout_ms() const { return timeout_ms_; }
  const Membership& membership() const { return membership_; }
  const std::string& group() const { return group_; }
  store::StoreClient& client() const { return *client_; }

  // A membership change: until end_change, exchanges run among
  // `participants` in this epoch's join space; a failure verdict there drops
  // the failed ranks from the current mask (the change is abandoned).
  void begin_change(const std::vector<uint8_t>& participants);
  // Starts the next epoch with `active` (the change's outcome, or the old mask) and publishes it.
  void end_change(const std::vector<uint8_t>& active);
  // Takes the group's newest membership (a rank outside the mask that is about to come back).
  void adopt(const Membership& latest);
  // Publishes the current membership at <group>/latest (only ever newer).
  void publish_latest() const;

  // An allgather among the participants in which the ranks marked in
  // `suspects` (this rank's device already waited timeout_ms for them) get
  // only a short grace once every other participant has posted: a dead
  // peer costs one timeout, not two (the NVLink backend's recovery).
  void allgather_suspecting(const void* send, void* recv, size_t bytes_per_rank, const char* step,
                            const std::vector<uint8_t>& suspects) const;

  // The newest membership of `group` (waits up to wait_ms for it), checked.
  static Membership read_latest(store::StoreClient& client, const std::string& group, int32_t world_size,
                                int64_t wait_ms);

 protected:
  void do_allgather(const void* send, void* recv, size_t bytes_per_rank, const char* step) const override;

 private:
  void gather_all(const void* send, void* recv, size_t bytes, const char* step,
                  const std::vector<uint8_t>* suspects) const;
  std::string key(uint64_t k, const std::string& leaf) const;
  std::vector<uint8_t> decide(uint64_t k, const std::vector<uint8_t>& missing, const char* step) const;
  void adopt_failure(uint64_t k, const std::vector<uint8_t>& failed, const char* step) const;
  std::vector<uint8_t> gather_peers(uint64_t k, uint8_t* recv, size_t bytes, const char* step,
                                    const std::vector<uint8_t>* suspects) const;
  void erase_previous(uint64_t k) const;
  void reread_missing(uint64_t k, const std::vector<uint8_t>& missing, uint8_t* recv, size_t bytes,
                      const char* step) const;

  std::shared_ptr<store::StoreClient> client_;
  std::string group_;
  int32_t rank_, world_, timeout_ms_;
  mutable Membership membership_;              // the mask and its epoch
  mutable std::vector<uint8_t> participants_;  // who takes part in the next exchange
  mutable std::string space_;                  // e<E> or e<E>/join
  mutable uint64_t seq_ = 0;                   // exchanges in this space
  mutable bool dropped_ = false;               // this rank was dropped by its peers
};

}  // namespace moe_ep
